"""DelayedRetry under FastStream's in-memory TestRabbitBroker: the policy's decisions, no broker."""

from __future__ import annotations

import pytest
from faststream.rabbit import RabbitBroker, TestRabbitBroker
from tenacity import retry_if_exception_type, wait_fixed

from delayed_retry.faststream import CurrentRetryState, DelayedRetry
from delayed_retry.faststream.middleware import handed_over_text
from delayed_retry.headers import X_RETRY
from delayed_retry.recovery.policy import Decision


class Transient(Exception):
    pass


async def test_a_handler_test_sees_its_failures_retried_or_parked() -> None:
    retrier = DelayedRetry(
        max_retries=3, wait=wait_fixed(0.3), retry=retry_if_exception_type(Transient)
    )
    broker = RabbitBroker(middlewares=[retrier])
    seen: list[int] = []

    @broker.subscriber("orders")
    async def handle(body: str, state: CurrentRetryState) -> str:
        seen.append(state.attempt)
        if body == "transient":
            raise Transient("database down")
        if body == "invalid":
            raise ValueError("no such order")
        return "done"

    async with TestRabbitBroker(broker) as br:
        await br.publish("transient", "orders")  # not raised: it would be retried
        await br.publish("transient", "orders", headers={X_RETRY: 3})  # the fourth attempt
        await br.publish("invalid", "orders")
        await br.publish("fine", "orders")
        handle.mock.assert_called_with("fine")  # FastStream's own test assertions still work

    assert seen == [1, 4, 1, 1]
    first, last, invalid = retrier.decisions
    assert (first.action, first.attempt) == ("retry", 1)
    assert first.delay == pytest.approx(0.3)
    assert (last.action, last.reason, last.attempt) == ("park", "max-retries", 4)
    assert (invalid.action, invalid.reason) == ("park", "not-retryable")
    assert isinstance(invalid.error, ValueError)


async def test_immediate_retries_run_in_a_handler_test_as_on_a_broker() -> None:
    retrier = DelayedRetry(
        immediate_retries=2, max_retries=3, retry=retry_if_exception_type(Transient)
    )
    broker = RabbitBroker(middlewares=[retrier])
    seen: list[tuple[str, int]] = []

    @broker.subscriber("orders")
    async def handle(body: str, state: CurrentRetryState) -> str:
        seen.append((body, state.immediate_retries))
        if body == "flaky" and state.immediate_retries < 1:
            raise Transient("pool reset")
        if body == "down":
            raise Transient("database down")
        if body == "invalid":
            raise ValueError("no such order")
        return "done"

    async with TestRabbitBroker(broker) as br:
        await br.publish("flaky", "orders")
        await br.publish("down", "orders")
        await br.publish("invalid", "orders")

    assert seen == [
        ("flaky", 0),
        ("flaky", 1),
        ("down", 0),
        ("down", 1),
        ("down", 2),
        ("invalid", 0),
    ]
    down, invalid = retrier.decisions
    assert (down.action, down.immediate_retries) == ("retry", 2)
    assert (invalid.reason, invalid.immediate_retries) == ("not-retryable", 0)


def test_the_text_faststream_logs_says_what_became_of_the_message() -> None:
    error = Transient("database down")
    failed = "failed (Transient: database down); "
    retried = handed_over_text(
        error, decision=Decision.retry_after(2), queue="orders", parking_queue="orders.parking"
    )
    assert retried == f"{failed}retried: back in 'orders' in 2 s through the delay chain"
    parked = handed_over_text(
        error, decision=Decision.park("max-retries"), queue="orders", parking_queue="o.parking"
    )
    assert parked == f"{failed}parked in 'o.parking' (max-retries)"
    in_memory = handed_over_text(
        error, decision=Decision.park("not-retryable"), queue="orders", parking_queue=None
    )
    assert in_memory == f"{failed}parked (not-retryable)"
    given_back = handed_over_text(error, decision=None, queue="orders", parking_queue=None)
    assert given_back == f"{failed}could not be retried or parked now: given back to 'orders'"
    held = handed_over_text(None, decision=None, queue="orders", parking_queue=None)
    assert held.startswith("not handled yet: it came out of the delay chain before its due")
