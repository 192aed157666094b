"""A handler holds a message that left the chain early until due: on the fake channel.

Each test drives the real ``RetryingHandler`` with a real aio-pika message on a
:class:`~delayed_retry.testing.FakeChannel`; nothing waits a fixed time:
the tests wait for the handler's own events.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DEFAULT_HOLD, ConfigurationError, Hold
from delayed_retry.chain.routing_keys import decode_routing_key
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.decorator import with_delayed_retry
from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.durations import from_epoch_ms, to_epoch_ms, utcnow
from delayed_retry.headers import X_DUE_AT
from delayed_retry.observability.instrumentation import NoInstrumentation
from delayed_retry.testing import FakeChannel, fake_message

QUEUE = "work"
TOPOLOGY = DelayTopology(prefix="fake", levels=20, unit=timedelta(milliseconds=1))


def decorate(fn: Any, **options: Any) -> RetryingHandler[Any]:
    options.setdefault("queue", QUEUE)
    options.setdefault("topology", TOPOLOGY)
    options.setdefault("instrumentation", NoInstrumentation())
    return with_delayed_retry(**options)(fn)


def from_chain(channel: FakeChannel, *, due_in: timedelta, message_id: str = "m-1") -> Any:
    """A delivery out of the chain's level 0, due ``due_in`` from now."""
    due_ms = to_epoch_ms(utcnow() + due_in)
    message = fake_message(
        channel,
        headers={X_DUE_AT: due_ms},
        exchange=TOPOLOGY.level_name(0),
        message_id=message_id,
    )
    return message, due_ms


class Handled:
    """When (wall clock) each message reached the handler."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    async def __call__(self, message: AbstractIncomingMessage) -> None:
        self.at[message.message_id or ""] = time.time()


async def test_an_early_message_is_handled_at_its_due_time_not_before() -> None:
    channel = FakeChannel()
    message, due_ms = from_chain(channel, due_in=timedelta(milliseconds=80))
    handled = Handled()
    await decorate(handled)(message)
    assert handled.at["m-1"] * 1000 >= due_ms
    assert channel.published == []
    assert channel.settlement_of(message) == [("ack", False)]


async def test_a_message_earlier_than_the_limit_goes_back_into_the_chain() -> None:
    channel = FakeChannel()
    message, due_ms = from_chain(channel, due_in=timedelta(seconds=3))
    handled = Handled()
    await decorate(handled)(message)
    assert handled.at == {}
    [copy] = channel.published
    units, destination = decode_routing_key(copy.routing_key, TOPOLOGY.levels)
    assert destination == QUEUE
    assert copy.headers[X_DUE_AT] == due_ms
    # It leaves the chain early again, within the limit, by the fewest hops (2,048 units).
    assert units % 32 == 0
    assert 3_000 - DEFAULT_HOLD.limit_us // 1000 <= units < 3_000 - DEFAULT_HOLD.lead_us // 1000
    assert units.bit_count() == 1
    assert channel.settlement_of(message) == [("ack", False)]


async def test_without_a_hold_an_early_message_goes_back_into_the_chain() -> None:
    channel = FakeChannel()
    message, due_ms = from_chain(channel, due_in=timedelta(milliseconds=300))
    handled = Handled()
    await decorate(handled, hold=None)(message)
    after_ms = to_epoch_ms(utcnow())
    assert handled.at == {}
    [copy] = channel.published
    units, _ = decode_routing_key(copy.routing_key, TOPOLOGY.levels)
    assert units >= due_ms - after_ms  # the rest of the wait, rounded up: not early


async def test_past_max_messages_an_early_message_goes_back_into_the_chain() -> None:
    channel = FakeChannel()
    wrapped = decorate(Handled(), hold=Hold(max_messages=1))
    first, _ = from_chain(channel, due_in=timedelta(milliseconds=300), message_id="a")
    second, _ = from_chain(channel, due_in=timedelta(milliseconds=300), message_id="b")
    held = asyncio.create_task(wrapped(first))
    while len(wrapped.options.held) < 1:
        await asyncio.sleep(0)
    await wrapped(second)
    assert [
        decode_routing_key(p.routing_key, TOPOLOGY.levels).destination for p in channel.published
    ] == [QUEUE]
    # It waits the rest in the chain: straight back to the queue (within the hold's limit),
    # it would be redelivered at once, round and round while the handler holds all it may.
    [copy] = channel.published
    assert TOPOLOGY.is_chain_exchange(copy.exchange) and copy.exchange != TOPOLOGY.delivery_exchange
    assert 0 < decode_routing_key(copy.routing_key, TOPOLOGY.levels).units <= 300
    assert channel.settlement_of(second) == [("ack", False)]
    await held
    assert channel.settlement_of(first) == [("ack", False)]


async def test_released_messages_go_back_to_their_queue_unhandled() -> None:
    channel = FakeChannel()
    handled = Handled()
    wrapped = decorate(handled)
    message, _ = from_chain(channel, due_in=timedelta(milliseconds=400))
    task = asyncio.create_task(wrapped(message))
    while len(wrapped.options.held) < 1:
        await asyncio.sleep(0)
    assert await wrapped.release_held() == 1
    await task
    assert handled.at == {}
    assert channel.settlement_of(message) == [("nack", True)]
    assert len(wrapped.options.held) == 0


async def test_a_cancelled_hold_requeues_the_message_and_propagates() -> None:
    channel = FakeChannel()
    wrapped = decorate(Handled())
    message, _ = from_chain(channel, due_in=timedelta(milliseconds=400))
    task = asyncio.create_task(wrapped(message))
    while len(wrapped.options.held) < 1:
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert channel.settlement_of(message) == [("nack", True)]


async def test_a_retry_leaves_the_chain_early_and_keeps_its_true_due_time() -> None:
    channel = FakeChannel()

    async def fails(message: AbstractIncomingMessage) -> None:
        raise RuntimeError("down")

    before = utcnow()
    await decorate(fails, wait=tenacity.wait_fixed(1))(fake_message(channel))
    [copy] = channel.published
    due = from_epoch_ms(copy.headers[X_DUE_AT])
    assert due - before >= timedelta(seconds=1)
    units, _ = decode_routing_key(copy.routing_key, TOPOLOGY.levels)
    assert units % 32 == 0
    assert units <= 1000 - DEFAULT_HOLD.lead_us // 1000


def test_a_hold_that_cannot_cover_the_chain_is_refused_when_decorating() -> None:
    with pytest.raises(ConfigurationError, match="raise limit"):
        decorate(Handled(), hold=Hold(limit=timedelta(milliseconds=50)))
    with pytest.raises(ConfigurationError, match=r"must be a delayed_retry\.Hold"):
        decorate(Handled(), hold=timedelta(seconds=1))
