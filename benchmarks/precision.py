"""Precision: how late (or early) delayed messages reach the handler.

A producer schedules messages with :func:`delayed_retry.publish_delayed` at a
fixed rate, each with a delay drawn uniformly from ``[min_delay, max_delay]``;
a ``@with_delayed_retry`` handler records ``arrival - due`` for each (the
handler's view, after any early-arrival correction the middleware makes).
The baseline is the same stream published with no delay to the same queue
(publish→handler latency of a plain aio-pika consumer): the part of the
lateness no delay mechanism can remove. Ratios are p99 lateness / baseline p99.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import (
    DelayTopology,
    consume,
    declare_topology,
    publish_delayed,
    with_delayed_retry,
)


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


async def _stream(
    connection: aio_pika.abc.AbstractConnection,
    topology: DelayTopology,
    *,
    rate: float,
    seconds: float,
    min_delay: float,
    max_delay: float,
    delayed: bool,
) -> list[float]:
    """Lateness in ms of each message of one stream (delay 0 and plain consumer if not delayed)."""
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

        tag = await consume(queue, with_delayed_retry(topology=topology)(handler))
    else:

        async def plain(message: AbstractIncomingMessage) -> None:
            record(message.message_id)
            await message.ack()

        tag = await queue.consume(plain)

    publisher = await connection.channel()
    rng = random.Random(7)
    started = time.monotonic()
    pending: set[asyncio.Task[Any]] = set()
    for i in range(total):
        # Keep to the schedule: message i leaves at started + i / rate.
        pause = started + i / rate - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        delay = rng.uniform(min_delay, max_delay) if delayed else 0.0
        message_id = str(i)
        message = aio_pika.Message(
            b"x" * 200, message_id=message_id, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
        )
        if delayed:
            now = datetime.now(UTC)
            due_at = now + timedelta(seconds=delay)
            due[message_id] = due_at.timestamp()
            task = asyncio.create_task(
                publish_delayed(publisher, message, queue=name, delay=due_at, topology=topology)
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


async def run(
    url: str,
    *,
    rates: tuple[float, ...],
    seconds: float,
    min_delay: float,
    max_delay: float,
    topology: DelayTopology,
) -> list[dict[str, Any]]:
    rows = []
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        for rate in rates:
            base = await _stream(
                connection,
                topology,
                rate=rate,
                seconds=seconds,
                min_delay=min_delay,
                max_delay=max_delay,
                delayed=False,
            )
            late = await _stream(
                connection,
                topology,
                rate=rate,
                seconds=seconds,
                min_delay=min_delay,
                max_delay=max_delay,
                delayed=True,
            )
            b = _percentiles(base)
            s = _percentiles(late)
            rows.append(
                {
                    "workload": f"precision {rate:g}/s",
                    "subject": "delayed-retry",
                    "baseline": "plain publish→consume, no delay",
                    "unit": "ms late (p99)",
                    "value": s["p99"],
                    "baseline_value": b["p99"],
                    "ratio": round(s["p99"] / b["p99"], 2) if b["p99"] > 0 else None,
                    "lateness_ms": s,
                    "baseline_lateness_ms": b,
                    "never_early": s["min"] >= 0,
                    "messages": len(late),
                    "topology": {
                        "levels": topology.levels,
                        "unit_ms": topology.unit_ms,
                        "queue_type": topology.queue_type,
                    },
                }
            )
        await channel.close()
    return rows
