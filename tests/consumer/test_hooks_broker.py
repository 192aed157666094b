"""on_retry and on_park on a real broker: told after the hand-over, never in the way."""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import replace

import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import ConfigurationError, consume, with_delayed_retry
from delayed_retry import headers as h
from delayed_retry.consumer.hooks import FailureEvent
from tests.support.chain import Inbox, Scenario, publish
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

FAST = tenacity.wait_fixed(0.2)


async def start(scenario: Scenario, handler: object) -> tuple[str, Inbox]:
    queue = await scenario.queue("q")
    await consume(queue, handler)  # type: ignore[arg-type]
    parked = Inbox()
    parking = await scenario.ch.get_queue(scenario.topology.default_parking_queue(queue.name))
    await parking.consume(parked)
    return queue.name, parked


async def test_hooks_are_told_after_the_hand_over_even_when_they_raise(
    quorum: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    events: list[tuple[str, FailureEvent, int]] = []

    def on_retry(event: FailureEvent) -> None:  # plain: runs in a thread
        events.append(("retry", event, 0))
        raise RuntimeError("the failure database is down too")

    async def on_park(event: FailureEvent) -> None:
        # Called after the parking record was confirmed: it is in the parking queue.
        await wait_until(lambda: parked.pending() == 1, what="the record before the hook")
        events.append(("park", event, parked.pending()))
        raise ValueError("bug in the hook")

    @with_delayed_retry(
        max_retries=1, wait=FAST, topology=quorum.topology, on_retry=on_retry, on_park=on_park
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        raise ConnectionError("partner API down")

    queue, parked = await start(quorum, handler)
    await publish(quorum.ch, queue, b"x", message_id="m-1")
    await wait_until(lambda: len(events) == 2, what="both hooks")
    record = (await parked.get()).headers
    assert record[h.X_PARKED_REASON] == "max-retries" and record[h.X_RETRY] == 1
    (kind1, retried, _), (kind2, parked_event, _) = events
    assert (kind1, kind2) == ("retry", "park")
    assert retried.decision.action == "retry" and retried.decision.delay == pytest.approx(0.2)
    assert retried.state.attempt == 1 and retried.queue == queue
    assert isinstance(retried.exception, ConnectionError)
    assert retried.message.message_id == "m-1" and retried.message.processed
    assert parked_event.decision.reason == "max-retries" and parked_event.state.attempt == 2
    await quorum.wait_for_depth(queue, 0)
    logged = caplog.text
    assert "on_retry hook" in logged and "the failure database is down too" in logged
    assert "on_park hook" in logged and "bug in the hook" in logged


async def test_hanging_hooks_are_given_up_on_and_the_consumer_goes_on(
    quorum: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="delayed_retry")
    unblock = threading.Event()
    calls: list[str] = []

    def on_retry(event: FailureEvent) -> None:  # blocks its thread, never the event loop
        calls.append("retry")
        unblock.wait(60)

    async def on_park(event: FailureEvent) -> None:
        calls.append("park")
        await asyncio.Event().wait()

    @with_delayed_retry(
        max_retries=1, wait=FAST, topology=quorum.topology, on_retry=on_retry, on_park=on_park
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        if message.body == b"fails":
            raise ConnectionError("down")

    assert handler.options.hooks is not None
    handler.options = replace(handler.options, hooks=replace(handler.options.hooks, timeout=0.5))
    queue, parked = await start(quorum, handler)
    try:
        await publish(quorum.ch, queue, b"fails")
        record = (await parked.get()).headers
        assert record[h.X_PARKED_REASON] == "max-retries"
        await publish(quorum.ch, queue, b"fine")
        await quorum.wait_for_depth(queue, 0)
        await wait_until(lambda: "on_park hook" in caplog.text, what="the hanging on_park logged")
        assert calls == ["retry", "park"]
        assert "on_retry hook" in caplog.text and "did not finish within 0.5 s" in caplog.text
    finally:
        unblock.set()


def test_a_hook_that_is_not_callable_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"on_park='ops@example\.com' is not callable"):
        with_delayed_retry(on_park="ops@example.com")  # type: ignore[call-overload]
