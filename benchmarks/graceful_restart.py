"""Graceful broker restarts while delays are in flight: how late do they arrive?

Starts a private RabbitMQ node (the host's 3.10, or ``--version 4.3``) with the
broker's default ``dead_letter_worker_publisher_confirm_timeout`` (180 s) unless
``--confirm-timeout-ms`` sets one. Each round publishes ``--messages`` delays of
0.5-4 s into a 16-level chain (through levels 8-11), restarts the node
gracefully (``rabbitmqctl stop``, then start) and waits up to 240 s for every one
of them. Prints one JSON line per round: the restart's duration, how many
arrived, the latest arrival past its due time, how many came more than 20 s
late, and how many came early (must be 0).

    python benchmarks/graceful_restart.py [--rounds 6] [--messages 300] [--version 4.3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DelayTopology, declare_topology, publish_delayed
from harness import RabbitMQNode


async def run(node: RabbitMQNode, *, rounds: int, messages: int) -> None:
    topology = DelayTopology(prefix="graceful-restart", levels=16)
    queue = "graceful-restart.due"
    connection = await aio_pika.connect_robust(node.url, reconnect_interval=0.5)
    channel = await connection.channel()
    await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": "quorum"})
    await declare_topology(channel, topology, queues=[queue])
    await asyncio.to_thread(node.flush_metadata)  # a fresh quorum queue survives a restart
    due: dict[str, float] = {}
    late: dict[str, float] = {}
    consumer = await connection.channel()
    await consumer.set_qos(prefetch_count=500)

    async def on_message(message: AbstractIncomingMessage) -> None:
        key = message.message_id or ""
        if key in due and key not in late:
            late[key] = time.time() - due[key]
        await message.ack()

    await (await consumer.declare_queue(queue, passive=True)).consume(on_message)
    for n in range(rounds):
        publisher = await connection.channel()
        keys = []
        for i in range(messages):
            key = f"{n}-{i}"
            delay = random.uniform(0.5, 4.0)
            due[key] = time.time() + delay
            keys.append(key)
            message = aio_pika.Message(b"x", message_id=key)
            await publish_delayed(publisher, message, queue=queue, delay=delay, topology=topology)
            await asyncio.sleep(0.005)
        began = time.time()
        await asyncio.to_thread(node.restart)
        restart = time.time() - began
        deadline = time.time() + 240
        while time.time() < deadline and not all(k in late for k in keys):
            await asyncio.sleep(0.5)
        got = [late[k] for k in keys if k in late]
        print(
            json.dumps(
                {
                    "round": n,
                    "restart_s": round(restart, 1),
                    "sent": len(keys),
                    "arrived": len(got),
                    "max_late_s": round(max(got), 1) if got else None,
                    "over_20s": sum(1 for g in got if g > 20),
                    "early": sum(1 for g in got if g < 0),
                }
            ),
            flush=True,
        )
    await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--version", default=None, help="4.0 or 4.3 (default: the host's 3.10)")
    parser.add_argument("--confirm-timeout-ms", type=int, default=None)
    args = parser.parse_args()
    env = (
        {"dead_letter_worker_publisher_confirm_timeout": args.confirm_timeout_ms}
        if args.confirm_timeout_ms
        else {}
    )
    with RabbitMQNode(version=args.version, rabbit_env=env) as node:
        asyncio.run(run(node, rounds=args.rounds, messages=args.messages))


if __name__ == "__main__":
    main()
