"""Throughput workloads: the success path and one retry, each beside its baseline.

Every subject consumes the same number of persistent 200-byte messages from a
fresh classic queue on the same broker, prefetch 100. Measured: messages
finished per second, and the CPU time per message of the client process and of
the broker's Erlang VM while consuming; the ratio is CPU cost, which a shared
machine disturbs far less than wall-clock time. Pairs (subject / baseline) are measured
interleaved in a new shuffled order each round, and the median of each is kept, so drift on a
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
import os
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue
from workloads import Row, Suite

from delayed_retry import (
    DelayTopology,
    NoInstrumentation,
    RetryAfter,
    consume,
    declare_topology,
    with_delayed_retry,
)
from delayed_retry.chain.digest import markers

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

        # hold=None: a 1 ms retry makes its one TTL hop, as the hand-rolled baseline does
        # (held, it would skip the chain and wait the millisecond in the consumer).
        options: dict[str, Any] = {"topology": topology, "hold": None}
        if not telemetry:
            options["instrumentation"] = NoInstrumentation()
        return await consume(queue, with_delayed_retry(**options)(handler))

    return start


Destination = Callable[[str], tuple[str, str]]
"""Where a hand-rolled copy for the queue named ``name`` goes: (exchange, routing key);
the exchange ``""`` is the default exchange."""

CopyHeaders = Callable[[AbstractIncomingMessage], Mapping[str, Any]]
"""The headers a hand-rolled copy of ``message`` carries, besides the marker :data:`RETRIED`."""


def to_queue(name: str) -> tuple[str, str]:
    """Straight back to the queue through the default exchange."""
    return "", name


def to_hop(name: str) -> tuple[str, str]:
    """Into the queue's hop queue (``measure(hop_queue=True)``), which dead-letters back."""
    return "", f"{name}.hop"


def own_headers(message: AbstractIncomingMessage) -> Mapping[str, Any]:
    """The delivered message's own headers, as a hand-rolled retry would copy them."""
    return message.headers


def hand_rolled(*, to: Destination = to_queue, headers: CopyHeaders = own_headers) -> Consumer:
    """Fail once, then publish a confirmed copy (``to`` its destination) and ack.

    Use ``to`` and ``headers`` to take a retry apart: the same handler sending
    the copy along another route, or carrying another copy's headers.
    """

    async def start(queue: AbstractQueue, finished: Callable[[], None]) -> str:
        channel = queue.channel
        name, key = to(queue.name)
        exchange = (
            channel.default_exchange
            if name == ""
            else await channel.get_exchange(name, ensure=False)
        )

        async def handler(message: AbstractIncomingMessage) -> None:
            if message.headers.get(RETRIED):
                await message.ack()
                finished()
                return
            copy = aio_pika.Message(
                message.body,
                headers={**headers(message), RETRIED: 1},
                message_id=message.message_id,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await exchange.publish(copy, routing_key=key)
            await message.ack()

        return await queue.consume(handler)

    return start


async def measure(
    connection: aio_pika.abc.AbstractConnection,
    consumer: Consumer,
    n: int,
    *,
    hop_queue: bool = False,
    declare: DelayTopology | None = None,
    on_start: Callable[[], None] | None = None,
    on_end: Callable[[], None] | None = None,
    broker_pid: int | None = None,
) -> Sample:
    """Rate and CPU cost of ``consumer`` on a fresh queue of ``n`` messages."""
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
    if declare is not None:
        # A consumer's first-use declarations (binding, parking queue) are set-up, not
        # per-message cost: make them before the clock starts.
        await declare_topology(channel, declare, queues=[name])
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
    cpu = time.process_time()
    broker = broker_cpu_seconds(broker_pid)
    tag = await consumer(queue, finished)
    await asyncio.wait_for(done.wait(), timeout=600)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    broker = broker_cpu_seconds(broker_pid) - broker
    if on_end is not None:
        on_end()
    await queue.cancel(tag)
    await queue.delete(if_unused=False, if_empty=False)
    if hop is not None:
        await hop.delete(if_unused=False, if_empty=False)
    await channel.queue_delete(f"{name}.parking")
    await channel.close()
    return Sample(n / elapsed, cpu / n * 1e6, broker / n * 1e6 if broker_pid else 0.0)


@dataclass(frozen=True)
class Sample:
    """One measurement: wall-clock rate, and CPU microseconds per message (client, broker)."""

    rate: float
    client_us: float
    broker_us: float

    @property
    def cost_us(self) -> float:
        return self.client_us + self.broker_us


def broker_cpu_seconds(pid: int | None) -> float:
    """CPU seconds (user + system) the broker's Erlang VM has used; 0 when not known."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # Fields 14 and 15 of stat (utime, stime), counted after the ")" closing the name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run(
    url: str, *, messages: int, rounds: int, broker_pid: int | None = None
) -> list[dict[str, Any]]:
    """Every pair, interleaved over ``rounds``; one row per pair with medians and ratios.

    ``ratio`` is the baseline's CPU cost per message (client, plus broker when
    ``broker_pid`` is given) over the subject's: what the rates would be on a
    machine where CPU is the limit, which on a shared machine varies far less
    than wall-clock rates (kept as ``wall_ratio``).
    """
    topology = DelayTopology(prefix=f"bench-{uuid.uuid4().hex[:6]}", levels=16)
    subjects: dict[tuple[str, str], tuple[Consumer, bool]] = {
        ("success", "plain aio-pika"): (plain(), False),
        ("success", "delayed-retry"): (decorated(topology, fail_once_with=None), False),
        ("success", "delayed-retry, no telemetry"): (
            decorated(topology, fail_once_with=None, telemetry=False),
            False,
        ),
        ("retry-0hop", "hand-rolled publish+ack, classic"): (hand_rolled(), False),
        ("retry-0hop", "delayed-retry"): (decorated(topology, fail_once_with=0), False),
        ("retry-1hop", "hand-rolled 1 quorum TTL hop"): (hand_rolled(to=to_hop), True),
        ("retry-1hop", "delayed-retry"): (decorated(topology, fail_once_with=0.001), False),
    }
    samples: dict[tuple[str, str], list[Sample]] = {key: [] for key in subjects}
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        for round_ in range(rounds):
            # A new order each round, so no subject always follows the same one.
            order = list(subjects.items())
            random.Random(round_).shuffle(order)
            for key, (consumer, hop) in order:
                samples[key].append(
                    await measure(
                        connection,
                        consumer,
                        messages,
                        hop_queue=hop,
                        declare=None if key[1].startswith(("plain", "hand-rolled")) else topology,
                        broker_pid=broker_pid,
                    )
                )
        await delete_topology(channel, topology)
    rows = []
    for pair in PAIRS:
        subject = samples[(pair.workload, pair.subject)]
        base = samples[(pair.workload, pair.baseline)]
        rows.append(pair_row(pair, subject, base))
    return rows


def pair_row(pair: Pair, subject: list[Sample], base: list[Sample]) -> dict[str, Any]:
    """One pair's row: the medians of its samples, and the ratios baseline / subject (CPU)."""

    def med(values: list[Sample], attr: str) -> float:
        return statistics.median(getattr(v, attr) for v in values)

    return {
        "workload": pair.workload,
        "subject": pair.subject,
        "baseline": pair.baseline,
        "unit": "CPU µs/msg",
        "value": round(med(subject, "cost_us"), 1),
        "baseline_value": round(med(base, "cost_us"), 1),
        "ratio": round(med(base, "cost_us") / med(subject, "cost_us"), 3),
        "wall_ratio": round(med(subject, "rate") / med(base, "rate"), 3),
        "client_ratio": round(med(base, "client_us") / med(subject, "client_us"), 3),
        "rate": round(med(subject, "rate"), 1),
        "baseline_rate": round(med(base, "rate"), 1),
        "client_us": round(med(subject, "client_us"), 1),
        "baseline_client_us": round(med(base, "client_us"), 1),
        "broker_us": round(med(subject, "broker_us"), 1),
        "baseline_broker_us": round(med(base, "broker_us"), 1),
        "samples": [vars(v) for v in subject],
        "baseline_samples": [vars(v) for v in base],
    }


async def delete_topology(channel: AbstractChannel, topology: DelayTopology) -> None:
    """Delete a benchmark's chain: its queues, then its exchanges."""
    for spec in topology.queues():
        await channel.queue_delete(spec.name)
    for name in [*markers(topology), *(ex.name for ex in reversed(topology.exchanges()))]:
        await channel.exchange_delete(name)


async def delete_topology_at(url: str, topology: DelayTopology) -> None:
    """Delete a benchmark's chain on the broker at ``url``."""
    connection = await aio_pika.connect(url)
    async with connection:
        await delete_topology(await connection.channel(), topology)


async def throughput(suite: Suite) -> list[Row]:
    """The ``throughput`` workload: the rows ``success``, ``retry-0hop`` and ``retry-1hop``."""
    args = suite.args
    print(f"throughput: {args.messages} messages x {args.rounds} rounds per subject ...")
    return await run(
        suite.url, messages=args.messages, rounds=args.rounds, broker_pid=suite.broker_pid
    )
