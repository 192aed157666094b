"""FastStream's ack policies under DelayedRetry, against a real broker: each one's outcome."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from faststream import AckPolicy
from faststream.rabbit import RabbitBroker, RabbitQueue
from faststream.rabbit.annotations import RabbitMessage

from delayed_retry import ConfigurationError
from delayed_retry.faststream import CurrentRetryState, DelayedRetry, check_subscribers
from delayed_retry.faststream.subscribers import AckPolicyRefusedError
from tests.faststream.test_middleware_broker import queue_of, retrier, running
from tests.support.chain import Scenario
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


async def _left_in(url: str, queue: str) -> int:
    """Messages in ``queue`` once every consumer is gone (unacked ones have come back)."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        left = 0
        while await declared.get(fail=False, no_ack=True) is not None:
            left += 1
        return left


async def _bodies_in(url: str, queue: str) -> set[bytes]:
    """The bodies of the messages in ``queue``, taken out."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        declared = await channel.declare_queue(queue, passive=True)
        bodies = set()
        while (message := await declared.get(fail=False, no_ack=True)) is not None:
            bodies.add(message.body)
        return bodies


@pytest.mark.parametrize(
    "policy",
    [AckPolicy.REJECT_ON_ERROR, AckPolicy.NACK_ON_ERROR, AckPolicy.ACK, AckPolicy.MANUAL],
)
async def test_a_failure_is_retried_and_a_success_acked_under_each_policy(
    quorum: Scenario, rabbitmq_url: str, policy: AckPolicy
) -> None:
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retrier(quorum, max_retries=2)])
    queue = queue_of(quorum, "work")
    attempts: list[int] = []
    done = asyncio.Event()

    @broker.subscriber(queue, ack_policy=policy)
    async def handle(body: str, state: CurrentRetryState, msg: RabbitMessage) -> str:
        attempts.append(state.attempt)
        if state.attempt == 1:
            raise RuntimeError("fails once")
        if policy is AckPolicy.MANUAL:
            await msg.ack()  # MANUAL: a success is the handler's to settle
        done.set()
        return "ok"

    async with running(broker):
        await broker.publish("job", queue.name)
        await asyncio.wait_for(done.wait(), 15)
    assert attempts == [1, 2]
    assert await _left_in(rabbitmq_url, queue.name) == 0
    assert await _left_in(rabbitmq_url, quorum.topology.default_parking_queue(queue.name)) == 0


async def test_manual_leaves_an_unsettled_success_to_the_handler(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retrier(quorum)])
    queue = queue_of(quorum, "manual")
    done = asyncio.Event()

    @broker.subscriber(queue, ack_policy=AckPolicy.MANUAL)
    async def handle(body: str) -> None:
        done.set()  # returns without acking: FastStream's MANUAL leaves it unacked

    async with running(broker):
        await broker.publish("job", queue.name)
        await asyncio.wait_for(done.wait(), 15)
    assert await _left_in(rabbitmq_url, queue.name) == 1


async def test_ack_first_is_refused_at_startup_and_at_the_first_message(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retrier(quorum)])
    queue = queue_of(quorum, "first")
    handled: list[str] = []

    subscriber = broker.subscriber(queue, ack_policy=AckPolicy.ACK_FIRST)

    @subscriber
    async def handle(body: str) -> None:
        handled.append(body)

    with pytest.raises(AckPolicyRefusedError, match="REJECT_ON_ERROR") as refused:
        check_subscribers(broker)
    assert queue.name in str(refused.value) and "ACK_FIRST" in str(refused.value)

    # Without the start-up check, the subscriber handles nothing, and puts back each message
    # no_ack took from the queue (the whole backlog, whatever the prefetch): nothing is lost.
    sent = {f"m{i}" for i in range(20)}
    async with running(broker):
        for body in sorted(sent):
            await broker.publish(body, queue.name)
        await wait_until(lambda: bool(middleware_of(broker).refused), what="the refusal")
        await quorum.wait_for_depth(queue.name, 0)  # all taken, on their way back
    assert handled == []
    await quorum.wait_for_depth(queue.name, len(sent))
    assert await _bodies_in(rabbitmq_url, queue.name) == {b.encode() for b in sent}


def middleware_of(broker: RabbitBroker) -> DelayedRetry:
    (retrier_,) = [m for m in broker.middlewares if isinstance(m, DelayedRetry)]
    return retrier_


async def test_check_subscribers_counts_those_it_serves(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retrier(quorum)])

    @broker.subscriber(queue_of(quorum, "a"))
    async def a(body: str) -> None: ...

    @broker.subscriber(queue_of(quorum, "b"), ack_policy=AckPolicy.NACK_ON_ERROR)
    async def b(body: str) -> None: ...

    assert check_subscribers(broker) == 2
    assert check_subscribers(RabbitBroker(rabbitmq_url)) == 0


def test_check_subscribers_refuses_a_queue_a_reconnect_would_leave_unconsumed() -> None:
    broker = RabbitBroker(
        "amqp://guest:guest@127.0.0.1:1/", logger=None, middlewares=[DelayedRetry()]
    )

    @broker.subscriber(RabbitQueue("kept", durable=True))
    async def kept(body: str) -> None: ...

    assert check_subscribers(broker) == 1

    @broker.subscriber(RabbitQueue("dropped", durable=True, robust=False))
    async def dropped(body: str) -> None: ...

    with pytest.raises(ConfigurationError, match=r"'dropped'.*robust=False.*drop robust=False"):
        check_subscribers(broker)
