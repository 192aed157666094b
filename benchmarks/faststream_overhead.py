"""DelayedRetry in a FastStream app beside a plain FastStream subscriber: throughput ratios.

The suite's ``faststream`` workload: ``benchmarks/run --only faststream [--messages N]
[--rounds R]``. Each round fills a fresh quorum queue with N persistent
200-byte messages, then times a FastStream app consuming them all; subjects and their
baselines alternate in a shuffled order and the median of each is kept, so drift on a
shared machine hits both alike. Only ratios are reported as results:

* ``success``: a handler that returns, under ``DelayedRetry`` / with no middleware.
* ``retry``: every message fails once and is retried with zero delay, through
  ``DelayedRetry`` / a hand-rolled FastStream retry (the handler publishes a copy
  back to the queue with an attempt header, then returns and FastStream acks it).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aio_pika
from faststream.rabbit import QueueType, RabbitBroker, RabbitMessage, RabbitQueue
from tenacity import wait_fixed
from workloads import Row, Suite

from delayed_retry import DelayTopology
from delayed_retry.faststream import DelayedRetry

TOPOLOGY = DelayTopology(prefix="bench-fs", levels=12)
Subject = Callable[[str, str, int], Awaitable[float]]


async def fill(url: str, queue: str, n: int) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
        body = b"x" * 200
        for start in range(0, n, 500):
            await asyncio.gather(
                *(
                    channel.default_exchange.publish(
                        aio_pika.Message(body, delivery_mode=2, message_id=str(i)), queue
                    )
                    for i in range(start, min(n, start + 500))
                )
            )


async def drop(url: str, *queues: str) -> None:
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for queue in queues:
            await channel.queue_delete(queue)


async def consume(url: str, queue: str, n: int, *, retrying: bool, fail_once: bool) -> float:
    """Seconds a FastStream app takes to finish messages 2 to ``n`` already in ``queue``.

    Timed from the first message finished: the start-up (connecting, and for
    ``DelayedRetry`` declaring the chain once per connection) is left out for both.
    """
    middlewares = [DelayedRetry(topology=TOPOLOGY, wait=wait_fixed(0))] if retrying else []
    broker = RabbitBroker(url, logger=None, middlewares=middlewares)
    finished = asyncio.Event()
    done = 0
    first = 0.0

    @broker.subscriber(RabbitQueue(queue, queue_type=QueueType.QUORUM, durable=True))
    async def handle(body: bytes, msg: RabbitMessage) -> None:
        nonlocal done, first
        headers = msg.headers
        if fail_once and not (headers.get("x-retry") or headers.get("x-attempt")):
            if retrying:
                raise RuntimeError("fails once")
            # The hand-rolled retry: a copy back to the queue, then FastStream acks.
            await broker.publish(body, queue, headers={"x-attempt": 2}, persist=True)
            return
        done += 1
        if done == 1:
            first = time.perf_counter()
        if done == n:
            finished.set()

    await broker.start()
    try:
        await asyncio.wait_for(finished.wait(), 600)
        return time.perf_counter() - first
    finally:
        await broker.stop()


async def measure(url: str, messages: int, rounds: int) -> list[Row]:
    """Both pairs, interleaved over ``rounds``; one row per pair with the median times."""
    pairs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
        "success": (
            {"retrying": True, "fail_once": False},
            {"retrying": False, "fail_once": False},
        ),
        "retry": (
            {"retrying": True, "fail_once": True},
            {"retrying": False, "fail_once": True},
        ),
    }
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(rounds):
        order = [(w, side) for w in pairs for side in ("subject", "baseline")]
        random.shuffle(order)
        for workload, side in order:
            queue = f"bench-fs-{uuid.uuid4().hex[:8]}"
            await fill(url, queue, messages)
            kwargs = pairs[workload][0 if side == "subject" else 1]
            seconds = await consume(url, queue, messages, **kwargs)
            times.setdefault((workload, side), []).append(seconds)
            await drop(url, queue, TOPOLOGY.default_parking_queue(queue))
    rows = []
    for workload in pairs:
        subject = statistics.median(times[(workload, "subject")])
        baseline = statistics.median(times[(workload, "baseline")])
        rows.append(
            {
                "workload": f"faststream {workload}",
                "subject": "DelayedRetry",
                "unit": "msg/s",
                "value": round((messages - 1) / subject),
                "baseline": "plain FastStream" if workload == "success" else "hand-rolled retry",
                "baseline_value": round((messages - 1) / baseline),
                "ratio": baseline / subject,
            }
        )
    return rows


async def faststream(suite: Suite) -> list[Row]:
    """The ``faststream`` workload: wall-clock throughput ratios of the two pairs."""
    args = suite.args
    print(f"faststream: {args.messages} messages x {args.rounds} rounds per subject ...")
    return await measure(suite.url, args.messages, args.rounds)
