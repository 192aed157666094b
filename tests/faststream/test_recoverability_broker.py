"""DelayedRetry's immediate retries and hooks in a real FastStream app: the decorator's own."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from faststream.rabbit import RabbitBroker
from tenacity import wait_fixed

from delayed_retry import ConfigurationError
from delayed_retry import with_delayed_retry as decorator
from delayed_retry.consumer.hooks import FailureEvent
from delayed_retry.faststream import CurrentRetryState
from delayed_retry.headers import RetryState
from tests.faststream.test_middleware_broker import queue_of, retrier, running
from tests.support.chain import Scenario

pytestmark = pytest.mark.broker


@pytest.mark.parametrize(
    "bad",
    [
        {"immediate_retries": 11},
        {"immediate_retries": "2"},
        {"immediate_wait": wait_fixed(1)},
        {"on_retry": 3},
    ],
)
def test_new_options_fail_as_the_decorators_do(bad: dict[str, Any]) -> None:
    from delayed_retry.faststream import DelayedRetry

    with pytest.raises(ConfigurationError) as built:
        DelayedRetry(**bad)
    with pytest.raises(ConfigurationError) as decorated:
        decorator(**bad)
    assert str(built.value) == str(decorated.value)


async def test_immediate_retries_succeed_within_one_delivery(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    retried: list[FailureEvent] = []
    broker = RabbitBroker(
        rabbitmq_url,
        logger=None,
        middlewares=[retrier(quorum, immediate_retries=2, max_retries=2, on_retry=retried.append)],
    )
    queue = queue_of(quorum, "orders")
    states: list[tuple[RetryState, bool]] = []
    done = asyncio.Event()

    @broker.subscriber(queue)
    async def handle(body: str, state: CurrentRetryState) -> str:
        states.append((state, done.is_set()))
        if state.immediate_retries < 2:
            raise ConnectionError(f"run {state.immediate_retries + 1}")
        done.set()
        return "ok"

    async with running(broker):
        await broker.publish("order-1", queue.name, message_id="order-1")
        await asyncio.wait_for(done.wait(), 15)
        await quorum.wait_for_depth(queue.name, 0)
    # Stopped: had FastStream left it unacked, the broker would have it back now.
    assert await quorum.ch.get_queue(queue.name) is not None
    left = await (await quorum.ch.get_queue(queue.name)).get(fail=False)
    assert left is None, "the message was not acked after its successful run"
    assert [(s.attempt, s.immediate_retries) for s, _ in states] == [(1, 0), (1, 1), (1, 2)]
    assert retried == [], "a delayed retry was made"
    assert await quorum.depth(quorum.topology.default_parking_queue(queue.name)) == 0
