"""The benchmark suite: delayed-retry beside its baselines and peers, on a private broker.

Run it with ``benchmarks/run`` (``--quick`` for a run of a few minutes). It
starts a private RabbitMQ node (so it can set ``consumer_timeout`` and does not
load the machine's shared broker), runs each workload, prints a table, and
writes ``benchmarks/results/<time>.json`` and ``.png`` with the RabbitMQ
version, the machine and every parameter. Every figure is also a ratio to a
baseline measured in the same run: absolute numbers on a shared machine move
from run to run, ratios much less.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import capacity
import hop_anatomy
import hops
import overhead
import peer_workers
import precision
import report
import throughput

from delayed_retry import DelayTopology
from harness import RabbitMQNode

PEER_SUBJECTS = peer_workers.SUBJECTS
OPT_IN = ("peer-success", "capacity", "broker-cost", "hop-anatomy", "cluster")
"""Workloads run only when named with --only (peer-success: eight worker starts, noisy;
capacity: a million messages take many minutes; broker-cost: a node of its own with the
management plugin, two minutes; hop-anatomy: six subjects taking the one-hop retry
apart, an analysis rather than a target; cluster: a private 3-node cluster of its own,
about five minutes)."""

WORKLOADS = (
    "overhead",
    "throughput",
    "precision",
    "hops",
    "peers",
    "peer-success",
    "storm",
    "crash",
    "long-delay",
    "peer-precision",
    "capacity",
    "broker-cost",
    "hop-anatomy",
    "cluster",
)


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    python = platform.python_version()
    return f"{platform.node()} {os.cpu_count()} cores {cpu}; Python {python}; load {load}"


async def _server_version(url: str) -> str:
    connection = await aio_pika.connect(url)
    async with connection:
        props = connection.transport.connection.server_properties  # type: ignore[union-attr]
        version = props.get("version", "?")
        return version.decode() if isinstance(version, bytes) else str(version)


def _parameters(args: argparse.Namespace) -> dict[str, Any]:
    return {k: v for k, v in vars(args).items() if k not in ("out",)}


async def _run(
    url: str, args: argparse.Namespace, broker_pid: int | None, node: RabbitMQNode | None = None
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if "overhead" in args.only:
        print("overhead: the success and retry paths' own CPU cost, no broker ...")
        repeats = 5 if args.quick else 15
        rows += await asyncio.to_thread(overhead.run, repeats=repeats)
        rows += await asyncio.to_thread(overhead.run_retry, repeats=repeats)
        # Both deliveries, frames encoded: about 2.5 s at this size, so fewer than the rows above.
        rows += await asyncio.to_thread(
            overhead.run_redelivery, messages=1_000, repeats=3 if args.quick else 5
        )
    if "throughput" in args.only:
        print(f"throughput: {args.messages} messages x {args.rounds} rounds per subject ...")
        rows += await throughput.run(
            url, messages=args.messages, rounds=args.rounds, broker_pid=broker_pid
        )
    if "hop-anatomy" in args.only:
        print(f"hop-anatomy: {args.messages} messages x {args.rounds} rounds per variant ...")
        rows += await hop_anatomy.run(
            url, messages=args.messages, rounds=args.rounds, broker_pid=broker_pid
        )
    if "precision" in args.only:
        print(f"precision: {args.precision_seconds} s at each of {args.rates} msg/s ...")
        topology = DelayTopology(
            prefix=f"bench-precision-{int(time.time())}",
            levels=args.levels,
            unit=timedelta(milliseconds=args.unit_ms),
        )
        rows += await precision.run(
            url,
            rates=tuple(args.rates),
            seconds=args.precision_seconds,
            min_delay=args.min_delay,
            max_delay=args.max_delay,
            topology=topology,
            side_rate=args.side_rate,
        )
        await _delete_topology(url, topology)
    if "hops" in args.only:
        print(f"hops: chain exit lateness by hops, {args.precision_seconds} s at {args.rates} ...")
        topology = DelayTopology(
            prefix=f"bench-hops-{int(time.time())}",
            levels=args.levels,
            unit=timedelta(milliseconds=args.unit_ms),
        )
        rows += await hops.run(
            url,
            rates=tuple(args.rates[:1]) if args.quick else tuple(args.rates),
            seconds=args.precision_seconds,
            min_delay=args.min_delay,
            max_delay=args.max_delay,
            topology=topology,
        )
        await _delete_topology(url, topology)
    if "peers" in args.only:
        import peers

        print("peers ...")
        rows += await peers.run(
            url, messages=args.messages, rounds=args.rounds, broker_pid=broker_pid
        )
    if "capacity" in args.only:
        print(f"capacity: {args.capacity_messages} delayed 1 KB messages waiting at once ...")
        rows += await capacity.run(
            url,
            node=node,
            messages=args.capacity_messages,
            baseline_messages=args.capacity_baseline or min(args.capacity_messages, 50_000),
            drain=args.capacity_drain or min(args.capacity_messages, 50_000),
            window=args.capacity_window,
            drain_level=args.capacity_drain_level,
            memory_policy=args.capacity_memory_policy,
            batched=not args.capacity_publish_delayed,
        )
    if "broker-cost" in args.only:
        rows += await _broker_cost(args)
    if "cluster" in args.only:
        import cluster

        print("cluster: the chain's leaders on one node, then spread, on a 3-node cluster ...")
        measured = await cluster.run(seconds=5.0 if args.quick else 20.0, stop=not args.quick)
        rows += cluster.suite_rows(measured)
    rows += await _peer_workloads(url, args)
    return rows


async def _broker_cost(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The broker's CPU per delayed message (benchmarks/broker_cost.py), on a node of its own."""
    import broker_cost

    if args.url is not None:
        print("broker-cost: skipped with --url (it reads a private node's CPU and counters)")
        return []
    seconds = args.broker_cost_seconds or (3.0 if args.quick else 5.0)
    print(
        f"broker-cost: {seconds} s at each of {args.broker_cost_rates} msg/s, "
        "a private node with the management plugin ..."
    )
    rows = await broker_cost.run(
        rates=tuple(args.broker_cost_rates),
        seconds=seconds,
        min_delay=args.min_delay,
        max_delay=args.max_delay,
    )
    print(broker_cost.table(rows))
    return broker_cost.suite_rows(rows)


async def _peer_workloads(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Retry storm, crash, long delays and peer precision (benchmarks/storm.py and friends)."""
    import peer_precision
    import storm

    rows: list[dict[str, Any]] = []
    subjects = tuple(args.peer_subjects)
    prefix = f"bench-storm-{int(time.time())}"
    storm_args = {"messages": args.storm_messages, "fail": args.storm_fail, "base": args.storm_base}
    if "peer-success" in args.only:
        print(f"peer-success: {args.success_messages} messages per subject, no failure ...")
        rows += await storm.run_success(
            url, subjects=subjects, messages=args.success_messages, prefix=prefix
        )
    if "storm" in args.only:
        print(f"storm: {storm_args} per subject ...")
        rows += await storm.run_storm(url, subjects=subjects, prefix=prefix, **storm_args)
    if "crash" in args.only:
        print(
            f"crash: a storm of {args.crash_messages}, all subjects at once, kill -9 after "
            f"{args.kill_after} s, restart ..."
        )
        rows += await storm.run_crash(
            url,
            subjects=subjects,
            prefix=prefix,
            kill_after=args.kill_after,
            grace=args.crash_grace,
            messages=args.crash_messages,
            fail=args.storm_fail,
            base=args.storm_base,
        )
    if "long-delay" in args.only:
        print(
            f"long-delay: {args.long_delay} s backoffs, consumer_timeout "
            f"{args.long_consumer_timeout} s (a second private node) ..."
        )
        rows += await storm.run_long_delay(
            subjects=subjects,
            messages=args.long_messages,
            delay=args.long_delay,
            consumer_timeout=args.long_consumer_timeout,
            grace=args.long_grace,
            prefix=prefix,
            url=args.long_url,
        )
    if "peer-precision" in args.only:
        peers_here = tuple(p for p in peer_precision.SUBJECTS if p in subjects)
        print(f"peer-precision: {args.peer_precision_seconds} s at 100 msg/s for {peers_here} ...")
        rows += await asyncio.to_thread(
            peer_precision.run,
            url,
            rate=100,
            seconds=args.peer_precision_seconds,
            min_delay=args.min_delay,
            max_delay=args.max_delay,
            subjects=peers_here,
        )
    if {"peer-success", "storm", "crash", "peer-precision"} & set(args.only):
        await storm.delete_peer_topology(url, prefix)
    return rows


async def _delete_topology(url: str, topology: DelayTopology) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await throughput.delete_topology(channel, topology)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a few minutes)")
    parser.add_argument("--url", help="use this broker instead of starting a private node")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=WORKLOADS,
        default=[w for w in WORKLOADS if w not in OPT_IN],
        help=f"workloads to run (default: all but {', '.join(OPT_IN)})",
    )
    parser.add_argument("--messages", type=int, help="messages per throughput measurement")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per subject (median kept)")
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 1000])
    parser.add_argument("--precision-seconds", type=float, help="seconds of scheduling per rate")
    parser.add_argument("--min-delay", type=float, default=0.5)
    parser.add_argument("--max-delay", type=float, default=3.0)
    parser.add_argument(
        "--side-rate",
        type=float,
        default=100.0,
        help="plain messages/s published and consumed beside each precision stream (0: none)",
    )
    parser.add_argument("--levels", type=int, default=36, help="precision topology levels")
    parser.add_argument("--unit-ms", type=int, default=1, help="precision topology unit")
    parser.add_argument("--consumer-timeout-ms", type=int, default=60_000)
    parser.add_argument("--capacity-messages", type=int, default=100_000)
    parser.add_argument("--capacity-baseline", type=int, help="default: min(messages, 50,000)")
    parser.add_argument("--capacity-drain", type=int, help="default: min(messages, 50,000)")
    parser.add_argument("--capacity-window", type=int, default=1000, help="publishes in flight")
    parser.add_argument(
        "--capacity-drain-level",
        type=int,
        default=18,
        help="the drained messages wait 2^level units (18: 262 s); longer than the fill's tail",
    )
    parser.add_argument(
        "--capacity-publish-delayed",
        action="store_true",
        help="fill with publish_delayed on aio-pika (slower) instead of the batched bulk path",
    )
    parser.add_argument(
        "--capacity-memory-policy",
        action="store_true",
        help="set the chain's max-in-memory-length operator policy first (RabbitMQ 3.10-3.11)",
    )
    peers = parser.add_argument_group("storm, crash, long-delay, peer-precision")
    peers.add_argument(
        "--peer-subjects", nargs="+", choices=PEER_SUBJECTS, default=list(PEER_SUBJECTS)
    )
    peers.add_argument("--success-messages", type=int, help="messages per peer-success subject")
    peers.add_argument("--storm-messages", type=int, help="messages per storm subject")
    peers.add_argument("--storm-fail", type=int, default=2, help="failures before success")
    peers.add_argument(
        "--storm-base", type=float, default=1.0, help="first backoff, s (Celery: whole s, >= 1)"
    )
    peers.add_argument("--kill-after", type=float, default=1.5, help="crash: s after first call")
    peers.add_argument("--crash-messages", type=int, help="messages per crash subject")
    peers.add_argument("--crash-grace", type=float, help="crash: s to wait beyond the backoffs")
    peers.add_argument("--long-delay", type=float, help="long-delay: the backoff, s")
    peers.add_argument("--long-consumer-timeout", type=float, help="long-delay: s, < the delay")
    peers.add_argument("--long-messages", type=int, default=20)
    peers.add_argument("--long-grace", type=float, default=20.0)
    peers.add_argument("--long-url", help="long-delay: a broker already set that way")
    peers.add_argument("--peer-precision-seconds", type=float)
    parser.add_argument(
        "--broker-cost-rates", type=float, nargs="+", default=[300, 1000], help="broker-cost"
    )
    parser.add_argument(
        "--broker-cost-seconds", type=float, help="broker-cost: s per stream (5; --quick: 3)"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    args.success_messages = args.success_messages or (1000 if args.quick else 5000)
    args.storm_messages = args.storm_messages or (100 if args.quick else 1000)
    args.crash_messages = args.crash_messages or (100 if args.quick else 300)
    args.crash_grace = args.crash_grace or (30.0 if args.quick else 60.0)
    args.long_delay = args.long_delay or (8.0 if args.quick else 20.0)
    args.long_consumer_timeout = args.long_consumer_timeout or (4.0 if args.quick else 10.0)
    args.peer_precision_seconds = args.peer_precision_seconds or (3.0 if args.quick else 10.0)
    args.messages = args.messages or (1000 if args.quick else 5000)
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.precision_seconds = args.precision_seconds or (3.0 if args.quick else 10.0)

    node = None
    url = args.url
    if url is None:
        node = RabbitMQNode(config={"consumer_timeout": str(args.consumer_timeout_ms)})
        print("starting a private RabbitMQ node ...")
        node.start()
        url = node.url
    try:
        started = time.monotonic()
        version = asyncio.run(_server_version(url))
        rows = asyncio.run(_run(url, args, node.beam_pid if node else None, node))
        elapsed = time.monotonic() - started
    finally:
        if node is not None:
            node.close()
    meta = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "rabbitmq": version,
        "broker": "private node" if node is not None else "given URL",
        "machine": _machine(),
        "aio_pika": aio_pika.__version__,
        "parameters": _parameters(args),
        "seconds": round(elapsed, 1),
    }
    # The results first: nothing printed after a run of many minutes may lose it.
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report.write_json(stem.with_suffix(".json"), meta, rows)
    print()
    print(f"RabbitMQ {version}; {meta['machine']}; {elapsed:.0f} s")
    print(report.table(rows))
    print(precision.details(rows))
    print(hops.details(rows))
    print(hop_anatomy.details(rows))
    report.plot(stem.with_suffix(".png"), meta, rows)
    print(f"wrote {stem}.json and {stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
