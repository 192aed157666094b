"""What a new connection costs the broker to declare a delay chain that is already complete.

Two ways, interleaved (which goes first alternates by round), on one chain
(36 levels by default, 702 bindings) declared once beforehand:

- ``full``: every exchange, queue and binding declared again, as each new
  connection did before the chain's marker (``declare_topology(repair=True)``,
  which the ``delayed-retry declare`` command still does);
- ``check``: what a new connection does now: passive declarations of the
  chain's exchanges and queues and of its marker, in one round trip, and no
  binding (``declare_topology``).

Each sample declares on ``--batch`` connections opened beforehand, one after
the other, and reads the broker's CPU time (its Erlang VM, from ``/proc``;
a tick is 10 ms, hence batches) and the wall-clock time around them. Columns,
per connection: the medians over ``--rounds`` samples, and ``check/full``.
Ratios are the claim; absolute figures move with the machine's load.

Run: ``.venv/bin/python benchmarks/chain_declaration.py`` (a private 3.10 node),
``--version 4.3`` (a private 4.3.6 node in a chroot), or ``--url URL`` (a
broker of yours; wall-clock only, as its CPU cannot be read).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from typing import Any

import aio_pika
from throughput import broker_cpu_seconds

from delayed_retry import DelayTopology, declare_topology
from delayed_retry.chain_digest import markers
from harness import RabbitMQNode


async def _sample(
    url: str, topology: DelayTopology, *, full: bool, batch: int, broker_pid: int | None
) -> tuple[float, float]:
    """Wall-clock and broker CPU seconds per connection, declaring on ``batch`` new ones."""
    connections = [await aio_pika.connect(url) for _ in range(batch)]
    try:
        channels = [await connection.channel() for connection in connections]
        cpu = broker_cpu_seconds(broker_pid)
        started = time.perf_counter()
        for channel in channels:
            await declare_topology(channel, topology, repair=full)
        wall = time.perf_counter() - started
        cpu = broker_cpu_seconds(broker_pid) - cpu
    finally:
        for connection in connections:
            await connection.close()
    return wall / batch, cpu / batch


async def _delete(url: str, topology: DelayTopology) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for spec in topology.queues():
            await channel.queue_delete(spec.name)
        for exchange in [*(e.name for e in topology.exchanges()), *markers(topology)]:
            await channel.exchange_delete(exchange)


async def run(
    url: str, *, levels: int, rounds: int, batch: int, broker_pid: int | None
) -> dict[str, Any]:
    """Declare a chain once, then ``rounds`` interleaved samples of each way; medians."""
    topology = DelayTopology(prefix=f"bench-declare-{secrets.token_hex(3)}", levels=levels)
    samples: dict[str, list[tuple[float, float]]] = {"full": [], "check": []}
    try:
        connection = await aio_pika.connect(url)
        async with connection:
            await declare_topology(await connection.channel(), topology)
        for n in range(rounds):
            order = ("full", "check") if n % 2 == 0 else ("check", "full")
            for kind in order:
                samples[kind].append(
                    await _sample(
                        url, topology, full=kind == "full", batch=batch, broker_pid=broker_pid
                    )
                )
    finally:
        await _delete(url, topology)
    out: dict[str, Any] = {
        "levels": levels,
        # What a full declaration sends: every binding, and an unbind per retired one.
        "binding_methods_full": sum(len(s.bindings) for s in topology.queues())
        + len(topology.exchange_bindings())
        + len(topology.retired_bindings()),
        "rounds": rounds,
        "batch": batch,
    }
    for kind, values in samples.items():
        out[f"{kind}_wall_ms"] = round(statistics.median(v[0] for v in values) * 1000, 2)
        if broker_pid is not None:
            out[f"{kind}_broker_cpu_ms"] = round(statistics.median(v[1] for v in values) * 1000, 2)
    out["wall_check_over_full"] = round(out["check_wall_ms"] / out["full_wall_ms"], 3)
    if broker_pid is not None and out["full_broker_cpu_ms"]:
        out["broker_cpu_check_over_full"] = round(
            out["check_broker_cpu_ms"] / out["full_broker_cpu_ms"], 3
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a broker of yours (wall-clock only)")
    parser.add_argument("--version", help="RabbitMQ version of the private node (3.10, 4.3)")
    parser.add_argument("--levels", type=int, default=36)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--batch", type=int, default=10)
    args = parser.parse_args(argv)
    options = {"levels": args.levels, "rounds": args.rounds, "batch": args.batch}
    if args.url:
        result = asyncio.run(run(args.url, broker_pid=None, **options))
    else:
        with RabbitMQNode(version=args.version) as node:
            result = asyncio.run(run(node.url, broker_pid=node.beam_pid, **options))
        result["broker"] = args.version or "3.10"
    json.dump(result, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
