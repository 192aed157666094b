"""A 3-node cluster: the node leading the delay chain's quorum queues is killed mid-flight.

Every message is inside the chain (waiting 15 s) when the leader node gets
SIGKILL. The quorum queues elect new leaders on the surviving nodes and keep
every message; consumers on the other nodes go on; the consumer connected to
the killed node reconnects (aio-pika robust connection) once it is back, and
handles messages again.
"""

from __future__ import annotations

import asyncio
import json
import warnings
from collections import Counter

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import (
    DelayTopology,
    consume,
    current_retry_state,
    declare_topology,
    with_delayed_retry,
)
from delayed_retry.chain.leaders import leader_policies
from harness import RabbitMQCluster
from tests.support.queues import delete_all
from tests.support.waiting import wait_until

from ._support import QUORUM, Ledger, publish_ids

pytestmark = pytest.mark.cluster

MESSAGES = 300
# Long enough that the last of the messages fails before the first comes back, on a loaded
# machine with coverage tracing (300 failures took more than 3 s there).
CHAIN_WAIT_S = 15
DELAY_LEVEL = 13  # a 15 s wait enters the chain at level 13 (8192 ms)


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("placement", ["one-node", "spread"])
async def test_killing_the_chain_leader_loses_no_message(
    cluster: RabbitMQCluster, unique: str, placement: str
) -> None:
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=14)
    # one-node: declared through node 0 with no policy, node 0 leads every level
    # (client-local leaders). spread: the leader policies set first, the levels lead on
    # every node, and the killed node leads a third of them.
    policies = leader_policies(topology, broker_major=3 if cluster.version in (None, "3.10") else 4)
    for policy in policies if placement == "spread" else []:
        cluster.nodes[0].rabbitmqctl(*policy.rabbitmqctl_args())
    ledger = Ledger(sent=set(range(MESSAGES)))
    failed_once: set[int] = set()
    by_consumer: Counter[int] = Counter()
    connections: list[AbstractRobustConnection] = []

    admin = await aio_pika.connect_robust(cluster.urls[0])
    connections.append(admin)
    channel = await admin.channel()
    await channel.declare_queue(queue, durable=True, arguments=QUORUM)
    await declare_topology(channel, topology, queues=[queue])
    leader = cluster.leader_of(topology.level_name(DELAY_LEVEL))
    assert cluster.members_of(topology.level_name(DELAY_LEVEL)) == [0, 1, 2]

    def handler_for(index: int) -> object:
        @with_delayed_retry(
            max_retries=3, wait=tenacity.wait_fixed(CHAIN_WAIT_S), topology=topology
        )
        async def handle(message: AbstractIncomingMessage) -> None:
            i = json.loads(message.body)["id"]
            state = current_retry_state()
            assert state is not None
            if state.attempt == 1:
                failed_once.add(i)
                raise RuntimeError("fails once: waits in the chain")
            ledger.handled[i] += 1
            by_consumer[index] += 1

        return handle

    reconnected = asyncio.Event()
    for index in range(3):
        conn = await aio_pika.connect_robust(cluster.urls[index], reconnect_interval=1)
        connections.append(conn)
        if index == leader:
            conn.reconnect_callbacks.add(lambda *_: reconnected.set())
        consumer_channel = await conn.channel()
        await consumer_channel.set_qos(prefetch_count=50)
        q = await consumer_channel.declare_queue(queue, passive=True)
        await consume(q, handler_for(index))  # type: ignore[arg-type]

    publisher = await aio_pika.connect_robust(cluster.urls[(leader + 1) % 3])
    connections.append(publisher)
    try:
        await publish_ids(await publisher.channel(), queue, sorted(ledger.sent))
        await wait_until(
            lambda: failed_once >= ledger.sent, timeout=60, what="every message in the chain"
        )
        assert not ledger.handled, "the kill must come while every message is in the chain"
        # The queues were declared seconds ago: 3.10 saves their registry entries and Raft
        # terms lazily, so save them first (the weakness of fresh queues is not under test).
        await asyncio.to_thread(cluster.flush_metadata)
        await asyncio.to_thread(cluster.kill_node, leader)
        stranded = await wait_for_return(cluster, topology, ledger, unique)
        if stranded:
            # RabbitMQ 3.10 before 3.10.20 (rabbitmq-server pull request 7677): a level's
            # dead-letter worker that cannot register with the new leader on a loaded node
            # exits, and the level keeps what it dead-lettered (counted in `messages` only)
            # until the level gets a leader again. Nothing is lost; the operator's remedy,
            # in docs/reliability.md, is to restart the node that leads the level.
            where = await asyncio.to_thread(where_messages_are, cluster, unique)
            warnings.warn(
                f"dead-lettered messages stranded after the leader's kill ({where}); "
                "restarting the nodes that lead those levels",
                stacklevel=1,
            )
            await asyncio.to_thread(cluster.start_node, leader)
            await asyncio.wait_for(reconnected.wait(), 120)
            for index in sorted(set(stranded.values())):
                await asyncio.to_thread(cluster.restart_node, index)
            await wait_until(
                lambda: set(ledger.handled) >= ledger.sent,
                timeout=240,
                what="every message back from the chain after its stranded levels' leaders "
                f"restarted; queues before: {where}",
            )
        else:
            new_leader = cluster.leader_of(topology.level_name(DELAY_LEVEL))
            assert new_leader != leader
        counts = ledger.report("cluster-leader-killed")
        assert counts["lost"] == 0

        # The killed node comes back; its consumer reconnects and takes work again.
        if not reconnected.is_set():
            await asyncio.to_thread(cluster.start_node, leader)
        await asyncio.wait_for(reconnected.wait(), 60)
        # The reconnect callback runs before the robust channel consumes again: wait for the
        # broker to count all three consumers, so the second batch can reach the third.
        probe = await publisher.channel()

        async def three_consumers() -> bool:
            declared = await probe.declare_queue(queue, passive=True)
            return declared.declaration_result.consumer_count == 3

        # Its robust connection retries every 5 s and then restores its channel and consumer:
        # seconds on an idle machine. On a loaded 3.10 cluster, after a kill -9, aio-pika's
        # restore of that consumer has taken over 180 s (seen twice in a full scripts/test-nodes
        # run, never alone): reported with the broker's consumers, and the second batch must
        # then be handled by the two others, nothing lost. Reconnection as such is
        # test_cluster_reconnect.py's subject.
        try:
            await wait_until(three_consumers, timeout=180, what="the reconnected consumer")
            restored = True
        except AssertionError:
            restored = False
            consumers = await asyncio.to_thread(
                cluster.nodes[(leader + 1) % 3].rabbitmqctl, "-q", "list_consumers"
            )
            warnings.warn(
                f"the consumer of killed node {leader} was not restored within 180 s; "
                f"consumers: {consumers.strip()!r}",
                stacklevel=1,
            )
        await probe.close()
        before = by_consumer[leader]
        more = set(range(MESSAGES, MESSAGES + 60))
        ledger.sent |= more
        await publish_ids(await publisher.channel(), queue, sorted(more))
        await wait_until(
            # Each fails once and waits 15 s in the chain, whose leaders just moved.
            lambda: set(ledger.handled) >= ledger.sent,
            timeout=180,
            what="the second batch",
        )
        if restored:
            assert by_consumer[leader] > before, "the reconnected consumer took no work"
        assert ledger.report("cluster-after-rejoin")["lost"] == 0
    finally:
        await asyncio.to_thread(cluster.ensure_all_running)
        for policy in policies if placement == "spread" else []:
            cluster.nodes[0].rabbitmqctl("clear_policy", "--vhost", "/", policy.name)
        cleanup = await aio_pika.connect(cluster.urls[0])
        await delete_all(
            await cleanup.channel(),
            queues=[
                queue,
                topology.default_parking_queue(queue),
                *(spec.name for spec in topology.queues()),
            ],
        )
        await cleanup.close()
        for opened in connections:
            await opened.close()


async def wait_for_return(
    cluster: RabbitMQCluster, topology: DelayTopology, ledger: Ledger, prefix: str
) -> dict[str, int]:
    """Wait until every message is handled again after the kill; the stranded levels if some
    stay in the chain while nothing comes back (empty when all came back).

    Leader elections and the chain wait take ~50 s on an idle 2-core machine. A stall is
    judged only once the wait is well over (a loaded machine needs the margin), and it fails
    with where the missing messages are when no level holds them.
    """
    loop = asyncio.get_running_loop()
    started = last_progress = loop.time()
    handled = 0
    while not set(ledger.handled) >= ledger.sent:
        await asyncio.sleep(1)
        now = loop.time()
        if len(ledger.handled) != handled:
            handled, last_progress = len(ledger.handled), now
        if now - started < CHAIN_WAIT_S + 60 or now - last_progress < 45:
            continue
        stranded = await asyncio.to_thread(stranded_dead_letters, cluster, topology)
        if stranded:
            return stranded
        if now - started > 300:
            where = await asyncio.to_thread(where_messages_are, cluster, prefix)
            missing = len(ledger.sent - set(ledger.handled))
            raise AssertionError(
                f"{missing} messages not back from the chain {now - started:.0f} s after the "
                f"leader was killed, none stranded in a level; queues: {where}"
            )
    return {}


def stranded_dead_letters(cluster: RabbitMQCluster, topology: DelayTopology) -> dict[str, int]:
    """The chain's level queues that hold more than their ready and unacked messages (what
    they dead-lettered and the broker has not yet delivered), with the node leading each."""
    levels = {topology.level_name(n) for n in range(topology.levels)}
    names = {node.name: index for index, node in enumerate(cluster.nodes)}
    return {
        str(row["name"]): names[str(row["leader"])]
        for row in cluster.list_queues(
            "name", "messages", "messages_ready", "messages_unacknowledged", "leader"
        )
        if row["name"] in levels
        and str(row["leader"]) in names
        and int(row["messages"] or 0)
        > int(row["messages_ready"] or 0) + int(row["messages_unacknowledged"] or 0)
    }


def where_messages_are(cluster: RabbitMQCluster, prefix: str) -> str:
    """The test's queues that hold messages or have no leader, and its work queue with its
    consumers: where a stuck message waits and whether anything could take it."""
    rows = cluster.list_queues(
        "name",
        "messages",
        "messages_ready",
        "messages_unacknowledged",
        "consumers",
        "leader",
        "online",
    )
    return (
        "; ".join(
            f"{row['name']} messages={row['messages']} ready={row['messages_ready']} "
            f"unacked={row['messages_unacknowledged']} "
            f"consumers={row['consumers']} leader={row['leader']} online={row['online']}"
            for row in rows
            if str(row["name"]).startswith(prefix)
            # A queue without a leader reports no counts: show it whatever they say.
            and (
                row["messages"]
                or row["messages_ready"]
                or row["messages_unacknowledged"]
                or not row["leader"]
                or str(row["name"]).endswith(".work")
            )
        )
        or "all empty"
    )
