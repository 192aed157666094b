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
import overhead
import precision
import report
import throughput

from delayed_retry import DelayTopology
from delayed_retry.testing import RabbitMQNode

WORKLOADS = ("overhead", "throughput", "precision", "peers")


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


async def _run(url: str, args: argparse.Namespace, broker_pid: int | None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if "overhead" in args.only:
        print("overhead: the success path's own CPU cost, no broker ...")
        rows += await asyncio.to_thread(overhead.run, repeats=5 if args.quick else 15)
    if "throughput" in args.only:
        print(f"throughput: {args.messages} messages x {args.rounds} rounds per subject ...")
        rows += await throughput.run(
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
        )
        await _delete_topology(url, topology)
    if "peers" in args.only:
        import peers

        print("peers ...")
        rows += await peers.run(
            url, messages=args.messages, rounds=args.rounds, broker_pid=broker_pid
        )
    return rows


async def _delete_topology(url: str, topology: DelayTopology) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await throughput._delete_topology(channel, topology)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a few minutes)")
    parser.add_argument("--url", help="use this broker instead of starting a private node")
    parser.add_argument("--only", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    parser.add_argument("--messages", type=int, help="messages per throughput measurement")
    parser.add_argument("--rounds", type=int, help="interleaved rounds per subject (median kept)")
    parser.add_argument("--rates", type=float, nargs="+", default=[100, 1000])
    parser.add_argument("--precision-seconds", type=float, help="seconds of scheduling per rate")
    parser.add_argument("--min-delay", type=float, default=0.5)
    parser.add_argument("--max-delay", type=float, default=3.0)
    parser.add_argument("--levels", type=int, default=36, help="precision topology levels")
    parser.add_argument("--unit-ms", type=int, default=1, help="precision topology unit")
    parser.add_argument("--consumer-timeout-ms", type=int, default=60_000)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    args.messages = args.messages or (1500 if args.quick else 10_000)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.precision_seconds = args.precision_seconds or (4.0 if args.quick else 20.0)

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
        rows = asyncio.run(_run(url, args, node.beam_pid if node else None))
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
    print()
    print(f"RabbitMQ {version}; {meta['machine']}; {elapsed:.0f} s")
    print(report.table(rows))
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report.write_json(stem.with_suffix(".json"), meta, rows)
    report.plot(stem.with_suffix(".png"), meta, rows)
    print(f"wrote {stem}.json and {stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
