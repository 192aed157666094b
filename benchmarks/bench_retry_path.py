"""Throughput of the retry path against a plain aio-pika consumer, measured in the same run.

Three consumers handle the same number of messages on the same broker:

* baseline: a plain aio-pika handler that acks;
* wrapped: the same handler under ``@with_delayed_retry`` (success path: the
  cost of the decorator itself);
* retried: a handler that fails each message once, so every message makes one
  confirmed trip through the delay chain (zero delay) before it succeeds.

Prints messages per second and each as a ratio of the baseline, and writes a
JSON line to ``benchmarks/results/retry_path.jsonl``. Messages are persistent
in every mode. Target: wrapped ≥ 0.8× baseline (the exit status says). Retried is
reported: each message costs one more confirmed persistent publish and one more
delivery.

    python benchmarks/bench_retry_path.py --messages 5000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DelayTopology, RetryAfter, consume, declare_topology, with_delayed_retry
from harness import broker_url

PREFETCH = 100


async def _publish(channel: aio_pika.abc.AbstractChannel, queue: str, n: int) -> None:
    batch = []
    for i in range(n):
        batch.append(
            channel.default_exchange.publish(
                aio_pika.Message(
                    b"x" * 200,
                    message_id=str(i),
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=queue,
            )
        )
        if len(batch) == 500:
            await asyncio.gather(*batch)
            batch.clear()
    await asyncio.gather(*batch)


async def _measure(url: str, n: int, mode: str, topology: DelayTopology) -> float:
    connection = await aio_pika.connect_robust(url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        name = f"bench-{mode}-{uuid.uuid4().hex[:6]}"
        queue = await channel.declare_queue(name, durable=True)
        await declare_topology(channel, topology, queues=[name])
        await _publish(channel, name, n)
        done = asyncio.Event()
        count = 0
        seen: set[str] = set()

        async def plain(message: AbstractIncomingMessage) -> None:
            nonlocal count
            await message.ack()
            count += 1
            if count == n:
                done.set()

        async def body(message: AbstractIncomingMessage) -> None:
            nonlocal count
            if mode == "retried" and message.message_id not in seen:
                seen.add(message.message_id or "")
                raise RetryAfter(0)
            count += 1
            if count == n:
                done.set()

        start = time.perf_counter()
        if mode == "baseline":
            tag = await queue.consume(plain)
        else:
            tag = await consume(queue, with_delayed_retry(topology=topology)(body))
        await asyncio.wait_for(done.wait(), timeout=600)
        elapsed = time.perf_counter() - start
        await queue.cancel(tag)
        await queue.delete(if_unused=False, if_empty=False)
        await channel.queue_delete(f"{name}.parking")
        return n / elapsed


async def run(url: str, n: int, rounds: int) -> dict[str, float]:
    topology = DelayTopology(prefix=f"bench-{uuid.uuid4().hex[:6]}", levels=16)
    rates: dict[str, list[float]] = {"baseline": [], "wrapped": [], "retried": []}
    for _ in range(rounds):  # interleave so drift on a shared machine hits every mode alike
        for mode in rates:
            rates[mode].append(await _measure(url, n, mode, topology))
    return {mode: sorted(values)[len(values) // 2] for mode, values in rates.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with broker_url() as url:
        result = asyncio.run(run(url, args.messages, args.rounds))
    base = result["baseline"]
    print(f"messages per run: {args.messages}, rounds: {args.rounds} (median shown)")
    for mode, rate in result.items():
        print(f"{mode:>9}: {rate:9.0f} msg/s  ratio {rate / base:5.2f}")
    out = Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    with (out / "retry_path.jsonl").open("a") as fh:
        fh.write(json.dumps({"messages": args.messages, **result}) + "\n")
    return 0 if result["wrapped"] / base >= 0.8 else 1


if __name__ == "__main__":
    sys.exit(main())
