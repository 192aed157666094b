"""Peers through their own public API on the same broker, beside a plain aio-pika consumer.

Dramatiq (its RabbitMQ broker and Retries middleware; delays are held in the
worker's memory until due): the success path, and every message failing once
with a 1 ms backoff. Each is timed from the worker's start until the last
message is handled, with the CPU time of this process (worker threads
included) and of the broker's VM, and divided by the plain aio-pika consumer
measured in the same run (:func:`throughput.measure`).

Celery is not driven here yet (see docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import threading
import time
import uuid
from typing import Any

import aio_pika
import throughput
from workloads import Row, Suite


def _dramatiq(url: str, n: int, *, fail_once: bool, broker_pid: int | None) -> throughput.Sample:
    import dramatiq
    from dramatiq.brokers.rabbitmq import RabbitmqBroker
    from dramatiq.middleware import Retries

    # Dramatiq logs every failure with its traceback; delayed-retry logs retries at INFO,
    # which is off by default. Quiet both alike.
    logging.getLogger("dramatiq").setLevel(logging.CRITICAL)
    broker = RabbitmqBroker(url=url)
    for middleware in list(broker.middleware):
        if isinstance(middleware, Retries):
            broker.middleware.remove(middleware)
    broker.add_middleware(Retries(min_backoff=1, max_backoff=1, max_retries=3))
    queue = f"bench-dramatiq-{uuid.uuid4().hex[:8]}"
    seen: set[int] = set()
    done = threading.Event()
    lock = threading.Lock()
    count = 0

    def handle(i: int) -> None:
        nonlocal count
        with lock:
            if fail_once and i not in seen:
                seen.add(i)
                raise RuntimeError("once")
            count += 1
            if count == n:
                done.set()

    actor = dramatiq.actor(handle, broker=broker, queue_name=queue, actor_name=queue)
    for i in range(n):
        actor.send(i)
    worker = dramatiq.Worker(broker, queues={queue}, worker_threads=8, worker_timeout=100)
    start = time.perf_counter()
    cpu = time.process_time()
    broker_cpu = throughput.broker_cpu_seconds(broker_pid)
    worker.start()
    finished = done.wait(timeout=600)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    broker_cpu = throughput.broker_cpu_seconds(broker_pid) - broker_cpu
    worker.stop()
    for name in (queue, f"{queue}.DQ", f"{queue}.XQ"):
        # Already gone, or the channel closed: nothing left to clean.
        with contextlib.suppress(Exception):
            broker.channel.queue_delete(name)
    broker.close()
    if not finished:
        raise RuntimeError(f"dramatiq handled {count} of {n} messages in 600 s")
    return throughput.Sample(
        n / elapsed, cpu / n * 1e6, broker_cpu / n * 1e6 if broker_pid else 0.0
    )


async def _plain(url: str, n: int, broker_pid: int | None) -> throughput.Sample:
    connection = await aio_pika.connect(url)
    async with connection:
        return await throughput.measure(connection, throughput.plain(), n, broker_pid=broker_pid)


async def run(
    url: str, *, messages: int, rounds: int, broker_pid: int | None = None
) -> list[dict[str, Any]]:
    samples: dict[str, list[throughput.Sample]] = {
        "plain": [],
        "dramatiq success": [],
        "dramatiq retry once": [],
    }
    for _ in range(rounds):
        samples["plain"].append(await _plain(url, messages, broker_pid))
        samples["dramatiq success"].append(
            await asyncio.to_thread(
                _dramatiq, url, messages, fail_once=False, broker_pid=broker_pid
            )
        )
        samples["dramatiq retry once"].append(
            await asyncio.to_thread(_dramatiq, url, messages, fail_once=True, broker_pid=broker_pid)
        )

    def med(key: str, attr: str) -> float:
        return statistics.median(getattr(s, attr) for s in samples[key])

    rows = []
    for key, workload in (("dramatiq success", "success"), ("dramatiq retry once", "retry-1ms")):
        rows.append(
            {
                "workload": f"peer {workload}",
                "subject": "Dramatiq (Retries, RabbitmqBroker)",
                "baseline": "plain aio-pika",
                "unit": "CPU µs/msg",
                "value": round(med(key, "cost_us"), 1),
                "baseline_value": round(med("plain", "cost_us"), 1),
                "ratio": round(med("plain", "cost_us") / med(key, "cost_us"), 3),
                "wall_ratio": round(med(key, "rate") / med("plain", "rate"), 3),
                "rate": round(med(key, "rate"), 1),
                "baseline_rate": round(med("plain", "rate"), 1),
                "samples": [vars(s) for s in samples[key]],
                "baseline_samples": [vars(s) for s in samples["plain"]],
            }
        )
    return rows


async def peers(suite: Suite) -> list[Row]:
    """The ``peers`` workload: Dramatiq's success and retry-once rows."""
    print("peers ...")
    args = suite.args
    return await run(
        suite.url, messages=args.messages, rounds=args.rounds, broker_pid=suite.broker_pid
    )
