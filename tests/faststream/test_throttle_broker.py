"""The throttle through FastStream's DelayedRetry: the same implementation as the decorator's."""

from __future__ import annotations

import asyncio

import pytest
from faststream.rabbit import QueueType, RabbitBroker, RabbitQueue
from tenacity import retry_if_exception_type, wait_fixed

from delayed_retry import ConfigurationError, CrashGuard, NoInstrumentation, Throttle
from delayed_retry import with_delayed_retry as decorator
from delayed_retry.faststream import DelayedRetry
from tests.support.chain import Scenario
from tests.support.queues import depth
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

MESSAGES = 20


def test_a_bad_throttle_is_refused_with_the_decorators_error() -> None:
    with pytest.raises(ConfigurationError) as built:
        DelayedRetry(throttle="5")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError) as decorated:
        decorator(throttle="5")  # type: ignore[call-overload]
    assert str(built.value) == str(decorated.value)


async def test_a_faststream_subscriber_stops_probes_and_resumes(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    retrier = DelayedRetry(
        topology=quorum.topology,
        max_retries=50,
        wait=wait_fixed(0.5),
        instrumentation=NoInstrumentation(),
        throttle=Throttle(
            consecutive=3, probe_every=0.2, counts=retry_if_exception_type(ConnectionError)
        ),
    )
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retrier])
    name = quorum.name("orders")
    quorum.track_queue(name, quorum.topology.default_parking_queue(name))
    queue = RabbitQueue(name, queue_type=QueueType.QUORUM, durable=True)
    up = False
    handled: set[str] = set()
    failed: list[str] = []

    @broker.subscriber(queue)
    async def handle(body: str) -> None:
        await asyncio.sleep(0)
        if not up:
            failed.append(body)
            raise ConnectionError("database is down")
        handled.add(body)

    async def consumers() -> int:
        channel = await quorum.connection.channel()
        try:
            declared = await channel.declare_queue(name, passive=True)
            return int(declared.declaration_result.consumer_count or 0)
        finally:
            await channel.close()

    await broker.start()
    try:
        for i in range(MESSAGES):
            await broker.publish(str(i), name)
        await wait_until(
            lambda: (t := retrier.throttle_of(name)) is not None and t.throttled,
            what="the subscriber's throttle to trip",
        )
        await wait_until(lambda: _equals(consumers(), 0), what="no consumer on the broker")
        probes = len(failed)
        await wait_until(lambda: len(failed) >= probes + 2, what="two failing probes")
        assert await depth(quorum.connection, name) > 0  # the rest wait in the queue
        up = True
        await wait_until(lambda: len(handled) == MESSAGES, what="every message handled")
        await wait_until(lambda: _equals(consumers(), 1), what="the subscriber consuming again")
        throttle = retrier.throttle_of(name)
        assert throttle is not None and not throttle.throttled
        assert throttle.state.trips == 1
        assert await depth(quorum.connection, quorum.topology.default_parking_queue(name)) == 0
        assert len(set(failed)) < MESSAGES  # some never failed: they waited
    finally:
        await broker.stop()


async def _equals(value: object, expected: int) -> bool:
    assert asyncio.iscoroutine(value)
    return bool(await value == expected)


async def test_a_faststream_stop_with_release_held_counts_as_no_crash(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    name = quorum.name("deploys")
    quorum.track_queue(name, quorum.topology.default_parking_queue(name))
    queue = RabbitQueue(name, queue_type=QueueType.QUORUM, durable=True)
    handled: list[str] = []
    bodies = [str(i) for i in range(30)]

    def app() -> tuple[RabbitBroker, DelayedRetry]:
        retrier = DelayedRetry(
            topology=quorum.topology,
            instrumentation=NoInstrumentation(),
            crash_guard=CrashGuard(max_crashes=1),  # any counted crash would park
        )
        broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[retrier])

        @broker.subscriber(queue)
        async def handle(body: str) -> None:
            await asyncio.sleep(0.05)
            handled.append(body)

        return broker, retrier

    first, retrier = app()
    await first.start()
    try:
        for body in bodies:
            await first.publish(body, name)
        await wait_until(lambda: len(handled) >= 5, what="some handled")
    finally:
        await retrier.release_held()  # a rolling deploy's graceful stop
        await first.stop()
    second, _ = app()
    await second.start()
    try:
        await wait_until(lambda: set(handled) == set(bodies), what="every message handled")
        parking = quorum.topology.default_parking_queue(name)
        assert await depth(quorum.connection, parking) == 0
    finally:
        await second.stop()
