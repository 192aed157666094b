"""DelayedRetry in a real FastStream app against a real broker: retries, parking, the CLI."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from faststream.rabbit import QueueType, RabbitBroker, RabbitQueue, RabbitRouter
from tenacity import retry_if_exception_type, wait_fixed

from delayed_retry import (
    ConfigurationError,
    NoInstrumentation,
    ParkMessage,
    RetryAfter,
    work_queue_arguments,
)
from delayed_retry import with_delayed_retry as decorator
from delayed_retry.cli import main
from delayed_retry.faststream import CurrentRetryState, DelayedRetry
from delayed_retry.headers import RetryState
from tests.support.chain import Scenario
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


class Transient(Exception):
    """A failure that passes."""


class Invalid(Exception):
    """A failure that does not."""


def queue_of(scenario: Scenario, suffix: str) -> RabbitQueue:
    """A durable quorum queue named after the test, deleted with its parking queue after it."""
    name = scenario.name(suffix)
    scenario.track_queue(name, scenario.topology.default_parking_queue(name))
    return RabbitQueue(name, queue_type=QueueType.QUORUM, durable=True)


@contextlib.asynccontextmanager
async def running(broker: RabbitBroker) -> AsyncIterator[RabbitBroker]:
    await broker.start()
    try:
        yield broker
    finally:
        await broker.stop()


def retrier(scenario: Scenario, **options: Any) -> DelayedRetry:
    options.setdefault("wait", wait_fixed(0.3))
    options.setdefault("instrumentation", NoInstrumentation())
    return DelayedRetry(topology=scenario.topology, **options)


def test_options_are_checked_when_built_with_the_decorators_errors() -> None:
    for bad in ({"return_to": "nowhere"}, {"parking_queue": "amq.x"}, {"hold": 3}):
        with pytest.raises(ConfigurationError) as built:
            DelayedRetry(**bad)
        with pytest.raises(ConfigurationError) as decorated:
            decorator(**bad)
        assert str(built.value) == str(decorated.value)
    with pytest.raises(TypeError, match="queue"):
        DelayedRetry(queue="orders")  # type: ignore[call-arg]


async def test_retries_through_the_chain_parks_and_the_cli_lists_the_parked(
    quorum: Scenario, rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    broker = RabbitBroker(
        rabbitmq_url,
        logger=None,
        middlewares=[retrier(quorum, max_retries=3, retry=retry_if_exception_type(Transient))],
    )
    queue = queue_of(quorum, "orders")
    attempts: dict[str, list[tuple[float, RetryState]]] = {}
    done = asyncio.Event()

    @broker.subscriber(queue)
    async def handle(body: str, state: CurrentRetryState) -> None:
        attempts.setdefault(body, []).append((time.monotonic(), state))
        if body == "flaky" and state.attempt < 3:
            raise Transient(f"attempt {state.attempt}")
        if body == "invalid":
            raise Invalid("no such order")
        if body == "broken":
            raise Transient("always")
        done.set()

    async with running(broker):
        for body in ("flaky", "invalid", "broken"):
            await broker.publish(body, queue.name, message_id=body)
        await asyncio.wait_for(done.wait(), 15)
        await quorum.wait_for_depth(quorum.topology.default_parking_queue(queue.name), 2)
        await wait_until(lambda: len(attempts.get("broken", ())) == 4, what="4 attempts")

    flaky = attempts["flaky"]
    assert [s.attempt for _, s in flaky] == [1, 2, 3]
    assert all(b[0] - a[0] >= 0.3 for a, b in itertools.pairwise(flaky)), flaky
    assert flaky[-1][1].last_error is not None and "attempt 2" in flaky[-1][1].last_error
    assert flaky[-1][1].first_failure_at is not None
    assert len(attempts["invalid"]) == 1
    assert len(attempts["broken"]) == 4

    capsys.readouterr()
    args = ["--url", rabbitmq_url, "parking", "list", "--queue", queue.name, "--json"]
    assert await asyncio.to_thread(main, args) == 0
    records = {r["id"]: r for r in json.loads(capsys.readouterr().out)["records"]}
    assert set(records) == {"invalid", "broken"}, records
    assert records["invalid"]["reason"] == "not-retryable"
    assert records["broken"]["reason"] == "max-retries"


async def test_handler_signals_and_faststreams_own(quorum: Scenario, rabbitmq_url: str) -> None:
    from faststream.exceptions import AckMessage, RejectMessage

    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retrier(quorum, max_retries=3)])
    queue = queue_of(quorum, "signals")
    seen: list[tuple[str, int]] = []

    @broker.subscriber(queue)
    async def handle(body: str, state: CurrentRetryState) -> None:
        seen.append((body, state.attempt))
        if body == "later" and state.attempt == 1:
            raise RetryAfter(0.3)
        if body == "park":
            raise ParkMessage("bad data")
        if body == "reject":
            raise RejectMessage()
        if body == "ack":
            raise AckMessage()

    async with running(broker):
        for body in ("later", "park", "reject", "ack"):
            await broker.publish(body, queue.name, message_id=body)
        parking = quorum.topology.default_parking_queue(queue.name)
        await quorum.wait_for_depth(parking, 1)
        await wait_until(lambda: ("later", 2) in seen, what="the RetryAfter retry")
        await quorum.wait_for_depth(queue.name, 0)
    # A RejectMessage drops the message (FastStream's meaning): neither retried nor parked.
    assert sorted(seen) == [("ack", 1), ("later", 1), ("later", 2), ("park", 1), ("reject", 1)]
    assert await quorum.depth(parking) == 1


async def test_a_routers_policy_overrides_its_brokers(quorum: Scenario, rabbitmq_url: str) -> None:
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retrier(quorum, max_retries=0)])
    router = RabbitRouter(middlewares=[retrier(quorum, max_retries=1)])
    plain, patient = queue_of(quorum, "plain"), queue_of(quorum, "patient")
    seen: list[str] = []

    @broker.subscriber(plain)
    async def once(body: str) -> None:
        seen.append("plain")
        raise Transient

    @router.subscriber(patient)
    async def twice(body: str) -> None:
        seen.append("patient")
        raise Transient

    broker.include_router(router)
    async with running(broker):
        await broker.publish("x", plain.name)
        await broker.publish("x", patient.name)
        await quorum.wait_for_depth(quorum.topology.default_parking_queue(plain.name), 1)
        await quorum.wait_for_depth(quorum.topology.default_parking_queue(patient.name), 1)
    assert sorted(seen) == ["patient", "patient", "plain"]


async def test_a_work_queues_dead_letter_queue_is_declared_with_its_binding(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    name = quorum.name("defended")
    dead_letter = quorum.topology.default_dead_letter_queue(name)
    quorum.track_queue(name, quorum.topology.default_parking_queue(name), dead_letter)
    # FastStream types each queue type's arguments as a TypedDict; these are plain x-arguments.
    arguments: Any = work_queue_arguments(name)
    queue = RabbitQueue(name, queue_type=QueueType.QUORUM, durable=True, arguments=arguments)
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retrier(quorum)])
    seen: list[str] = []

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        seen.append(body)

    async with running(broker):
        await broker.publish("first", queue.name)
        await wait_until(lambda: seen == ["first"], what="the first message handled")
        assert await quorum.depth(dead_letter) == 0  # exists: a missing queue raises


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))


async def test_faststreams_log_says_what_became_of_a_failed_message(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    lines = _Lines()
    logger = logging.getLogger(f"faststream-test-{quorum.unique}")
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    broker = RabbitBroker(rabbitmq_url, logger=logger, middlewares=[retrier(quorum, max_retries=1)])
    queue = queue_of(quorum, "logged")
    parking = quorum.topology.default_parking_queue(queue.name)

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise Transient("card service down")

    async with running(broker):
        await broker.publish("x", queue.name, message_id="logged-1")
        await quorum.wait_for_depth(parking, 1)
    said = [text for _, text in lines.lines]
    failed = "failed (Transient: card service down); "
    assert f"{failed}retried: back in {queue.name!r} in 300 ms through the delay chain" in said
    assert f"{failed}parked in {parking!r} (max-retries)" in said
    # Before: only FastStream's "Processed" after "Message was retried or parked by delayed-retry".
    assert not any("retried or parked" in text for text in said)
    # FastStream ends every message's log with "Processed", failed or not (after an exception
    # line when the handler raised); what became of a failed one is said before it.
    retried = said.index(
        f"{failed}retried: back in {queue.name!r} in 300 ms through the delay chain"
    )
    assert said[retried + 1] == "Processed"


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


async def test_the_librarys_lines_about_a_delivery_are_written_as_faststreams(
    quorum: Scenario, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Under FastStream the retry and park lines were bare text on an unconfigured logger, and a
    # retry's "Received" read as a second one of the first delivery.
    caplog.set_level(logging.INFO, logger="delayed_retry")
    seen = _Records()
    logger = logging.getLogger(f"faststream-test-{quorum.unique}-lines")
    logger.addHandler(seen)
    logger.setLevel(logging.INFO)
    broker = RabbitBroker(rabbitmq_url, logger=logger, middlewares=[retrier(quorum, max_retries=1)])
    queue = queue_of(quorum, "lines")
    parking = quorum.topology.default_parking_queue(queue.name)

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        raise Transient("card service down")

    async with running(broker):
        await broker.publish("x", queue.name, message_id="lines-1")
        await quorum.wait_for_depth(parking, 1)
    said = [r.getMessage() for r in seen.records]
    received = [i for i, text in enumerate(said) if text == "Received"]
    retrying = next(i for i, text in enumerate(said) if "retrying in 0.300 s" in text)
    attempt = said.index("attempt 2: retry 1 of this message")
    assert received[0] < retrying < received[1] < attempt, said
    parked = [
        r for r in seen.records if "parked (max-retries) after 2 attempt(s)" in r.getMessage()
    ]
    assert [r.levelno for r in parked] == [logging.WARNING]
    # With FastStream's context, as its own lines are written.
    assert {getattr(seen.records[i], "message_id", None) for i in (retrying, attempt)} == {
        "lines-1"
    }
    assert getattr(parked[0], "message_id", None) == "lines-1"
    assert not [r for r in caplog.records if r.name == "delayed_retry.consumer.failures"]
