"""How long a message the client cannot decode holds up the messages behind it.

A work queue declared with ``work_queue_arguments(queue, delivery_limit=--limit)``
is consumed by a decorated handler over a robust connection that reconnects
every ``--reconnect-interval`` seconds (aio-pika's default: 5). Each round
publishes a message whose AMQP ``timestamp`` is in microseconds (pamqp cannot
decode it: the connection drops at each delivery), then an ordinary message,
and measures the seconds until the ordinary one is settled (handled, or, with a
``--prefetch`` window, dead-lettered with the poison: it was returned as often),
and how often the consumer reconnected meanwhile. The baseline, measured in the same run, is the
same ordinary message with no poison before it.

    python benchmarks/undecodable.py [--url URL | --version 4.3] [--limit 5]
                                     [--reconnect-interval 5] [--rounds 3] [--prefetch 1]

Uses ``--url`` (default ``$RABBITMQ_URL``, else ``amqp://guest:guest@127.0.0.1/``) with unique
names, and deletes what it declares.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import statistics
import time
import uuid

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DelayTopology, consume, with_delayed_retry, work_queue_arguments
from delayed_retry.chain_digest import markers
from harness import RabbitMQNode


class MicrosecondStamp(datetime.datetime):
    """A datetime pamqp encodes in microseconds since the epoch, as some producers write."""

    def timestamp(self) -> float:
        return super().timestamp() * 1_000_000


async def _until(event: asyncio.Event, timeout: float) -> None:
    await asyncio.wait_for(event.wait(), timeout)


async def _depth(channel: aio_pika.abc.AbstractChannel, queue: str) -> int:
    declared = await channel.declare_queue(queue, passive=True)
    return int(declared.declaration_result.message_count or 0)


async def run(
    url: str, *, limit: int, reconnect_interval: float, rounds: int, prefetch: int
) -> dict[str, object]:
    name = f"bench-undecodable-{uuid.uuid4().hex[:8]}"
    topology = DelayTopology(prefix=name, levels=4)
    queue = f"{name}.work"
    dead_letter = topology.default_dead_letter_queue(queue)
    arguments = work_queue_arguments(queue, delivery_limit=limit)
    admin = await aio_pika.connect(url)
    robust = await aio_pika.connect_robust(url, reconnect_interval=reconnect_interval)
    reconnects = 0
    handled: dict[bytes, asyncio.Event] = {}

    def reconnected(*_: object) -> None:
        nonlocal reconnects
        reconnects += 1

    robust.reconnect_callbacks.add(reconnected)

    @with_delayed_retry(topology=topology, max_retries=1, wait=tenacity.wait_fixed(0.05))
    async def handle(message: AbstractIncomingMessage) -> None:
        handled.setdefault(message.body, asyncio.Event()).set()

    publisher = await admin.channel()
    try:
        channel = await robust.channel()
        await channel.set_qos(prefetch_count=prefetch)
        await consume(await channel.declare_queue(queue, durable=True, arguments=arguments), handle)
        baseline: list[float] = []
        stalled: list[float] = []
        deliveries: list[int] = []
        moved = moved_along = 0
        for n in range(rounds):
            body = b"plain-%d" % n
            handled[body] = asyncio.Event()
            began = time.monotonic()
            await publisher.default_exchange.publish(aio_pika.Message(body), routing_key=queue)
            await _until(handled[body], 60)
            baseline.append(time.monotonic() - began)

            body = b"after-%d" % n
            handled[body] = asyncio.Event()
            before = reconnects
            now = datetime.datetime.now(datetime.UTC)
            poison = aio_pika.Message(
                b"poison", timestamp=MicrosecondStamp.fromtimestamp(now.timestamp(), datetime.UTC)
            )
            began = time.monotonic()
            await publisher.default_exchange.publish(poison, routing_key=queue)
            await publisher.default_exchange.publish(aio_pika.Message(body), routing_key=queue)
            # Settled: handled, or (delivered in the poison's prefetch window as often as the
            # poison) dead-lettered with it.
            deadline = began + (limit + 2) * (reconnect_interval + 5) + 60
            while not handled[body].is_set():
                if await _depth(publisher, dead_letter) >= moved + 2:
                    moved_along += 1
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{body!r} neither handled nor dead-lettered")
                await asyncio.sleep(0.05)
            stalled.append(time.monotonic() - began)
            deliveries.append(reconnects - before)
            moved = await _depth(publisher, dead_letter)
        return {
            "broker": str(
                (await publisher.get_underlay_channel()).connection.server_properties.get("version")
            ),
            "limit": limit,
            "reconnect_interval_s": reconnect_interval,
            "rounds": rounds,
            "baseline_s_median": round(statistics.median(baseline), 4),
            "behind_poison_s": [round(s, 2) for s in stalled],
            "reconnects_per_poison": deliveries,
            "prefetch": prefetch,
            "dead_lettered": moved,
            "behind_dead_lettered_with_it": moved_along,
        }
    finally:
        await robust.close()
        cleanup = await admin.channel()
        for q in (
            queue,
            topology.default_dead_letter_queue(queue),
            topology.default_parking_queue(queue),
            *(s.name for s in topology.queues()),
        ):
            await cleanup.queue_delete(q)
        for name in [*(e.name for e in topology.exchanges()), *markers(topology)]:
            await cleanup.exchange_delete(name)
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", default=os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1/")
    )
    parser.add_argument("--limit", type=int, default=5)
    parser.add_argument("--reconnect-interval", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prefetch", type=int, default=1)
    parser.add_argument(
        "--version", default=None, help="start a private node of 4.0 or 4.3 instead of --url"
    )
    args = parser.parse_args()

    def measure(url: str) -> None:
        result = asyncio.run(
            run(
                url,
                limit=args.limit,
                reconnect_interval=args.reconnect_interval,
                rounds=args.rounds,
                prefetch=args.prefetch,
            )
        )
        print(json.dumps(result))

    if args.version is None:
        measure(args.url)
    else:
        with RabbitMQNode(version=args.version) as node:
            measure(node.url)


if __name__ == "__main__":
    main()
