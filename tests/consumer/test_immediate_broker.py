"""Immediate retries on a real broker: one delivery, its runs, its record, its shutdown."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import (
    ParkMessage,
    RetryAfter,
    consume,
    current_retry_state,
    with_delayed_retry,
)
from delayed_retry import headers as h
from delayed_retry.headers import RetryState
from tests.support.chain import Inbox, Scenario, publish
from tests.support.telemetry import Telemetry
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

FAST = tenacity.wait_fixed(0.2)


@dataclass(frozen=True)
class Run:
    state: RetryState
    redelivered: bool
    delivery_tag: int | None


class Runs:
    """Each run of a handler: its retry state and the delivery it ran on."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self.changed = asyncio.Event()

    def record(self, message: AbstractIncomingMessage) -> RetryState:
        state = current_retry_state()
        assert state is not None
        self.runs.append(Run(state, bool(message.redelivered), message.delivery_tag))
        self.changed.set()
        return state


async def start(scenario: Scenario, handler: Any) -> tuple[Any, Inbox, str]:
    queue = await scenario.queue("q")
    tag = await consume(queue, handler)
    parked = Inbox()
    parking = await scenario.ch.get_queue(scenario.topology.default_parking_queue(queue.name))
    await parking.consume(parked)
    return queue, parked, tag


async def test_failing_twice_then_succeeding_is_handled_within_one_delivery(
    scenario: Scenario, telemetry: Telemetry
) -> None:
    runs = Runs()

    @with_delayed_retry(
        immediate_retries=2,
        max_retries=3,
        wait=FAST,
        topology=scenario.topology,
        instrumentation=telemetry.instrumentation,
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        if runs.record(message).immediate_retries < 2:
            raise ConnectionError("pool connection reset")

    queue, parked, _ = await start(scenario, handler)
    await publish(scenario.ch, queue.name, b"order-1", message_id="order-1")
    await wait_until(lambda: len(runs.runs) == 3, what="three runs")
    await scenario.wait_for_depth(queue.name, 0)
    assert [r.state.immediate_retries for r in runs.runs] == [0, 1, 2]
    assert [r.state.attempt for r in runs.runs] == [1, 1, 1], "a trip through the chain"
    assert {r.delivery_tag for r in runs.runs} == {runs.runs[0].delivery_tag}
    assert not any(r.redelivered for r in runs.runs)
    await wait_until(lambda: len(telemetry.spans()) == 3, what="three attempt spans")
    spans = sorted(telemetry.spans(), key=lambda s: s.start_time or 0)
    outcomes = [(s.attributes or {}).get("delayed_retry.outcome") for s in spans]
    assert outcomes == ["immediate-retry", "immediate-retry", "success"]
    assert [(s.attributes or {}).get("delayed_retry.immediate_retry") for s in spans] == [
        None,
        1,
        2,
    ]
    assert len({s.context.span_id for s in spans if s.context}) == 3
    assert parked.pending() == 0


async def test_each_delivery_runs_again_and_the_record_says_how_often(quorum: Scenario) -> None:
    runs = Runs()

    @with_delayed_retry(
        immediate_retries=2,
        immediate_wait=tenacity.wait_fixed(0.05),
        max_retries=1,
        wait=FAST,
        topology=quorum.topology,
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        runs.record(message)
        raise ConnectionError("still down")

    queue, parked, _ = await start(quorum, handler)
    await publish(quorum.ch, queue.name, b"x", message_id="x")
    record = (await parked.get()).headers
    assert record[h.X_IMMEDIATE_RUNS] == [3, 3]
    assert record[h.X_PARKED_REASON] == "max-retries"
    assert record[h.X_RETRY] == 1
    assert [(r.state.attempt, r.state.immediate_retries) for r in runs.runs] == [
        (1, 0),
        (1, 1),
        (1, 2),
        (2, 0),
        (2, 1),
        (2, 2),
    ]


@pytest.mark.parametrize(
    "failure",
    [ParkMessage("no such customer"), KeyError("not retryable"), RetryAfter(0.2, "later")],
    ids=["park", "not-retryable", "retry-after"],
)
async def test_signals_and_rejected_exceptions_skip_immediate_retries(
    quorum: Scenario, failure: Exception
) -> None:
    runs = Runs()

    @with_delayed_retry(
        immediate_retries=3,
        max_retries=1,
        wait=FAST,
        retry=tenacity.retry_if_exception_type(ConnectionError),
        topology=quorum.topology,
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        if runs.record(message).attempt == 1:
            raise failure
        raise ParkMessage("second delivery")

    queue, parked, _ = await start(quorum, handler)
    await publish(quorum.ch, queue.name, b"x")
    record = (await parked.get()).headers
    first_delivery = [r for r in runs.runs if r.state.attempt == 1]
    assert len(first_delivery) == 1
    assert record[h.X_IMMEDIATE_RUNS][0] == 1


async def test_a_consumer_stopping_during_a_pause_gives_the_message_back(quorum: Scenario) -> None:
    runs = Runs()

    @with_delayed_retry(
        immediate_retries=3,
        immediate_wait=tenacity.wait_fixed(3),
        max_retries=2,
        wait=FAST,
        topology=quorum.topology,
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        runs.record(message)
        raise ConnectionError("down")

    queue, parked, tag = await start(quorum, handler)
    await publish(quorum.ch, queue.name, b"keep-me", message_id="keep-me")
    await wait_until(lambda: len(handler.options.pauses) == 1, what="a pause between runs")
    await queue.cancel(tag)  # a graceful stop: cancel, release, then close
    assert await handler.release_held() == 1
    await quorum.wait_for_depth(queue.name, 1)
    back = await queue.get(timeout=5)
    assert back is not None and back.body == b"keep-me"
    assert h.X_RETRY not in (back.headers or {}), "the give-back spent a delayed retry"
    await back.ack()
    assert len(runs.runs) == 1, "the handler ran again after the stop"
    assert parked.pending() == 0


async def test_a_closed_channel_during_a_pause_ends_the_runs_and_loses_nothing(
    quorum: Scenario,
) -> None:
    runs = Runs()

    @with_delayed_retry(
        immediate_retries=2,
        immediate_wait=tenacity.wait_fixed(1),
        max_retries=2,
        wait=FAST,
        topology=quorum.topology,
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        runs.record(message)
        raise ConnectionError("down")

    channel = await quorum.connection.channel()
    queue = await quorum.queue("q")
    on_channel = await channel.get_queue(queue.name)
    await consume(on_channel, handler)
    await publish(quorum.ch, queue.name, b"keep-me", message_id="keep-me")
    await wait_until(lambda: len(handler.options.pauses) == 1, what="a pause between runs")
    await channel.close()
    await wait_until(lambda: len(handler.options.pauses) == 0, what="the pause to end")
    await quorum.wait_for_depth(queue.name, 1)
    assert len(runs.runs) == 1
    back = await queue.get(timeout=5)
    assert back is not None and back.body == b"keep-me" and back.redelivered
    assert h.X_RETRY not in (back.headers or {})
    await back.ack()
