"""Delays to an exchange and routing key: the forward queue and the forwarder, on a real broker."""

from __future__ import annotations

import asyncio
import signal
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import pytest

from delayed_retry import ConfigurationError, declare_topology, publish_delayed
from delayed_retry.chain.topology import DelayTopology, amqp_arguments
from delayed_retry.delivery.forwarder import Forwarder
from delayed_retry.durations import to_epoch_ms
from delayed_retry.headers import (
    X_DUE_AT,
    X_FORWARD_ROUTING_KEY,
    X_ORIGINAL_EXCHANGE,
    X_PARKED_REASON,
    forwarded_headers,
)
from tests.support.chain import Inbox, Scenario
from tests.support.services import lines_until_running, start_command
from tests.support.waiting import wait_until


def test_forward_queue_name_is_under_the_prefix() -> None:
    topology = DelayTopology(prefix="p")
    assert topology.forward_queue("amq.topic") == "p.forward.amq.topic"
    with pytest.raises(ConfigurationError, match="default exchange"):
        topology.forward_queue("")


def test_forwarded_headers_drop_the_chain_headers_only() -> None:
    out = forwarded_headers({X_FORWARD_ROUTING_KEY: "k", X_DUE_AT: 1, "x-death": [], "app": "kept"})
    assert out == {"app": "kept"}


async def _exchange(s: Scenario, kind: str = "topic") -> str:
    name = s.name("x")
    s.track_exchange(name)
    await s.ch.declare_exchange(name, kind, durable=True)
    return name


async def _forwarding_to_an_inbox(s: Scenario) -> tuple[str, str, Inbox]:
    """An exchange, its forward queue, and an inbox consuming a queue bound to it for ``k``."""
    exchange = await _exchange(s)
    forward = _track_forward(s, exchange)
    q = await s.queue()
    await q.bind(exchange, routing_key="k")
    inbox = Inbox()
    await q.consume(inbox)
    return exchange, forward, inbox


def _track_forward(s: Scenario, exchange: str) -> str:
    queue: str = s.topology.forward_queue(exchange)
    s.track_queue(queue, f"{queue}.parking")
    return queue


async def test_delay_to_an_exchange_reaches_every_bound_queue_not_early(quorum: Scenario) -> None:
    s = quorum
    exchange = await _exchange(s)
    _track_forward(s, exchange)
    inboxes = []
    for suffix in ("a", "b"):
        q = await s.queue(suffix)
        await q.bind(exchange, routing_key="orders.*")
        inbox = Inbox()
        await q.consume(inbox)
        inboxes.append(inbox)
    other = await s.queue("other")
    await other.bind(exchange, routing_key="invoices.*")

    async with Forwarder(s.connection, exchanges=[exchange], topology=s.topology) as fwd:
        sent = time.time()
        due = await publish_delayed(
            s.ch,
            aio_pika.Message(b"hello", headers={"app": "kept"}),
            exchange=exchange,
            routing_key="orders.created",
            delay=0.4,
            topology=s.topology,
        )
        for inbox in inboxes:
            arrival = await inbox.get()
            assert arrival.message.body == b"hello"
            assert arrival.at >= due.timestamp() >= sent
            assert arrival.message.routing_key == "orders.created"
            assert arrival.message.exchange == exchange
            assert arrival.headers.get("app") == "kept"
            assert X_FORWARD_ROUTING_KEY not in arrival.headers
        # The copy can reach the queues before its confirm reaches the forwarder, which
        # counts a forward once confirmed and acked.
        await wait_until(lambda: fwd.forwarded >= 1, what="the forwarder to count the forward")
        assert fwd.forwarded == 1
    assert await s.depth(other.name) == 0


async def test_a_delay_to_an_exchange_is_held_by_default_and_never_forwarded_early(
    quorum: Scenario,
) -> None:
    s = quorum
    exchange, forward, inbox = await _forwarding_to_an_inbox(s)
    # Shorter than the default hold's 1 s limit: no hop at all, straight to the forward
    # queue, where a holding forwarder keeps it until due.
    due = await publish_delayed(
        s.ch,
        aio_pika.Message(b"held"),
        exchange=exchange,
        routing_key="k",
        delay=0.6,
        topology=s.topology,
    )
    await s.wait_for_depth(forward, 1)
    for level in range(s.topology.levels):
        assert await s.depth(s.topology.level_name(level)) == 0
    # A forwarder that holds nothing sends it back into the chain for the rest of its wait.
    async with Forwarder(s.connection, exchanges=[exchange], topology=s.topology, hold=None):
        arrival = await inbox.get()
    assert arrival.message.body == b"held"
    assert arrival.at * 1000 >= to_epoch_ms(due), "forwarded before its due time"
    assert inbox.pending() == 0


async def test_an_unheld_forwarder_forwards_a_due_time_past_the_chains_reach(
    quorum: Scenario,
) -> None:
    """A due time the chain could never wait for is a wrong header: forwarded, not looped."""
    s = quorum
    exchange, forward, inbox = await _forwarding_to_an_inbox(s)
    await declare_topology(s.ch, s.topology)
    arguments: dict[str, Any] = dict(
        amqp_arguments(s.topology.forward_queue_spec(exchange).arguments)
    )
    await s.ch.declare_queue(forward, durable=True, arguments=arguments)
    far = to_epoch_ms(datetime.now(UTC) + s.topology.max_delay + timedelta(days=1))
    await s.ch.default_exchange.publish(
        aio_pika.Message(b"far", headers={X_DUE_AT: far, X_FORWARD_ROUTING_KEY: "k"}),
        routing_key=forward,
    )
    async with Forwarder(s.connection, exchanges=[exchange], topology=s.topology, hold=None) as fwd:
        arrival = await inbox.get()
    assert arrival.message.body == b"far"
    assert fwd.given_back == 0


async def test_missing_exchange_is_an_error_at_the_call(quorum: Scenario) -> None:
    s = quorum
    missing = s.name("missing")
    with pytest.raises(ConfigurationError, match=f"exchange '{missing}' does not exist"):
        await publish_delayed(
            s.ch,
            aio_pika.Message(b"x"),
            exchange=missing,
            routing_key="k",
            delay=1,
            topology=s.topology,
        )


async def test_exchange_deleted_while_waiting_parks_with_a_record(quorum: Scenario) -> None:
    s = quorum
    exchange = await _exchange(s)
    forward = _track_forward(s, exchange)
    q = await s.queue()
    await q.bind(exchange, routing_key="k")
    await publish_delayed(
        s.ch,
        aio_pika.Message(b"orphan"),
        exchange=exchange,
        routing_key="k",
        delay=0.2,
        topology=s.topology,
    )
    await s.ch.exchange_delete(exchange)
    await s.wait_for_depth(forward, 1)  # due, waiting for a forwarder

    async with Forwarder(s.connection, exchanges=[exchange], topology=s.topology) as fwd:
        await s.wait_for_depth(f"{forward}.parking", 1)
        assert fwd.parked == 1
    parked = await s.ch.get_queue(f"{forward}.parking")
    message = await parked.get(timeout=5)
    assert message.body == b"orphan"
    assert message.headers[X_PARKED_REASON] == "exchange-missing"
    assert message.headers[X_ORIGINAL_EXCHANGE] == exchange
    assert message.headers[X_FORWARD_ROUTING_KEY] == "k"  # a replay forwards it again
    await message.ack()
    assert await s.depth(forward) == 0


async def test_nothing_bound_for_the_key_parks_instead_of_dropping(quorum: Scenario) -> None:
    s = quorum
    exchange = await _exchange(s, "direct")
    forward = _track_forward(s, exchange)
    async with Forwarder(s.connection, exchanges=[exchange], topology=s.topology):
        await publish_delayed(
            s.ch,
            aio_pika.Message(b"nobody"),
            exchange=exchange,
            routing_key="k",
            delay=0,
            topology=s.topology,
        )
        await s.wait_for_depth(f"{forward}.parking", 1)
    parked = await s.ch.get_queue(f"{forward}.parking")
    message = await parked.get(timeout=5)
    assert message.headers[X_PARKED_REASON] == "unroutable"
    await message.ack()


async def test_several_forwarders_share_a_queue_and_lose_nothing(quorum: Scenario) -> None:
    s = quorum
    exchange = await _exchange(s, "fanout")
    _track_forward(s, exchange)
    q = await s.queue()
    await q.bind(exchange)
    inbox = Inbox()
    await q.consume(inbox)
    first = Forwarder(s.connection, exchanges=[exchange], topology=s.topology, prefetch=1)
    second = Forwarder(s.connection, exchanges=[exchange], topology=s.topology, prefetch=1)
    async with first, second:
        for i in range(20):
            await publish_delayed(
                s.ch,
                aio_pika.Message(str(i).encode()),
                exchange=exchange,
                routing_key="",
                delay=0.05,
                topology=s.topology,
            )
        bodies = {a.message.body for a in await inbox.take(20)}
        await wait_until(
            lambda: first.forwarded + second.forwarded == 20, what="both forwarders' acks"
        )
    assert bodies == {str(i).encode() for i in range(20)}


@pytest.mark.timeout(120)
async def test_forwarder_command_forwards_and_stops_on_sigterm(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    s = quorum
    exchange = await _exchange(s, "fanout")
    _track_forward(s, exchange)
    q = await s.queue()
    await q.bind(exchange)
    inbox = Inbox()
    await q.consume(inbox)
    proc = start_command(
        [
            "--url",
            rabbitmq_url,
            "forwarder",
            "--exchange",
            exchange,
            "--prefix",
            s.topology.prefix,
            "--levels",
            str(s.topology.levels),
        ]
    )
    try:
        await asyncio.to_thread(lines_until_running, proc)
        await publish_delayed(
            s.ch,
            aio_pika.Message(b"cli"),
            exchange=exchange,
            routing_key="",
            delay=0.1,
            topology=s.topology,
        )
        assert (await inbox.get()).message.body == b"cli"
        proc.send_signal(signal.SIGTERM)
        out, _ = await asyncio.to_thread(proc.communicate, timeout=60)
        assert proc.returncode == 0, out
        assert "forwarded 1, parked 0" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
