"""A chain found complete is not declared again; one missing anything is, in full.

Counted on the wire: a proxy between client and broker decodes every method
the client sends (tests/support/amqp_proxy.py), so "no binding" means none
reached the broker, whatever the Python code called.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from pamqp import commands
from tenacity import wait_fixed

from delayed_retry import (
    DelayTopology,
    NoInstrumentation,
    consume,
    current_retry_state,
    declare_topology,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.admin.teardown import plan_teardown, tear_down
from delayed_retry.amqp.channels import declared_queue, exchange_exists
from delayed_retry.chain import routing_keys
from delayed_retry.chain.digest import declaration_digest, digest_marker, markers, settled_marker
from delayed_retry.chain.topology import MAX_NAME_BYTES, amqp_arguments
from delayed_retry.cli import main
from delayed_retry.errors import TopologyMismatchError
from delayed_retry.headers import X_DUE_AT
from tests.support.amqp_proxy import ClientConnection, FrameCountingProxy
from tests.support.chain import Inbox, Scenario, publish
from tests.support.waiting import WAIT, wait_until

THROUGH_5_AND_4 = 0b1011000
"""A delay whose message waits in level queues 6, 4 and 3: level 6's queue dead-letters into
level 5's exchange, which routes it to level 4's queue (a skip-zero binding)."""


# -- pure ----------------------------------------------------------------------------------


def test_the_digest_follows_every_setting_and_nothing_else() -> None:
    base = DelayTopology(prefix="p", levels=16)
    assert declaration_digest(base) == declaration_digest(DelayTopology(prefix="p", levels=16))
    others = [
        DelayTopology(prefix="q", levels=16),
        DelayTopology(prefix="p", levels=17),
        DelayTopology(prefix="p", levels=16, unit=0.002),
        DelayTopology(prefix="p", levels=16, queue_type="classic"),
        DelayTopology.nservicebus(prefix="p"),
    ]
    digests = {declaration_digest(t) for t in [base, *others]}
    assert len(digests) == len(others) + 1


def test_the_marker_name_fits_for_the_longest_prefix() -> None:
    longest = DelayTopology(prefix="p" * (MAX_NAME_BYTES - len(".parking.alerts")))
    assert all(len(name.encode()) <= MAX_NAME_BYTES for name in markers(longest))
    orders = DelayTopology(prefix="orders")
    assert settled_marker(orders) == "orders.chain"
    assert digest_marker(orders) == f"orders.chain-{declaration_digest(orders)}"


# -- on a real broker ----------------------------------------------------------------------


def _chain_binds(seen: ClientConnection, topology: DelayTopology) -> list[object]:
    """The chain's own bindings (and unbindings) a connection sent: not a destination's."""
    chain_queues = {spec.name for spec in topology.queues()}
    return [
        method
        for method in seen.methods
        if isinstance(method, commands.Exchange.Bind | commands.Exchange.Unbind)
        or (
            isinstance(method, commands.Queue.Bind | commands.Queue.Unbind)
            and method.queue in chain_queues
        )
    ]


def _all_chain_bindings(topology: DelayTopology) -> int:
    """Binds and unbinds of a full declaration: every binding, and every retired one removed."""
    queue_bindings = sum(len(spec.bindings) for spec in topology.queues())
    return queue_bindings + len(topology.exchange_bindings()) + len(topology.retired_bindings())


async def _marked(s: Scenario, topology: DelayTopology) -> bool:
    """Whether both markers of ``topology`` exist."""
    return all([await exchange_exists(s.connection, name) for name in markers(topology)])


async def _proxy(rabbitmq_url: str, **options: int) -> tuple[FrameCountingProxy, str]:
    url = aio_pika.connection.make_url(rabbitmq_url)
    proxy = FrameCountingProxy(url.host or "127.0.0.1", url.port or 5672, **options)
    await proxy.start()
    return proxy, str(url.with_host("127.0.0.1").with_port(proxy.port))


async def _arrives_once_not_early(s: Scenario, queue: str, inbox: Inbox, body: bytes) -> None:
    """Send ``body`` through level queues 6, 4 and 3; it arrives, not early, and no copy of it
    arrives before a message sent after it with a longer delay."""
    await publish_delayed(
        s.ch,
        aio_pika.Message(body),
        queue=queue,
        delay=THROUGH_5_AND_4 / 1000,
        topology=s.topology,
    )
    arrival = await inbox.get()
    assert arrival.message.body == body
    assert arrival.at * 1000 >= arrival.headers[X_DUE_AT], "arrived early"
    last = b"last-" + body
    await publish_delayed(s.ch, aio_pika.Message(last), queue=queue, delay=0.3, topology=s.topology)
    assert (await inbox.get()).message.body == last, "a copy arrived"
    assert await s.depth(s.topology.unroutable_queue) == 0


@pytest.mark.broker
async def test_a_reconnecting_consumer_whose_chain_is_complete_declares_no_chain_binding(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    s = quorum
    topology = s.topology
    queue = await s.queue()
    proxy, url = await _proxy(rabbitmq_url)
    handled: asyncio.Queue[bytes] = asyncio.Queue()

    # hold=None: the retry waits in the chain's level queues, which must route it.
    @with_delayed_retry(
        topology=topology, wait=wait_fixed(0.05), hold=None, instrumentation=NoInstrumentation()
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        state = current_retry_state()
        assert state is not None
        if state.attempt == 1:
            raise ConnectionError("fails once, so that it goes through the chain")
        handled.put_nowait(message.body)

    consumer: AbstractRobustConnection = await aio_pika.connect_robust(url, reconnect_interval=0.2)
    try:
        channel = await consumer.channel()
        await consume(await channel.declare_queue(queue.name, passive=True), handle)
        await publish(s.ch, queue.name, b"before")
        assert await asyncio.wait_for(handled.get(), WAIT) == b"before"
        # The first connection found no chain: it declared every binding, and marked it.
        assert len(_chain_binds(proxy.connections[0], topology)) == _all_chain_bindings(topology)
        assert await _marked(s, topology)

        proxy.cut()

        async def consuming_again() -> bool:
            declared = await declared_queue(s.connection, queue.name)
            return (
                len(proxy.connections) > 1 and declared is not None and declared.consumer_count == 1
            )

        await wait_until(consuming_again, what="the consumer back after the cut")
        await publish(s.ch, queue.name, b"after")
        assert await asyncio.wait_for(handled.get(), WAIT) == b"after"
        again = proxy.connections[-1]
        assert _chain_binds(again, topology) == []
        # What it sent instead: passive checks, then its own queue's two bindings
        # (to the delivery exchange, and its parking queue's).
        declares = again.of(commands.Exchange.Declare) + again.of(commands.Queue.Declare)
        chain_names = {e.name for e in topology.exchanges()} | {q.name for q in topology.queues()}
        assert all(
            d.passive  # type: ignore[attr-defined]
            for d in declares
            if getattr(d, "exchange", None) in chain_names
            or getattr(d, "queue", None) in chain_names
        )
        assert {m.queue for m in again.of(commands.Queue.Bind)} == {  # type: ignore[attr-defined]
            queue.name,
            topology.default_parking_queue(queue.name),
        }
    finally:
        await consumer.close()
        await proxy.close()


@pytest.mark.broker
@pytest.mark.parametrize("deleted", ["level exchange", "level queue"])
async def test_a_chain_missing_an_exchange_or_queue_is_declared_in_full_by_the_next_connection(
    quorum: Scenario, rabbitmq_url: str, deleted: str
) -> None:
    s = quorum
    topology = s.topology
    queue = await s.queue()
    await declare_topology(s.ch, topology, queues=[queue.name])
    raw = await s.ch.get_underlay_channel()
    if deleted == "level exchange":  # its bindings both ways go with it
        await raw.exchange_delete(topology.level_name(5))
    else:
        await raw.queue_delete(topology.level_name(4))
    proxy, url = await _proxy(rabbitmq_url)
    try:
        async with await aio_pika.connect(url) as connection:
            await declare_topology(await connection.channel(), topology, queues=[queue.name])
        assert len(_chain_binds(proxy.connections[0], topology)) == _all_chain_bindings(topology)
    finally:
        await proxy.close()
    assert await _marked(s, topology)
    inbox = Inbox()
    await queue.consume(inbox)
    # Published by the first connection, which declared nothing again: the repair serves it.
    await _arrives_once_not_early(s, queue.name, inbox, b"through the repaired levels")


@pytest.mark.broker
async def test_a_binding_removed_by_hand_is_parked_unroutable_until_declare_puts_it_back(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    """The limit of the check: AMQP cannot see one binding. What such a gap routes is kept in
    the unroutable queue (with an alert copy), and ``delayed-retry declare`` repairs it."""
    s = quorum
    topology = s.topology
    queue = await s.queue()
    await declare_topology(s.ch, topology, queues=[queue.name])
    raw = await s.ch.get_underlay_channel()
    key = routing_keys.skip_binding_key(5, 4, topology.levels)
    await raw.queue_unbind(topology.level_name(4), topology.level_name(5), routing_key=key)
    proxy, url = await _proxy(rabbitmq_url)
    try:
        async with await aio_pika.connect(url) as connection:
            await declare_topology(await connection.channel(), topology, queues=[queue.name])
        assert _chain_binds(proxy.connections[0], topology) == []
    finally:
        await proxy.close()
    await publish_delayed(
        s.ch,
        aio_pika.Message(b"into the gap"),
        queue=queue.name,
        delay=THROUGH_5_AND_4 / 1000,
        topology=topology,
    )
    await s.wait_for_depth(topology.unroutable_queue, 1)
    await s.wait_for_depth(topology.alerts_queue, 1)

    declare = ["--url", rabbitmq_url, "declare", "--prefix", topology.prefix]
    declare += ["--levels", str(topology.levels), "--queue-type", topology.queue_type]
    assert await asyncio.to_thread(main, declare) == 0
    await raw.queue_purge(topology.unroutable_queue)
    inbox = Inbox()
    await queue.consume(inbox)
    await _arrives_once_not_early(s, queue.name, inbox, b"through the binding put back")


@pytest.mark.broker
async def test_a_declaration_cut_short_leaves_no_marker_so_the_next_one_is_in_full(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    s = quorum
    topology = s.topology
    await declare_topology(s.ch, topology)
    assert await _marked(s, topology)
    proxy, url = await _proxy(rabbitmq_url, cut_after_binds=20)
    try:
        connection = await aio_pika.connect(url)
        with pytest.raises((aio_pika.exceptions.AMQPError, ConnectionError)):
            await declare_topology(await connection.channel(), topology, repair=True)
        for marker in markers(topology):
            assert not await exchange_exists(s.connection, marker)
        proxy.cut_after_binds = None
        async with await aio_pika.connect(url) as connection:
            await declare_topology(await connection.channel(), topology)
        assert len(_chain_binds(proxy.connections[-1], topology)) == _all_chain_bindings(topology)
        assert await _marked(s, topology)
    finally:
        await proxy.close()


@pytest.mark.broker
async def test_other_settings_under_a_marked_prefix_are_declared_and_refused(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    s = quorum
    await declare_topology(s.ch, s.topology)
    classic = DelayTopology(
        prefix=s.topology.prefix, levels=s.topology.levels, queue_type="classic"
    )
    with pytest.raises(TopologyMismatchError, match="x-queue-type"):
        await declare_topology(s.ch, classic)
    # The refused declaration began as every declaration does: the chain's next connection
    # declares it in full, once, and marks it again.
    assert not await exchange_exists(s.connection, settled_marker(s.topology))
    async with await aio_pika.connect(rabbitmq_url) as connection:
        await declare_topology(await connection.channel(), s.topology)
    assert await _marked(s, s.topology)


@pytest.mark.broker
async def test_a_declaration_under_way_in_another_version_makes_every_connection_declare(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    """Whatever its digest, a declaration deletes the settled marker first: until it has
    written it again, no connection trusts its own digest's marker."""
    s = quorum
    topology = s.topology
    await declare_topology(s.ch, topology)
    raw = await s.ch.get_underlay_channel()
    await raw.exchange_delete(settled_marker(topology))  # as any version's declaration starts
    assert await exchange_exists(s.connection, digest_marker(topology))
    proxy, url = await _proxy(rabbitmq_url)
    try:
        async with await aio_pika.connect(url) as connection:
            await declare_topology(await connection.channel(), topology)
        assert len(_chain_binds(proxy.connections[0], topology)) == _all_chain_bindings(topology)
    finally:
        await proxy.close()
    assert await _marked(s, topology)


@pytest.mark.broker
async def test_a_chain_used_as_it_is_is_not_marked_so_each_connection_warns(
    quorum: Scenario, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Level queues with an in-memory argument are used as they are, with a warning naming
    the fix: the chain is never marked, so every new connection declares it and warns."""
    s = quorum
    topology = s.topology
    name = topology.level_name(4)
    (spec,) = [q for q in topology.queues() if q.name == name]
    arguments: dict[str, Any] = {**amqp_arguments(spec.arguments), "x-max-in-memory-length": 0}
    await s.ch.declare_queue(name, durable=True, arguments=arguments)
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="delayed_retry.amqp.chain_declaration"):
            async with await aio_pika.connect(rabbitmq_url) as connection:
                await declare_topology(await connection.channel(), topology)
        assert any(name in r.getMessage() for r in caplog.records), "no warning"
        assert not await exchange_exists(s.connection, settled_marker(topology))


@pytest.mark.broker
async def test_a_teardown_removes_the_markers_first(quorum: Scenario) -> None:
    s = quorum
    await declare_topology(s.ch, s.topology)
    plan = await plan_teardown(s.connection, s.topology)
    await tear_down(s.connection, plan)
    for marker in markers(s.topology):
        assert not await exchange_exists(s.connection, marker)
    assert not await exchange_exists(s.connection, s.topology.delivery_exchange)
