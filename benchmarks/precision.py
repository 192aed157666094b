"""Precision: how late (or early) delayed messages reach the handler.

A producer schedules messages with :func:`delayed_retry.publish_delayed` at a
fixed rate, each with a delay drawn uniformly from ``[min_delay, max_delay]``;
a ``@with_delayed_retry`` handler records ``arrival - due`` for each (the
handler's view, after any early-arrival correction the middleware makes).
The baseline is the same stream published with no delay to the same queue
(publish→handler latency of a plain aio-pika consumer): the part of the
lateness no delay mechanism can remove. Ratios are p99 lateness / baseline p99.

Two delayed-retry subjects: with a hold (``publish_delayed(hold=DEFAULT_HOLD)``,
the message leaves the chain a few ms early and the handler holds it until due)
and without (``hold=None``: the chain rounds up and the handler takes what comes).
Each row also reports the mean number of TTL hops a message made. ``side_rate``
adds a light load beside every stream, baseline included: plain messages
published and consumed on a queue of their own at that rate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import throughput
from aio_pika.abc import AbstractIncomingMessage
from workloads import Row, Suite

from delayed_retry import (
    DEFAULT_HOLD,
    DelayTopology,
    Hold,
    consume,
    declare_topology,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.recovery.hold import chain_units


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    if not ordered:
        return {"p50": float("nan"), "p99": float("nan"), "max": float("nan"), "min": 0.0}

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50": round(pick(0.50), 2),
        "p99": round(pick(0.99), 2),
        "max": round(ordered[-1], 2),
        "min": round(ordered[0], 2),
    }


async def paced(rate: float, total: int) -> AsyncIterator[int]:
    """``0 .. total - 1``, each when it is due on the schedule: ``i`` at start + ``i / rate``."""
    started = time.monotonic()
    for i in range(total):
        pause = started + i / rate - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        yield i


async def _stream(
    connection: aio_pika.abc.AbstractConnection,
    topology: DelayTopology,
    *,
    rate: float,
    seconds: float,
    min_delay: float,
    max_delay: float,
    delayed: bool,
    hold: Hold | None = None,
    hops: list[int] | None = None,
) -> list[float]:
    """Lateness in ms of each message of one stream (delay 0 and plain consumer if not delayed).

    ``hops`` collects the number of TTL queues each delayed message waits in.
    """
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=200)
    name = f"bench-precision-{uuid.uuid4().hex[:8]}"
    queue = await channel.declare_queue(name, durable=True)
    due: dict[str, float] = {}
    late: list[float] = []
    total = int(rate * seconds)
    done = asyncio.Event()

    def record(message_id: str | None) -> None:
        arrived = time.time()
        late.append((arrived - due.pop(message_id or "")) * 1000)
        if len(late) == total:
            done.set()

    if delayed:

        async def handler(message: AbstractIncomingMessage) -> None:
            record(message.message_id)

        tag = await consume(queue, with_delayed_retry(topology=topology, hold=hold)(handler))
    else:

        async def plain(message: AbstractIncomingMessage) -> None:
            record(message.message_id)
            await message.ack()

        tag = await queue.consume(plain)

    publisher = await connection.channel()
    rng = random.Random(7)
    pending: set[asyncio.Task[Any]] = set()
    async for i in paced(rate, total):
        delay = rng.uniform(min_delay, max_delay) if delayed else 0.0
        message_id = str(i)
        message = aio_pika.Message(
            b"x" * 200, message_id=message_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
        )
        if delayed:
            now = datetime.now(UTC)
            due_at = now + timedelta(seconds=delay)
            due[message_id] = due_at.timestamp()
            if hops is not None:
                hops.append(chain_units(topology, due_at, now=now, hold=hold).bit_count())
            task = asyncio.create_task(
                publish_delayed(
                    publisher,
                    message,
                    queue=name,
                    delay=due_at,
                    topology=topology,
                    hold=hold,
                    now=now,
                )
            )
        else:
            due[message_id] = time.time()
            task = asyncio.create_task(
                publisher.default_exchange.publish(message, routing_key=name)
            )
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    await asyncio.wait_for(done.wait(), timeout=max_delay + 120)
    await queue.cancel(tag)
    await queue.delete(if_unused=False, if_empty=False)
    await channel.queue_delete(f"{name}.parking")
    await publisher.close()
    await channel.close()
    return late


SUBJECTS: tuple[tuple[str, Hold | None], ...] = (
    ("delayed-retry (held)", DEFAULT_HOLD),
    ("delayed-retry, no hold", None),
)


class SideLoad:
    """Plain publish→consume traffic on a queue of its own, at a fixed rate, while in use."""

    def __init__(self, connection: aio_pika.abc.AbstractConnection, rate: float) -> None:
        self._connection = connection
        self._rate = rate
        self._task: asyncio.Task[None] | None = None
        self.sent = 0

    async def __aenter__(self) -> SideLoad:
        if self._rate > 0:
            self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        channel = await self._connection.channel()
        queue = await channel.declare_queue(f"bench-side-{uuid.uuid4().hex[:8]}", exclusive=True)

        async def ack(message: AbstractIncomingMessage) -> None:
            # The side load stops by closing its channel; a message in flight then finds it
            # closed, and its ack no longer matters.
            with contextlib.suppress(aio_pika.exceptions.ChannelInvalidStateError):
                await message.ack()

        await queue.consume(ack)
        started = time.monotonic()
        try:
            while True:
                pause = started + self.sent / self._rate - time.monotonic()
                if pause > 0:
                    await asyncio.sleep(pause)
                await channel.default_exchange.publish(aio_pika.Message(b"s" * 200), queue.name)
                self.sent += 1
        finally:
            await asyncio.shield(channel.close())


async def run(
    url: str,
    *,
    rates: tuple[float, ...],
    seconds: float,
    min_delay: float,
    max_delay: float,
    topology: DelayTopology,
    side_rate: float = 0.0,
) -> list[dict[str, Any]]:
    rows = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        for rate in rates:
            stream = {"rate": rate, "seconds": seconds, "min_delay": min_delay}
            stream["max_delay"] = max_delay
            async with SideLoad(connection, side_rate):
                base = await _stream(connection, topology, delayed=False, **stream)
            b = _percentiles(base)
            for subject, hold in SUBJECTS:
                hops: list[int] = []
                async with SideLoad(connection, side_rate):
                    late = await _stream(
                        connection, topology, delayed=True, hold=hold, hops=hops, **stream
                    )
                s = _percentiles(late)
                rows.append(
                    {
                        "workload": f"precision {rate:g}/s",
                        "subject": subject,
                        "baseline": "plain publish→consume, no delay",
                        "unit": "ms late (p99)",
                        "value": s["p99"],
                        "baseline_value": b["p99"],
                        "ratio": round(s["p99"] / b["p99"], 2) if b["p99"] > 0 else None,
                        "lateness_ms": s,
                        "baseline_lateness_ms": b,
                        "never_early": s["min"] >= 0,
                        "messages": len(late),
                        "hops_per_message": round(sum(hops) / max(len(hops), 1), 2),
                        "hold": repr(hold),
                        "side_load_per_s": side_rate,
                        "topology": {
                            "levels": topology.levels,
                            "unit_ms": topology.unit_ms,
                            "queue_type": topology.queue_type,
                        },
                    }
                )
        await channel.close()
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--side-rate",
        type=float,
        default=100.0,
        help="precision: plain messages/s published and consumed beside each stream (0: none)",
    )


def suite_topology(suite: Suite, workload: str) -> DelayTopology:
    """The chain of a precision or hops run: ``--levels`` of ``--unit-ms``, a fresh prefix."""
    return DelayTopology(
        prefix=f"bench-{workload}-{int(time.time())}",
        levels=suite.args.levels,
        unit=timedelta(milliseconds=suite.args.unit_ms),
    )


async def precision(suite: Suite) -> list[Row]:
    """The ``precision`` workload: held and unheld lateness at each of ``--rates``."""
    args = suite.args
    print(f"precision: {args.precision_seconds} s at each of {args.rates} msg/s ...")
    topology = suite_topology(suite, "precision")
    rows = await run(
        suite.url,
        rates=tuple(args.rates),
        seconds=args.precision_seconds,
        min_delay=args.min_delay,
        max_delay=args.max_delay,
        topology=topology,
        side_rate=args.side_rate,
    )
    await throughput.delete_topology_at(suite.url, topology)
    return rows


def details(rows: list[dict[str, Any]]) -> str:
    """One line per precision row: p50/p99/max/earliest lateness and hops per message."""
    lines = []
    for row in rows:
        if "lateness_ms" not in row or "hops_per_message" not in row:
            continue  # not a precision row (peer precision rows have no hops)
        s, b = row["lateness_ms"], row["baseline_lateness_ms"]
        lines.append(
            f"{row['workload']:<16} {row['subject']:<24} late ms p50 {s['p50']:g} "
            f"p99 {s['p99']:g} max {s['max']:g} earliest {s['min']:g}; "
            f"hops/msg {row['hops_per_message']:g}; never early: {row['never_early']}; "
            f"baseline p50 {b['p50']:g} p99 {b['p99']:g}"
        )
    return "\n".join(lines)
