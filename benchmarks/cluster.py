"""The chain on a private 3-node cluster: each node's broker CPU, before and after the spread.

For each placement of the chain's leaders (``one-node``: declared through node 0
with no policy, every level led there; ``spread``: the leader policies of
:mod:`delayed_retry.chain.leaders` set first, then declared through node 0) and each
kind (``held``: the default hold; ``unheld``: ``hold=None``), a stream of persistent
200-byte delayed messages (delays uniform in 1.2–3 s) is published through all three
nodes in turn and consumed by a ``@with_delayed_retry`` handler on each node.

Per stream: the level leaders per node; each node's Erlang VM CPU (``/proc``) over
the stream less its idle draw measured just before, and its share of the cluster's;
the cluster's broker CPU per delayed message (ms); lateness (arrival − due, ms:
p50, p99, max, min, which must not be below 0); received, missing, duplicates.

``stop`` (opt-in) stops the node that leads most levels 5 s into an unheld stream
published and consumed through the other two: ``pause`` is the longest gap between
two arrivals after the stop, and the lateness shows how late what was due then came.

Run: ``.venv/bin/python benchmarks/cluster.py --json out.json`` (``--stop`` adds the
node stop; ``--version 4.3`` runs the 4.3 chroot nodes), or ``benchmarks/run --only
cluster``. docs/capacity.md quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import precision
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from throughput import broker_cpu_seconds, delete_topology
from workloads import Row, Suite

from delayed_retry import (
    DEFAULT_HOLD,
    DelayTopology,
    consume,
    declare_topology,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.chain.leaders import leader_policies, leader_spread
from harness import RabbitMQCluster

DUE_HEADER = "bench-due-us"
MIN_DELAY, MAX_DELAY = 1.2, 3.0
STOP_AFTER = 5.0
"""Seconds into the stream at which ``stop`` stops the busiest leader node."""


def _major(cluster: RabbitMQCluster) -> int:
    return 3 if cluster.version in (None, "3.10") else 4


def _leaders_per_node(cluster: RabbitMQCluster, topology: DelayTopology) -> list[int]:
    rows = cluster.list_queues("name", "leader")
    spread = leader_spread(topology, {str(r["name"]): str(r["leader"]) for r in rows})
    return [spread.per_node.get(node.name, 0) for node in cluster.nodes]


def _cpu(cluster: RabbitMQCluster) -> list[float]:
    return [broker_cpu_seconds(node.beam_pid) if node.running else 0.0 for node in cluster.nodes]


async def _idle_draw(cluster: RabbitMQCluster, seconds: float = 1.5) -> list[float]:
    """Each node's CPU cores used with nothing sent."""
    before, began = _cpu(cluster), time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - began
    return [(after - b) / elapsed for after, b in zip(_cpu(cluster), before, strict=True)]


async def stream(
    cluster: RabbitMQCluster,
    *,
    spread: bool,
    hold: bool,
    rate: float,
    seconds: float,
    stop: bool = False,
) -> dict[str, Any]:
    """One stream, measured; see the module's docstring for the row's fields."""
    prefix = f"bench-cluster-{uuid.uuid4().hex[:6]}"
    topology = DelayTopology(prefix=prefix)
    policies = leader_policies(topology, broker_major=_major(cluster)) if spread else []
    for policy in policies:
        await asyncio.to_thread(cluster.nodes[0].rabbitmqctl, *policy.rabbitmqctl_args())
    name = f"{prefix}.work"
    admin = await aio_pika.connect(cluster.urls[0])
    channel = await admin.channel()
    await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
    await declare_topology(channel, topology, queues=[name])
    leaders = await asyncio.to_thread(_leaders_per_node, cluster, topology)
    busiest = max(range(len(leaders)), key=leaders.__getitem__)
    used = [i for i in range(len(cluster.nodes)) if not (stop and i == busiest)]
    connections: list[AbstractRobustConnection] = [
        await aio_pika.connect_robust(cluster.urls[i]) for i in used
    ]
    late: list[float] = []
    arrivals: list[float] = []
    seen: dict[str, int] = {}
    total = int(rate * seconds)
    done = asyncio.Event()

    async def handler(message: AbstractIncomingMessage) -> None:
        key = message.message_id or ""
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 1:
            arrivals.append(time.monotonic())
            late.append((time.time() * 1e6 - int(message.headers[DUE_HEADER])) / 1000)  # type: ignore[arg-type]
        if len(seen) == total:
            done.set()

    retrying = with_delayed_retry(topology=topology, hold=DEFAULT_HOLD if hold else None)(handler)
    for connection in connections:
        consumer_channel = await connection.channel()
        await consumer_channel.set_qos(prefetch_count=2000)
        queue = await consumer_channel.get_queue(name)
        await consume(queue, retrying)
    publishers = [await connection.channel() for connection in connections]
    idle = await _idle_draw(cluster)
    rng = random.Random(7)
    cpu0, began = _cpu(cluster), time.monotonic()
    stopped_at: float | None = None
    pending: set[asyncio.Task[Any]] = set()
    async for i in precision.paced(rate, total):
        if stop and stopped_at is None and time.monotonic() - began >= STOP_AFTER:
            stopped_at = time.monotonic()
            pending.add(asyncio.create_task(asyncio.to_thread(cluster.stop_node, busiest)))
        now = datetime.now(UTC)
        due_at = now + timedelta(seconds=rng.uniform(MIN_DELAY, MAX_DELAY))
        message = aio_pika.Message(
            b"x" * 200,
            message_id=str(i),
            headers={DUE_HEADER: int(due_at.timestamp() * 1e6)},
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        )
        task = asyncio.create_task(
            publish_delayed(
                publishers[i % len(publishers)],
                message,
                queue=name,
                delay=due_at,
                topology=topology,
                hold=DEFAULT_HOLD if hold else None,
                now=now,
            )
        )
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(done.wait(), timeout=MAX_DELAY + (240 if stop else 60))
    await asyncio.sleep(0.5)
    elapsed = time.monotonic() - began
    # What did not arrive: still in the work queue (and its consumers), or in the chain.
    rows = await asyncio.to_thread(cluster.list_queues, "name", "messages", "consumers")
    waiting = {
        str(r["name"]): [r["messages"], r["consumers"]]
        for r in rows
        if str(r["name"]).startswith(prefix) and r["messages"]
    }
    cpu = [
        max(0.0, after - before - draw * elapsed)
        for after, before, draw in zip(_cpu(cluster), cpu0, idle, strict=True)
    ]
    for connection in connections:
        await connection.close()
    if stop:
        await asyncio.to_thread(cluster.ensure_all_running)
    # The stopped node may have been the admin connection's: clean up over a new one.
    with contextlib.suppress(Exception):
        await admin.close()
    admin = await aio_pika.connect(cluster.urls[0])
    channel = await admin.channel()
    await delete_topology(channel, topology)
    await channel.queue_delete(name)
    await channel.queue_delete(f"{name}.parking")
    await admin.close()
    for policy in policies:
        await asyncio.to_thread(
            cluster.nodes[0].rabbitmqctl, "clear_policy", "--vhost", "/", policy.name
        )
    busy = sum(cpu) or 1.0
    after_stop = [t for t in arrivals if stopped_at is not None and t >= stopped_at]
    gaps = [b - a for a, b in itertools.pairwise(after_stop)]
    return {
        "placement": "spread" if spread else "one-node",
        "kind": "held" if hold else "unheld",
        "stop": stop,
        "rate": rate,
        "leaders_per_node": leaders,
        "cpu_seconds_per_node": [round(c, 3) for c in cpu],
        "share_per_node": [round(c / busy, 3) for c in cpu],
        "busiest_share": round(max(cpu) / busy, 3),
        "broker_ms_per_message": round(sum(cpu) * 1000 / max(total, 1), 3),
        "lateness_ms": precision._percentiles(late),
        "pause_s": round(max(gaps), 2) if gaps else None,
        "sent": total,
        "received": len(seen),
        "missing": total - len(seen),
        "duplicates": sum(count - 1 for count in seen.values()),
        "waiting_at_end": waiting,
        "seconds": round(elapsed, 1),
    }


async def run(
    *,
    rate: float = 250.0,
    seconds: float = 20.0,
    kinds: tuple[str, ...] = ("unheld", "held"),
    stop: bool = False,
    version: str | None = None,
    placements: tuple[str, ...] = ("one-node", "spread"),
) -> list[dict[str, Any]]:
    """Every placement and kind on one private 3-node cluster; prints each row as measured."""
    cluster = RabbitMQCluster(
        size=3,
        rabbit_env={"dead_letter_worker_publisher_confirm_timeout": 10_000},
        version=version,
    )
    await asyncio.to_thread(cluster.start)
    rows: list[dict[str, Any]] = []
    try:
        for spread in [placement == "spread" for placement in placements]:
            for kind in kinds:
                row = await stream(
                    cluster, spread=spread, hold=kind == "held", rate=rate, seconds=seconds
                )
                rows.append(row)
                print(_line(row), flush=True)
            if stop:
                row = await stream(
                    cluster, spread=spread, hold=False, rate=rate, seconds=seconds, stop=True
                )
                rows.append(row)
                print(_line(row), flush=True)
    finally:
        await asyncio.to_thread(cluster.close)
    return rows


def suite_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows in the suite's shape: the busiest node's share, against the one-node chain's."""
    out = []
    for r in rows:
        if r["stop"]:
            continue
        base = next(b for b in rows if b["placement"] == "one-node" and b["kind"] == r["kind"])
        lost = r["missing"] or r["duplicates"] or r["lateness_ms"]["min"] < 0
        out.append(
            {
                **r,
                "workload": f"cluster {r['rate']:g}/s {r['kind']}",
                "subject": f"leaders {r['placement']} {r['leaders_per_node']}",
                "baseline": "leaders on one node",
                "unit": "busiest node's share of broker CPU",
                "value": r["busiest_share"],
                "baseline_value": base["busiest_share"],
                "ratio": None,
                "note": "FAIL: a message missing, twice or early" if lost else "",
            }
        )
    return out


def _line(row: dict[str, Any]) -> str:
    late = row["lateness_ms"]
    return (
        f"{row['placement']:8} {row['kind']:6} {'stop ' if row['stop'] else ''}"
        f"leaders {row['leaders_per_node']} shares {row['share_per_node']} "
        f"busiest {row['busiest_share']:.0%} broker {row['broker_ms_per_message']} ms/msg "
        f"late p50 {late['p50']} p99 {late['p99']} max {late['max']} min {late['min']} ms "
        f"pause {row['pause_s']} s recv {row['received']}/{row['sent']} "
        f"dup {row['duplicates']} left {row['waiting_at_end']}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster workload's options."""
    parser.add_argument("--cluster-rate", type=float, default=250.0, help="msg/s (250)")
    parser.add_argument(
        "--cluster-seconds", type=float, default=None, help="s per stream (20; 5 with --quick)"
    )
    parser.add_argument(
        "--cluster-kinds", nargs="+", default=["unheld", "held"], choices=["unheld", "held"]
    )
    parser.add_argument(
        "--cluster-placements",
        nargs="+",
        default=["one-node", "spread"],
        choices=["one-node", "spread"],
    )
    parser.add_argument(
        "--cluster-stop", action="store_true", help="also stop the busiest leader node"
    )
    parser.add_argument(
        "--cluster-version", default=None, help="RabbitMQ version of the nodes (default 3.10)"
    )


async def cluster(suite: Suite) -> list[Row]:
    """The chain's leaders on one node, then spread, on a private 3-node cluster of its own."""
    args = suite.args
    seconds = args.cluster_seconds or (5.0 if suite.quick else 20.0)
    measured = await run(
        rate=args.cluster_rate,
        seconds=seconds,
        kinds=tuple(args.cluster_kinds),
        stop=args.cluster_stop,
        version=args.cluster_version,
        placements=tuple(args.cluster_placements),
    )
    return suite_rows(measured)
