"""Profile one throughput subject with pyinstrument, and count broker round trips.

    .venv/bin/python benchmarks/profile_paths.py success --messages 5000
    .venv/bin/python benchmarks/profile_paths.py retry-0hop --messages 3000

Runs the subject of :mod:`throughput` on a private node under pyinstrument
(printing the call tree, consumer process only) and counts the AMQP methods the
consumer's connection sent, per message: publishes, acks and anything else
(declarations, channel opens) that a hot path should not repeat.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import uuid

import aio_pika
import aiormq
import throughput
from pyinstrument import Profiler

from delayed_retry import DelayTopology, declare_topology
from harness import RabbitMQNode

sent: collections.Counter[str] = collections.Counter()


def _count_frames() -> None:
    """Count every method frame the client writes, by name (patched for this profile only)."""
    original = aiormq.Channel.rpc

    async def rpc(self: aiormq.Channel, frame: object, timeout: float | None = None) -> object:
        sent[type(frame).__name__] += 1
        return await original(self, frame, timeout=timeout)  # type: ignore[arg-type]

    aiormq.Channel.rpc = rpc  # type: ignore[method-assign]
    original_publish = aiormq.Channel.basic_publish
    original_ack = aiormq.Channel.basic_ack

    async def basic_publish(self: aiormq.Channel, *args: object, **kwargs: object) -> object:
        sent["Basic.Publish"] += 1
        return await original_publish(self, *args, **kwargs)  # type: ignore[arg-type]

    async def basic_ack(self: aiormq.Channel, *args: object, **kwargs: object) -> object:
        sent["Basic.Ack"] += 1
        return await original_ack(self, *args, **kwargs)  # type: ignore[arg-type]

    aiormq.Channel.basic_publish = basic_publish  # type: ignore[method-assign]
    aiormq.Channel.basic_ack = basic_ack  # type: ignore[method-assign]


async def _run(url: str, subject: str, n: int) -> float:
    topology = DelayTopology(prefix=f"bench-{uuid.uuid4().hex[:6]}", levels=16)
    consumers = {
        "plain": throughput.plain(),
        "success": throughput.decorated(topology, fail_once_with=None),
        "retry-0hop": throughput.decorated(topology, fail_once_with=0),
        "retry-1hop": throughput.decorated(topology, fail_once_with=0.001),
        "hand-0hop": throughput.hand_rolled(),
    }
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        # Warm up (first-use declarations), then measure.
        await throughput.measure(connection, consumers[subject], 200)
        sent.clear()
        profiler = Profiler(async_mode="disabled", interval=0.0005)

        def start() -> None:
            sent.clear()
            profiler.start()

        sample = await throughput.measure(
            connection, consumers[subject], n, on_start=start, on_end=profiler.stop
        )
        await throughput.delete_topology(channel, topology)
    print(profiler.output_text(show_all=True, color=False))
    return sample.rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "subject", choices=["plain", "success", "retry-0hop", "retry-1hop", "hand-0hop"]
    )
    parser.add_argument("--messages", type=int, default=3000)
    args = parser.parse_args()
    _count_frames()
    with RabbitMQNode() as node:
        rate = asyncio.run(_run(node.url, args.subject, args.messages))
    print(f"{args.subject}: {rate:.0f} msg/s under the profiler")
    print("methods sent per message while consuming:")
    for name, count in sorted(sent.items()):
        print(f"  {name:24} {count / args.messages:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
