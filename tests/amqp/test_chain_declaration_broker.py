"""What a declaration sends, on a real broker: clear mismatches, the longest chain, level queues
with in-memory arguments used as they are."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import (
    DelayTopology,
    TopologyMismatchError,
    consume,
    declare_topology,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.chain.topology import amqp_arguments
from delayed_retry.headers import X_DUE_AT
from tests.support.chain import Inbox, Scenario, publish
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


async def test_existing_queue_with_other_arguments_is_a_clear_mismatch(quorum: Scenario) -> None:
    level = quorum.topology.level_name(3)
    quorum.track_queue(level)
    await quorum.ch.declare_queue(
        level, durable=True, arguments={"x-queue-type": "quorum", "x-message-ttl": 5}
    )
    with pytest.raises(
        TopologyMismatchError, match=rf"(?s)queue '{level}'.*another prefix for the chain"
    ) as info:
        await declare_topology(quorum.ch, quorum.topology)
    assert "x-message-ttl" in str(info.value)
    # The caller's channel survives: the declarations ran on a channel of their own.
    assert not quorum.ch.is_closed
    queue = await quorum.queue()
    await publish(quorum.ch, queue.name, b"still usable")
    await wait_until(lambda: _has(quorum, queue.name, 1), what=f"1 message in {queue.name}")
    # publish_delayed on the same channel fails the same way, and the channel still lives.
    with pytest.raises(TopologyMismatchError, match=level):
        await publish_delayed(
            quorum.ch, aio_pika.Message(b"x"), queue=queue.name, delay=1, topology=quorum.topology
        )
    assert not quorum.ch.is_closed

    @with_delayed_retry(topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        return None

    with pytest.raises(TopologyMismatchError, match=level):
        await consume(queue, handler)
    assert not quorum.ch.is_closed


async def test_existing_exchange_of_another_type_is_a_clear_mismatch(quorum: Scenario) -> None:
    delivery = quorum.topology.delivery_exchange
    await quorum.ch.declare_exchange(delivery, aio_pika.ExchangeType.DIRECT, durable=True)
    with pytest.raises(TopologyMismatchError, match=rf"exchange '{delivery}'"):
        await declare_topology(quorum.ch, quorum.topology)
    assert not quorum.ch.is_closed


async def test_deleted_destination_while_delayed_lands_in_unroutable(scenario: Scenario) -> None:
    queue = await scenario.queue()
    await declare_topology(scenario.ch, scenario.topology, queues=[queue.name])
    alerts = Inbox()
    await (await scenario.ch.get_queue(scenario.topology.alerts_queue)).consume(alerts)
    due = await publish_delayed(
        scenario.ch,
        aio_pika.Message(b"orphan", message_id="orphan-1"),
        queue=queue.name,
        delay=0.5,
        topology=scenario.topology,
    )
    await queue.delete(if_unused=False, if_empty=False)
    unroutable = await scenario.ch.get_queue(scenario.topology.unroutable_queue)
    kept = Inbox()
    await unroutable.consume(kept)
    arrival = await kept.get()
    assert arrival.message.body == b"orphan"
    assert arrival.message.message_id == "orphan-1"
    assert arrival.at >= due.timestamp()
    assert arrival.headers[X_DUE_AT]
    assert (await alerts.get()).message.message_id == "orphan-1"


async def _has(s: Scenario, queue: str, n: int) -> bool:
    return await s.depth(queue) == n


async def test_the_longest_chain_allowed_is_accepted_by_the_broker(
    connection: AbstractRobustConnection, unique: str, rabbitmq_url: str
) -> None:
    # 39 levels of 1 ms: level 38 holds 2**38 ms, just under the broker's ten-year TTL cap.
    # One level more is refused when the topology is built (see test_topology).
    longest = Scenario(
        connection, unique, DelayTopology(prefix=unique, levels=39, queue_type="classic")
    )
    channel = await longest.open()
    try:
        await declare_topology(channel, longest.topology)
        assert await longest.depth(longest.topology.level_name(38)) == 0
    finally:
        await longest.close(rabbitmq_url)


def _level_arguments(scenario: Scenario, level: int, **extra: int) -> dict[str, Any]:
    name = scenario.topology.level_name(level)
    (spec,) = [s for s in scenario.topology.queues() if s.name == name]
    return {**amqp_arguments(spec.arguments), **{k.replace("_", "-"): v for k, v in extra.items()}}


async def test_level_queues_with_in_memory_limits_are_used_as_they_are(
    quorum: Scenario, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # As an operator following the 3.10 advice, or another tool, would have made them:
    # level 4 with one in-memory argument, level 5 with both.
    for level, extra in (
        (4, {"x_max_in_memory_length": 0}),
        (5, {"x_max_in_memory_length": 0, "x_max_in_memory_bytes": 0}),
    ):
        name = quorum.topology.level_name(level)
        quorum.track_queue(name)
        await quorum.ch.declare_queue(
            name, durable=True, arguments=_level_arguments(quorum, level, **extra)
        )
    queue = await quorum.queue()
    with caplog.at_level(logging.WARNING, logger="delayed_retry.amqp.chain_declaration"):
        await declare_topology(quorum.ch, quorum.topology, queues=[queue.name])
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"'{quorum.topology.level_name(4)}', '{quorum.topology.level_name(5)}'" in warning
    assert "x-max-in-memory-bytes=0, x-max-in-memory-length=0" in warning
    assert quorum.topology.memory_policy().command() in warning
    assert not quorum.ch.is_closed
    # Every level is declared and bound: 48 units wait in levels 4 and 5.
    inbox = Inbox()
    await queue.consume(inbox)
    await publish_delayed(
        quorum.ch,
        aio_pika.Message(b"through 5 and 4"),
        queue=queue.name,
        delay=timedelta(milliseconds=48),
        topology=quorum.topology,
    )
    assert (await inbox.get()).message.body == b"through 5 and 4"
    # Another connection (a fresh declaration cache) agrees too.
    other = await aio_pika.connect(rabbitmq_url)
    try:
        await declare_topology(await other.channel(), quorum.topology)
    finally:
        await other.close()


async def test_an_in_memory_limit_does_not_hide_another_mismatch(quorum: Scenario) -> None:
    level = quorum.topology.level_name(3)
    quorum.track_queue(level)
    arguments = _level_arguments(quorum, 3, x_max_in_memory_length=0)
    arguments["x-message-ttl"] = 5
    await quorum.ch.declare_queue(level, durable=True, arguments=arguments)
    with pytest.raises(TopologyMismatchError, match=rf"(?s)queue '{level}'.*x-message-ttl"):
        await declare_topology(quorum.ch, quorum.topology)
    assert not quorum.ch.is_closed
