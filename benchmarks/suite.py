"""The benchmark suite: delayed-retry beside its baselines and peers, on a private broker.

Run it with ``benchmarks/run`` (``--quick`` for a run of a few minutes, ``--list`` for the
workloads, ``--only NAME ...`` for some of them). It starts a private RabbitMQ node (so
it can set ``consumer_timeout`` and does not load the machine's shared broker), runs each
workload of :mod:`workloads`, prints a table, and writes ``benchmarks/results/<time>.json``
and ``.png`` with the RabbitMQ version, the machine and every parameter. Every figure is
also a ratio to a baseline measured in the same run: absolute numbers on a shared machine
move from run to run, ratios much less.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import report
import workloads
from workloads import Row, Suite, Workload

import delayed_retry
from harness import RabbitMQNode


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


def _parser() -> argparse.ArgumentParser:
    names = [w.name for w in workloads.WORKLOADS]
    opt_in = [w.name for w in workloads.WORKLOADS if not w.default]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run (a few minutes)")
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--url", help="use this broker instead of starting a private node")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=names,
        metavar="WORKLOAD",
        default=[w.name for w in workloads.WORKLOADS if w.default],
        help=f"workloads to run, of {', '.join(names)} (default: all but {', '.join(opt_in)})",
    )
    common = parser.add_argument_group("shared by several workloads")
    common.add_argument("--messages", type=int, help="messages per throughput measurement")
    common.add_argument("--rounds", type=int, help="interleaved rounds per subject (median kept)")
    common.add_argument("--rates", type=float, nargs="+", default=[100, 1000])
    common.add_argument("--precision-seconds", type=float, help="seconds of scheduling per rate")
    common.add_argument("--min-delay", type=float, default=0.5)
    common.add_argument("--max-delay", type=float, default=3.0)
    common.add_argument("--levels", type=int, default=36, help="precision and hops: levels")
    common.add_argument("--unit-ms", type=int, default=1, help="precision and hops: unit")
    common.add_argument("--consumer-timeout-ms", type=int, default=60_000)
    common.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    for module in workloads.modules():
        add_arguments = getattr(module, "add_arguments", None)
        if add_arguments is not None:
            add_arguments(parser)
    return parser


def _listing() -> str:
    width = max(len(w.name) for w in workloads.WORKLOADS)
    lines = []
    for w in workloads.WORKLOADS:
        when = "" if w.default else " (opt-in)"
        lines.append(f"{w.name:<{width}}  {w.summary}{when}")
    return "\n".join(lines)


async def _run(suite: Suite, chosen: list[Workload]) -> list[Row]:
    rows: list[Row] = []
    for workload in chosen:
        rows += await workload.load()(suite)
    return rows


def _details(rows: list[Row], chosen: list[Workload]) -> list[str]:
    out = []
    for module in dict.fromkeys(w.module for w in chosen):
        details = getattr(sys.modules[module], "details", None)
        text = details(rows) if details is not None else ""
        if text:
            out.append(text)
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.list:
        print(_listing())
        return 0
    args.messages = args.messages or (1000 if args.quick else 5000)
    args.rounds = args.rounds or (2 if args.quick else 3)
    args.precision_seconds = args.precision_seconds or (3.0 if args.quick else 10.0)
    chosen = [w for w in workloads.WORKLOADS if w.name in args.only]

    node = None
    url = args.url
    if url is None and any(w.suite_broker for w in chosen):
        node = RabbitMQNode(config={"consumer_timeout": str(args.consumer_timeout_ms)})
        print("starting a private RabbitMQ node ...")
        node.start()
        url = node.url
    try:
        started = time.monotonic()
        version = asyncio.run(_server_version(url)) if url is not None else "(none shared)"
        suite = Suite(args=args, url=url or "", node=node)
        rows = asyncio.run(_run(suite, chosen))
        elapsed = time.monotonic() - started
    finally:
        if node is not None:
            node.close()
    meta: dict[str, Any] = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "rabbitmq": version,
        "broker": "private node" if node is not None else ("given URL" if url else "none shared"),
        "machine": _machine(),
        "aio_pika": aio_pika.__version__,
        "library": delayed_retry.__file__,
        "parameters": {k: v for k, v in vars(args).items() if k != "out"},
        "seconds": round(elapsed, 1),
    }
    # The results first: nothing printed after a run of many minutes may lose it.
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    report.write_json(stem.with_suffix(".json"), meta, rows)
    print()
    print(f"RabbitMQ {version}; {meta['machine']}; {elapsed:.0f} s")
    print(report.table(rows))
    for text in _details(rows, chosen):
        print(text)
    report.plot(stem.with_suffix(".png"), meta, rows)
    print(f"wrote {stem}.json and {stem}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
