"""Throughput workloads: the success path and one retry, each beside its baseline.

Every subject consumes the same number of persistent 200-byte messages from a
fresh classic queue on the same broker, prefetch 100, and the rate is
messages finished per second. Pairs (subject / baseline) are measured
interleaved, round after round, and the median of each is kept, so drift on a
shared machine hits both alike.

* ``success``: ``@with_delayed_retry`` handler that succeeds / plain aio-pika
  handler that acks.
* ``retry-0hop``: every message fails once and is retried with zero delay
  (delayed-retry routes it through the level exchanges straight back: no
  queue hop) / a hand-rolled "publish a confirmed copy to the queue, then ack".
* ``retry-1hop``: every message fails once and is retried after 1 ms (one
  quorum TTL hop with at-least-once dead-lettering) / the hand-rolled
  equivalent: publish a confirmed copy into a quorum queue with a 1 ms TTL
  dead-lettering at-least-once back to the queue, then ack.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from delayed_retry import DelayTopology, NoInstrumentation, RetryAfter, consume, with_delayed_retry

PREFETCH = 100
BODY = b"x" * 200
RETRIED = "x-bench-retried"

Consumer = Callable[[AbstractQueue, Callable[[], None]], Awaitable[str]]
"""Start consuming ``queue``; call ``finished()`` once per message handled for good."""


@dataclass(frozen=True)
class Pair:
    """A subject and the baseline it is divided by."""

    workload: str
    subject: str
    baseline: str


PAIRS = (
    Pair("success", "delayed-retry", "plain aio-pika"),
    Pair("success", "delayed-retry, no telemetry", "plain aio-pika"),
    Pair("retry-0hop", "delayed-retry", "hand-rolled publish+ack, classic"),
    Pair("retry-1hop", "delayed-retry", "hand-rolled 1 quorum TTL hop"),
)


async def _publish(channel: AbstractChannel, queue: str, n: int) -> None:
    pending = []
    for i in range(n):
        message = aio_pika.Message(
            BODY, message_id=str(i), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
        )
        pending.append(channel.default_exchange.publish(message, routing_key=queue))
        if len(pending) == 500:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)


def plain() -> Consumer:
    async def start(queue: AbstractQueue, finished: Callable[[], None]) -> str:
        async def handler(message: AbstractIncomingMessage) -> None:
            await message.ack()
            finished()

        return await queue.consume(handler)

    return start


def decorated(
    topology: DelayTopology, *, fail_once_with: float | None, telemetry: bool = True
) -> Consumer:
    async def start(queue: AbstractQueue, finished: Callable[[], None]) -> str:
        seen: set[str | None] = set()

        async def handler(message: AbstractIncomingMessage) -> None:
            if fail_once_with is not None and message.message_id not in seen:
                seen.add(message.message_id)
                raise RetryAfter(fail_once_with)
            finished()

        options: dict[str, Any] = {"topology": topology}
        if not telemetry:
            options["instrumentation"] = NoInstrumentation()
        return await consume(queue, with_delayed_retry(**options)(handler))

    return start


def hand_rolled(*, via: str | None) -> Consumer:
    """Fail once, then publish a confirmed copy (to the queue or into ``via``) and ack."""

    async def start(queue: AbstractQueue, finished: Callable[[], None]) -> str:
        exchange = queue.channel.default_exchange  # type: ignore[attr-defined]

        async def handler(message: AbstractIncomingMessage) -> None:
            if message.headers.get(RETRIED):
                await message.ack()
                finished()
                return
            copy = aio_pika.Message(
                message.body,
                headers={**message.headers, RETRIED: 1},
                message_id=message.message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await exchange.publish(copy, routing_key=via or queue.name)
            await message.ack()

        return await queue.consume(handler)

    return start


async def measure(
    connection: aio_pika.abc.AbstractConnection,
    consumer: Consumer,
    n: int,
    *,
    hop_queue: bool = False,
    on_start: Callable[[], None] | None = None,
    on_end: Callable[[], None] | None = None,
) -> float:
    """Messages per second for ``consumer`` on a fresh queue of ``n`` messages."""
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=PREFETCH)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    queue = await channel.declare_queue(name, durable=True)
    hop = None
    if hop_queue:
        hop = await channel.declare_queue(
            f"{name}.hop",
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-message-ttl": 1,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": name,
                "x-dead-letter-strategy": "at-least-once",
                "x-overflow": "reject-publish",
            },
        )
    await _publish(channel, name, n)
    done = asyncio.Event()
    count = 0

    def finished() -> None:
        nonlocal count
        count += 1
        if count == n:
            done.set()

    if on_start is not None:
        on_start()
    start = time.perf_counter()
    tag = await consumer(queue, finished)
    await asyncio.wait_for(done.wait(), timeout=600)
    elapsed = time.perf_counter() - start
    if on_end is not None:
        on_end()
    await queue.cancel(tag)
    await queue.delete(if_unused=False, if_empty=False)
    if hop is not None:
        await hop.delete(if_unused=False, if_empty=False)
    await channel.queue_delete(f"{name}.parking")
    await channel.close()
    return n / elapsed


async def run(url: str, *, messages: int, rounds: int) -> list[dict[str, Any]]:
    """Every pair, interleaved over ``rounds``; one row per pair with medians and ratio."""
    topology = DelayTopology(prefix=f"bench-{uuid.uuid4().hex[:6]}", levels=16)
    subjects: dict[tuple[str, str], tuple[Consumer, bool]] = {
        ("success", "plain aio-pika"): (plain(), False),
        ("success", "delayed-retry"): (decorated(topology, fail_once_with=None), False),
        ("success", "delayed-retry, no telemetry"): (
            decorated(topology, fail_once_with=None, telemetry=False),
            False,
        ),
        ("retry-0hop", "hand-rolled publish+ack, classic"): (hand_rolled(via=None), False),
        ("retry-0hop", "delayed-retry"): (decorated(topology, fail_once_with=0), False),
        ("retry-1hop", "hand-rolled 1 quorum TTL hop"): (_via_hop(), True),
        ("retry-1hop", "delayed-retry"): (decorated(topology, fail_once_with=0.001), False),
    }
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in subjects}
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await topology.declare(channel)
        for _ in range(rounds):
            for key, (consumer, hop) in subjects.items():
                rates[key].append(await measure(connection, consumer, messages, hop_queue=hop))
        await _delete_topology(channel, topology)
    rows = []
    for pair in PAIRS:
        subject = statistics.median(rates[(pair.workload, pair.subject)])
        base = statistics.median(rates[(pair.workload, pair.baseline)])
        rows.append(
            {
                "workload": pair.workload,
                "subject": pair.subject,
                "baseline": pair.baseline,
                "unit": "msg/s",
                "value": round(subject, 1),
                "baseline_value": round(base, 1),
                "ratio": round(subject / base, 3),
                "samples": [round(r, 1) for r in rates[(pair.workload, pair.subject)]],
                "baseline_samples": [round(r, 1) for r in rates[(pair.workload, pair.baseline)]],
            }
        )
    return rows


def _via_hop() -> Consumer:
    """The hand-rolled one-hop consumer: its copy goes to ``<queue>.hop``."""

    async def start(queue: AbstractQueue, finished: Callable[[], None]) -> str:
        inner = hand_rolled(via=f"{queue.name}.hop")
        return await inner(queue, finished)

    return start


async def _delete_topology(channel: AbstractChannel, topology: DelayTopology) -> None:
    for spec in topology.queues():
        await channel.queue_delete(spec.name)
    for ex in reversed(topology.exchanges()):
        await channel.exchange_delete(ex.name)
