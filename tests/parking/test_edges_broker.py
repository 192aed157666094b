"""What only a broker can show at the edges: parking storms, parked delivery limits, peeks.

Run on RabbitMQ 3.10 (the default) and 4.0 (``DELAYED_RETRY_TEST_RABBITMQ=4.0``);
where the versions differ, each test says what it expects on each.
"""

from __future__ import annotations

import asyncio
import logging

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage
from tenacity.stop import stop_base

from delayed_retry import ConfigurationError, ParkMessage, consume, with_delayed_retry
from delayed_retry.amqp import declarer as declarer_module
from delayed_retry.chain.topology import DELIVERY_LIMIT
from delayed_retry.parking.shortcuts import peek_parked
from delayed_retry.rabbitmq.versions import broker_major_version
from tests.support.chain import Scenario
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


def _major(scenario: Scenario) -> int | None:
    return broker_major_version(scenario.connection.transport.connection.server_properties)  # type: ignore[union-attr]


async def _park_messages(
    scenario: Scenario, queue: str, count: int, *, prefetch: int = 1
) -> asyncio.Queue[str]:
    """Consume ``queue`` with a handler that parks everything, all ``count`` at once."""
    channel = await scenario.connection.channel()
    await channel.set_qos(prefetch_count=prefetch)
    q = await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
    handled: asyncio.Queue[str] = asyncio.Queue()
    all_in = asyncio.Event()

    @with_delayed_retry(topology=scenario.topology)
    async def handle(message: AbstractIncomingMessage) -> None:
        await handled.put(message.message_id or "")
        if handled.qsize() >= count:
            all_in.set()
        await all_in.wait()  # the parks of a storm start together
        raise ParkMessage("always")

    await consume(q, handle)
    return handled


async def _publish_many(scenario: Scenario, queue: str, count: int, prefix: str = "m") -> None:
    channel = await scenario.connection.channel()
    for start in range(0, count, 500):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    aio_pika.Message(b"x", message_id=f"{prefix}{i}"), routing_key=queue
                )
                for i in range(start, min(count, start + 500))
            )
        )
    await channel.close()


async def test_peeking_never_drops_a_parked_message(quorum: Scenario) -> None:
    """4.0.5 before the fix: peeks 1-21 saw the message, 22-30 nothing, and it was gone."""
    queue = quorum.name("work")
    quorum.track_queue(queue, quorum.topology.default_parking_queue(queue))
    handled = await _park_messages(quorum, queue, 1)
    await _publish_many(quorum, queue, 1)
    await asyncio.wait_for(handled.get(), 30)
    channel = await quorum.connection.channel()
    seen = []
    for _ in range(30):
        parked: list[object] = []
        for _wait in range(200):  # the park is confirmed before the ack; give it time to land
            parked = list(await peek_parked(channel, queue=queue, topology=quorum.topology))
            if parked:
                break
            await asyncio.sleep(0.05)
        seen.append(len(parked))
    assert seen == [1] * 30


async def test_parking_queue_from_before_the_limit_is_kept_and_guarded(
    quorum: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    """A parking queue without x-delivery-limit is used with a warning; on 4.x never peeked."""
    caplog.set_level(logging.WARNING, logger="delayed_retry.amqp.chain_declaration")
    queue = quorum.name("old")
    parking = quorum.topology.default_parking_queue(queue)
    quorum.track_queue(queue, parking)
    await quorum.ch.declare_queue(parking, durable=True, arguments={"x-queue-type": "quorum"})
    handled = await _park_messages(quorum, queue, 1)
    warnings = [
        r.getMessage() for r in caplog.records if r.name == "delayed_retry.amqp.chain_declaration"
    ]
    assert any(parking in w and str(DELIVERY_LIMIT) in w for w in warnings), warnings
    await _publish_many(quorum, queue, 1)
    await asyncio.wait_for(handled.get(), 30)
    await quorum.wait_for_depth(parking, 1)
    channel = await quorum.connection.channel()
    major = _major(quorum)
    if major is not None and major >= 4:
        with pytest.raises(ConfigurationError, match="delivery limit of 20"):
            await peek_parked(channel, queue=queue, topology=quorum.topology)
        await quorum.wait_for_depth(parking, 1)  # nothing was taken
    else:
        parked = await peek_parked(channel, queue=queue, topology=quorum.topology)
        assert [p.message_id for p in parked] == ["m0"]


async def test_parking_storm_keeps_the_connection_and_survives_a_deleted_parking_queue(
    quorum: Scenario, rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """3,000 parks at once on one connection: past channel_max (2047) with a channel each."""
    storm = 3_000
    connection = await aio_pika.connect(rabbitmq_url)  # not robust: a close would show
    try:
        scenario = Scenario(connection, quorum.unique, quorum.topology)  # type: ignore[arg-type]
        await scenario.open()
        queue = quorum.name("storm")
        parking = quorum.topology.default_parking_queue(queue)
        quorum.track_queue(queue, parking)
        handled = await _park_messages(scenario, queue, storm, prefetch=storm)
        await _publish_many(quorum, queue, storm)
        await quorum.wait_for_depth(parking, storm, timeout=120)
        assert not connection.is_closed
        assert handled.qsize() == storm

        # Deleted by hand: the next parks declare it again.
        await quorum.ch.queue_delete(parking)
        monkeypatch.setattr(declarer_module, "PARKING_REDECLARE_INTERVAL", 0.0)
        await _publish_many(quorum, queue, 10, prefix="after")  # the storm's consumer parks them
        await quorum.wait_for_depth(parking, 10, timeout=60)
        assert not connection.is_closed
    finally:
        await connection.close()


async def test_prefetch_one_consumer_with_message_process_retries_parks_and_goes_on(
    quorum: Scenario,
) -> None:
    """aio-pika's ``message.process()`` idiom, one message at a time, a policy that breaks.

    Before: ``process()`` rejected the failing message (gone, no dead-letter exchange) and a
    raising ``stop=`` left the next one unacked, stalling a prefetch-1 consumer for good.
    """
    queue = quorum.name("process")
    parking = quorum.topology.default_parking_queue(queue)
    quorum.track_queue(queue, parking)
    channel = await quorum.connection.channel()
    await channel.set_qos(prefetch_count=1)
    q = await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
    handled: list[str] = []
    attempts: dict[str, int] = {}

    class BrokenStop(stop_base):
        def __call__(self, state: tenacity.RetryCallState) -> bool:
            exc = state.outcome.exception() if state.outcome else None
            if "policy" in str(exc):
                raise RuntimeError("the stop callable broke")
            return False

    @with_delayed_retry(topology=quorum.topology, wait=tenacity.wait_fixed(0.05), stop=BrokenStop())
    async def handle(message: AbstractIncomingMessage) -> None:
        async with message.process():
            kind = message.body.decode()
            attempts[kind] = attempts.get(kind, 0) + 1
            if kind == "flaky" and attempts[kind] == 1:
                raise RuntimeError("flaky fails once")
            if kind == "policy":
                raise RuntimeError("policy")
            handled.append(kind)

    await consume(q, handle)
    for kind in ("flaky", "policy", "ok"):
        await channel.default_exchange.publish(
            aio_pika.Message(kind.encode(), message_id=kind), routing_key=queue
        )
    await wait_until(lambda: sorted(handled) == ["flaky", "ok"], timeout=30, what="handled")
    await quorum.wait_for_depth(parking, 1)
    [parked] = await peek_parked(channel, queue=queue, topology=quorum.topology)
    assert (parked.message_id, parked.reason) == ("policy", "internal-error")
    assert attempts == {"flaky": 2, "policy": 1, "ok": 1}
    await quorum.wait_for_depth(queue, 0)
