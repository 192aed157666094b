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
p50, p99, max, min, which must not be below 0); sent (publishes the broker
confirmed: a failed publish is published again, as a careful producer does, and
counted in ``publish_failures`` by its error), ``not_sent`` (never confirmed in
2 min), received, missing (confirmed and never received), duplicates; with ``stop``,
``received_after_return``: what was missing and arrived in the 2 min after the stopped
node was started again.

``stop`` (opt-in) stops the node that leads most levels 5 s into an unheld stream
published and consumed through the other two: ``pause`` is the longest gap between
two arrivals after the stop, and the lateness shows how late what was due then came.
A stream that comes short prints, before anything is deleted, every node's queues
(leader, members, depths, consumers), consumers, channels and dead-lettering log
lines; ``--cluster-keep PATH`` then keeps the cluster (consumers running) until PATH
is removed.

Run: ``benchmarks/run --only cluster`` (``--cluster-stop`` adds the node stop,
``--cluster-version 4.3`` runs the 4.3 chroot nodes; ``benchmarks/run --help``).
docs/capacity.md quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
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
from delayed_retry.errors import ConfigurationError
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
    keep: Path | None = None,
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
    confirmed: set[str] = set()
    failures: Counter[str] = Counter()
    sending = True
    done = asyncio.Event()

    async def handler(message: AbstractIncomingMessage) -> None:
        key = message.message_id or ""
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 1:
            arrivals.append(time.monotonic())
            late.append((time.time() * 1e6 - int(message.headers[DUE_HEADER])) / 1000)  # type: ignore[arg-type]
        if not sending and confirmed.issubset(seen):
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
        due_at = datetime.now(UTC) + timedelta(seconds=rng.uniform(MIN_DELAY, MAX_DELAY))

        async def send(i: int = i, due_at: datetime = due_at) -> None:
            message = aio_pika.Message(
                b"x" * 200,
                message_id=str(i),
                headers={DUE_HEADER: int(due_at.timestamp() * 1e6)},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await publish_delayed(
                publishers[i % len(publishers)],
                message,
                queue=name,
                delay=max(due_at, datetime.now(UTC)),
                topology=topology,
                hold=DEFAULT_HOLD if hold else None,
            )
            confirmed.add(str(i))

        task = asyncio.create_task(_until_confirmed(send, failures))
        pending.add(task)
        task.add_done_callback(pending.discard)
    # A failed publish is retried, so no task fails; gather would still raise if one did.
    await asyncio.gather(*pending)
    sending = False
    if confirmed.issubset(seen):
        done.set()
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
    if not confirmed.issubset(seen):
        await asyncio.to_thread(_inspect, cluster, prefix, connections, keep)
    cpu = [
        max(0.0, after - before - draw * elapsed)
        for after, before, draw in zip(_cpu(cluster), cpu0, idle, strict=True)
    ]
    received = len(confirmed.intersection(seen))
    if stop:
        await asyncio.to_thread(cluster.ensure_all_running)
        # Does the stopped node's return bring what was still missing?
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=RETURN_WAIT_S)
    for connection in connections:
        await connection.close()
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
        "sent": len(confirmed),
        "not_sent": total - len(confirmed),
        "publish_failures": dict(failures),
        "received": received,
        "missing": len(confirmed) - received,
        "received_after_return": len(confirmed.intersection(seen)) - received,
        "duplicates": sum(count - 1 for count in seen.values()),
        "waiting_at_end": waiting,
        "seconds": round(elapsed, 1),
    }


RETURN_WAIT_S = 120.0
"""How long ``stop`` waits, after the stopped node is back, for what had not arrived."""
PUBLISH_RETRY_S = 0.5
"""The pause of a producer before it publishes a message again after a failed publish."""
GIVE_UP_S = 120.0
"""How long a producer tries to publish one message before it counts it as not sent."""


async def _until_confirmed(send: Callable[[], Awaitable[None]], failures: Counter[str]) -> None:
    """Publish as a careful producer does: again after each failure, until confirmed.

    A failed publish (a nack, no confirm in time, a channel closing under it) is
    counted in ``failures`` by its type; a message never confirmed within
    :data:`GIVE_UP_S` is not sent (``not_sent``), never counted as missing.
    """
    deadline = time.monotonic() + GIVE_UP_S
    while True:
        try:
            await send()
            return
        except ConfigurationError:
            raise
        except Exception as exc:
            failures[type(exc).__name__] += 1
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(PUBLISH_RETRY_S)


STUCK_DLX_WORKERS = """
[begin
   S = sys:get_state(P),
   {element(4, element(2, S)), maps:size(element(8, S)),
    [element(4, Q) || {Q, C} <- maps:to_list(element(2, element(7, S))),
                      element(3, element(4, C)) =:= undefined]}
 end || {_, P, _, _} <- supervisor:which_children(rabbit_fifo_dlx_sup),
        maps:size(element(8, sys:get_state(P))) > 0].
"""
"""Per at-least-once dead-letter worker with unconfirmed messages: its source queue, how
many, and the target queues its client knows no leader for (3.10's record layout)."""


def _inspect(
    cluster: RabbitMQCluster,
    prefix: str,
    connections: list[AbstractRobustConnection],
    keep: Path | None,
) -> None:
    """Print where the missing messages are, per node and from the broker's side.

    With ``keep``, write the nodes' URLs there and wait (consumers still running)
    until someone removes it, so the cluster can be inspected by hand.
    """
    columns = ["name", "leader", "members", "messages", "messages_ready"]
    columns += ["messages_unacknowledged", "consumers", "state"]
    running = [node for node in cluster.nodes if node.running]
    print("--- list_queues " + " ".join(columns), flush=True)
    for line in running[0].rabbitmqctl("list_queues", *columns).splitlines():
        if prefix in line:
            print(line, flush=True)
    for node in running:
        print(f"--- {node.name}: its dead-letter workers' lines in its log", flush=True)
        for line in node.log_file.read_text(errors="replace").splitlines():
            if "dlx" in line and "boot step" not in line:
                print(line, flush=True)
        print(f"--- {node.name}: dead-letter workers with messages awaiting a confirm", flush=True)
        try:
            print(node.rabbitmqctl("eval", STUCK_DLX_WORKERS, timeout=60), flush=True)
        except Exception as exc:  # another version's record layout, or a busy node
            print(f"(not read: {exc})", flush=True)
        print(f"--- {node.name}: list_consumers", flush=True)
        print(node.rabbitmqctl("list_consumers"), flush=True)
        print(f"--- {node.name}: list_channels", flush=True)
        print(
            node.rabbitmqctl(
                "list_channels",
                "name",
                "consumer_count",
                "messages_unacknowledged",
                "prefetch_count",
            ),
            flush=True,
        )
    for connection in connections:
        print(f"--- client {connection}: closed={connection.is_closed}", flush=True)
    if keep is not None:
        keep.write_text(" ".join(node.url for node in cluster.nodes) + "\n")
        print(f"--- kept the cluster until {keep} is removed", flush=True)
        while keep.exists():
            time.sleep(1)


async def run(
    *,
    rate: float = 250.0,
    seconds: float = 20.0,
    kinds: tuple[str, ...] = ("unheld", "held"),
    stop: bool = False,
    version: str | None = None,
    placements: tuple[str, ...] = ("one-node", "spread"),
    keep: Path | None = None,
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
                    cluster,
                    spread=spread,
                    hold=kind == "held",
                    rate=rate,
                    seconds=seconds,
                    keep=keep,
                )
                rows.append(row)
                print(_line(row), flush=True)
            if stop:
                row = await stream(
                    cluster,
                    spread=spread,
                    hold=False,
                    rate=rate,
                    seconds=seconds,
                    stop=True,
                    keep=keep,
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
        f"not sent {row['not_sent']} publish failures {row['publish_failures']} "
        f"dup {row['duplicates']} left {row['waiting_at_end']} "
        f"after the node's return {row['received_after_return']}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cluster workload's options."""
    parser.add_argument("--cluster-rate", type=float, default=250.0, help="msg/s (250)")
    parser.add_argument(
        "--cluster-seconds", type=float, default=None, help="s per stream (20; 5 with --quick)"
    )
    parser.add_argument(
        "--cluster-kinds",
        nargs="*",
        default=["unheld", "held"],
        choices=["unheld", "held"],
        help="streams without a stop (both; none: only the --cluster-stop stream)",
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
        "--cluster-keep",
        type=Path,
        default=None,
        metavar="PATH",
        help="on a shortfall, keep the cluster running until PATH (written) is removed",
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
        keep=args.cluster_keep,
    )
    return suite_rows(measured)
