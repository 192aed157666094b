"""How late the chain lets a message out, by the number of TTL hops it made.

The basis of :class:`delayed_retry.Hold`'s lead: messages are scheduled with
``publish_delayed`` at a fixed rate (delays uniform in ``[min_delay,
max_delay]``) with a hold whose lead is zero, so each leaves the chain at its
planned exit (the due time rounded down to the granularity) plus whatever the
hops add. A plain aio-pika consumer (no holding) records ``arrival - planned
exit`` for each, grouped by how many level queues the message waited in. The
baseline is the publish→consume latency of the same consumer with no delay
(:func:`precision._stream`), measured in the same run.

If the lateness grows with the hops, the lead should too (``lead_per_hop``);
its p99 per hop is what ``lead_per_hop`` must cover.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import precision
import throughput
from aio_pika.abc import AbstractIncomingMessage
from workloads import Row, Suite

from delayed_retry import DelayTopology, Hold, declare_topology, publish_delayed
from delayed_retry.recovery.hold import chain_units

ZERO_LEAD = Hold(lead=0, lead_per_hop=0)


async def _exits(
    connection: aio_pika.abc.AbstractConnection,
    topology: DelayTopology,
    *,
    rate: float,
    seconds: float,
    min_delay: float,
    max_delay: float,
) -> dict[int, list[float]]:
    """Lateness in ms of each message's exit from the chain, by its number of hops."""
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=500)
    queue = await channel.declare_queue(f"bench-hops-{uuid.uuid4().hex[:8]}", durable=True)
    plan: dict[str, tuple[float, int]] = {}
    late: dict[int, list[float]] = {}
    total = int(rate * seconds)
    done = asyncio.Event()
    seen = 0

    async def on_message(message: AbstractIncomingMessage) -> None:
        nonlocal seen
        arrived = time.time()
        exit_at, hops = plan.pop(message.message_id or "")
        late.setdefault(hops, []).append((arrived - exit_at) * 1000)
        await message.ack()
        seen += 1
        if seen == total:
            done.set()

    tag = await queue.consume(on_message)
    publisher = await connection.channel()
    rng = random.Random(11)
    pending: set[asyncio.Task[Any]] = set()
    async for i in precision.paced(rate, total):
        now = datetime.now(UTC)
        due_at = now + timedelta(seconds=rng.uniform(min_delay, max_delay))
        units = chain_units(topology, due_at, now=now, hold=ZERO_LEAD)
        plan[str(i)] = (now.timestamp() + units * topology.unit_ms / 1000, units.bit_count())
        task = asyncio.create_task(
            publish_delayed(
                publisher,
                aio_pika.Message(b"x" * 200, message_id=str(i)),
                queue=queue.name,
                delay=due_at,
                topology=topology,
                hold=ZERO_LEAD,
                now=now,
            )
        )
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    await asyncio.wait_for(done.wait(), timeout=max_delay + 120)
    await queue.cancel(tag)
    await queue.delete(if_unused=False, if_empty=False)
    await publisher.close()
    await channel.close()
    return late


async def run(
    url: str,
    *,
    rates: tuple[float, ...],
    seconds: float,
    min_delay: float,
    max_delay: float,
    topology: DelayTopology,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        for rate in rates:
            base = precision._percentiles(
                await precision._stream(
                    connection,
                    topology,
                    rate=rate,
                    seconds=seconds,
                    min_delay=min_delay,
                    max_delay=max_delay,
                    delayed=False,
                )
            )
            by_hops = await _exits(
                connection,
                topology,
                rate=rate,
                seconds=seconds,
                min_delay=min_delay,
                max_delay=max_delay,
            )
            for hops in sorted(by_hops):
                s = precision._percentiles(by_hops[hops])
                rows.append(
                    {
                        "workload": f"chain exit {rate:g}/s",
                        "subject": f"{hops} hop(s)",
                        "baseline": "plain publish→consume, no delay",
                        "unit": "ms after planned exit (p99)",
                        "value": s["p99"],
                        "baseline_value": base["p99"],
                        "ratio": None,
                        "exit_lateness_ms": s,
                        "baseline_lateness_ms": base,
                        "messages": len(by_hops[hops]),
                    }
                )
        await channel.close()
    return rows


async def hops(suite: Suite) -> list[Row]:
    """The ``hops`` workload: chain exit lateness by hops (the first rate with --quick)."""
    args = suite.args
    print(f"hops: chain exit lateness by hops, {args.precision_seconds} s at {args.rates} ...")
    topology = precision.suite_topology(suite, "hops")
    rows = await run(
        suite.url,
        rates=tuple(args.rates[:1]) if suite.quick else tuple(args.rates),
        seconds=args.precision_seconds,
        min_delay=args.min_delay,
        max_delay=args.max_delay,
        topology=topology,
    )
    await throughput.delete_topology_at(suite.url, topology)
    return rows


def details(rows: list[dict[str, Any]]) -> str:
    """One line per hop count: p50/p99/max exit lateness."""
    lines = []
    for row in rows:
        if "exit_lateness_ms" not in row:
            continue
        s = row["exit_lateness_ms"]
        lines.append(
            f"{row['workload']:<18} {row['subject']:<10} n {row['messages']:>5}  exit late ms "
            f"p50 {s['p50']:g} p99 {s['p99']:g} max {s['max']:g} "
            f"(baseline p50 {row['baseline_lateness_ms']['p50']:g} "
            f"p99 {row['baseline_lateness_ms']['p99']:g})"
        )
    return "\n".join(lines)
