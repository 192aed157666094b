"""The crash guard's option, its count, and its paths in the handler on the fake channel."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import (
    ConfigurationError,
    CrashGuard,
    DelayTopology,
    NoInstrumentation,
    with_delayed_retry,
)
from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.faststream import DelayedRetry
from delayed_retry.headers import (
    X_DUE_AT,
    X_EXCEPTION_TYPE,
    X_ORIGINAL_EXCHANGE,
    X_ORIGINAL_ROUTING_KEY,
    X_PARKED_REASON,
    X_RETRY_CRASHES,
)
from delayed_retry.recovery.crash_guard import MAX_CRASH_COUNT, crashes_of
from delayed_retry.testing import FakeChannel, fake_message
from tests.support.waiting import wait_until


def test_default_is_three_crashes() -> None:
    assert CrashGuard().max_crashes == 3


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "3", None])
def test_a_bad_limit_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"CrashGuard max_crashes=.* at least 1"):
        CrashGuard(max_crashes=bad)  # type: ignore[arg-type]


def test_decorator_and_faststream_refuse_what_is_not_a_crash_guard_alike() -> None:
    with pytest.raises(ConfigurationError) as decorated:
        with_delayed_retry(queue="q", crash_guard=3)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError) as built:
        DelayedRetry(crash_guard=3)  # type: ignore[arg-type]
    assert str(built.value) == str(decorated.value)
    assert "CrashGuard(max_crashes=3)" in str(built.value)


@pytest.mark.parametrize(
    ("headers", "count"),
    [
        (None, 0),
        ({}, 0),
        ({X_RETRY_CRASHES: 2}, 2),
        ({X_RETRY_CRASHES: 0}, 0),
        ({X_RETRY_CRASHES: -1}, 0),
        ({X_RETRY_CRASHES: True}, 0),
        ({X_RETRY_CRASHES: "2"}, 0),
        ({X_RETRY_CRASHES: 2.0}, 0),
        ({X_RETRY_CRASHES: MAX_CRASH_COUNT + 1}, 0),
        ("not a mapping", 0),
    ],
)
def test_the_count_is_read_or_taken_as_zero(headers: object, count: int) -> None:
    assert crashes_of(headers) == count  # type: ignore[arg-type]


# --- the guard in the handler's path, on the fake channel -------------------------------

QUEUE = "work"
TOPOLOGY = DelayTopology(prefix="fake", levels=20, unit=timedelta(milliseconds=1))


GUARD = CrashGuard(max_crashes=3)


def guarded(calls: list[bytes], guard: CrashGuard | None = GUARD) -> RetryingHandler[Any]:
    async def handler(message: AbstractIncomingMessage) -> None:
        calls.append(message.body)

    return with_delayed_retry(
        queue=QUEUE, topology=TOPOLOGY, instrumentation=NoInstrumentation(), crash_guard=guard
    )(handler)


async def test_a_first_delivery_runs_as_usual() -> None:
    channel = FakeChannel()
    calls: list[bytes] = []
    message = fake_message(channel)
    await guarded(calls)(message)
    assert calls == [b"{}"]
    assert channel.settlement_of(message) == [("ack", False)]
    assert channel.published == []


async def test_a_redelivery_is_counted_and_put_back_without_running() -> None:
    channel = FakeChannel()
    calls: list[bytes] = []
    message = fake_message(
        channel, redelivered=True, exchange="orders", routing_key="new", headers={"a": 1}
    )
    await guarded(calls)(message)
    assert calls == []
    [copy] = channel.published
    assert (copy.exchange, copy.routing_key) == ("", QUEUE)
    assert copy.headers[X_RETRY_CRASHES] == 1
    assert copy.headers["a"] == 1
    # The first route is kept for the record, since the copy arrives through the default exchange.
    assert copy.headers[X_ORIGINAL_EXCHANGE] == "orders"
    assert copy.headers[X_ORIGINAL_ROUTING_KEY] == "new"
    assert channel.settlement_of(message) == [("ack", False)]


async def test_at_the_limit_it_is_parked_as_crashed_with_its_count() -> None:
    channel = FakeChannel()
    calls: list[bytes] = []
    message = fake_message(channel, redelivered=True, headers={X_RETRY_CRASHES: 2})
    await guarded(calls)(message)
    assert calls == []
    [record] = [p.headers for p in channel.published if p.exchange == TOPOLOGY.parking_exchange]
    assert record[X_PARKED_REASON] == "crashed"
    assert record[X_RETRY_CRASHES] == 3
    assert record[X_EXCEPTION_TYPE] == "delayed_retry.errors.MessageCrashedError"
    assert channel.settlement_of(message) == [("ack", False)]


async def test_an_unconfirmed_put_back_leaves_the_message_unacked() -> None:
    channel = FakeChannel(default_answer="closed")
    calls: list[bytes] = []
    message = fake_message(channel, redelivered=True)
    await guarded(calls)(message)
    assert calls == []
    assert ("ack", False) not in channel.settlement_of(message)


async def test_after_a_shutdown_began_arrivals_are_put_back_not_run() -> None:
    channel = FakeChannel()
    calls: list[bytes] = []
    handler = guarded(calls)
    assert await handler.release_held() == 0
    message = fake_message(channel)
    await handler(message)
    assert calls == []
    [copy] = channel.published
    assert (copy.exchange, copy.routing_key) == ("", QUEUE)
    assert X_RETRY_CRASHES not in copy.headers  # a shutdown is no crash
    assert channel.settlement_of(message) == [("ack", False)]


async def test_without_a_guard_a_redelivery_runs() -> None:
    channel = FakeChannel()
    calls: list[bytes] = []
    message = fake_message(channel, redelivered=True)
    await guarded(calls, guard=None)(message)
    assert calls == [b"{}"]
    assert channel.published == []


async def test_faststream_release_held_begins_the_shutdown_of_every_subscriber() -> None:
    retrier = DelayedRetry(crash_guard=GUARD)
    assert not retrier.options.held.stopping
    assert await retrier.release_held() == 0
    assert retrier.options.held.stopping


async def test_a_message_held_until_due_is_put_back_on_shutdown_not_returned() -> None:
    channel = FakeChannel()
    calls: list[bytes] = []
    handler = guarded(calls)
    due = utcnow() + timedelta(milliseconds=800)  # within the default hold's 1 s limit
    message = fake_message(
        channel, exchange=TOPOLOGY.delivery_exchange, headers={X_DUE_AT: to_epoch_ms(due)}
    )
    running = asyncio.create_task(handler(message))
    await wait_until(lambda: len(handler.options.held) == 1, what="the message held until due")
    assert await handler.release_held() == 1
    await asyncio.wait_for(running, 10)
    assert calls == []
    [copy] = channel.published
    assert (copy.exchange, copy.routing_key) == ("", QUEUE)
    assert X_RETRY_CRASHES not in copy.headers
    assert channel.settlement_of(message) == [("ack", False)]  # not a nack: no redelivery
