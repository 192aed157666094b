"""Delayed retries for a consumer that knows nothing of delayed-retry: it only rejects.

The "team" consumer below stands for one written in Go or Java: plain AMQP
(aiormq, no delayed-retry import in its code path), a queue declared with one
extra argument, ``x-dead-letter-exchange``, and ``basic.reject(requeue=False)``
on failure. It fails twice on each message, then succeeds. A RetryRouter
sends each rejection back through the delay chain (1 s, then 2 s), and one
message that always fails is parked after three retries. It finishes by itself.

Run:  .venv/bin/python examples/any_language_router.py
(uses $RABBITMQ_URL, else starts a throwaway broker)
"""

from __future__ import annotations

import asyncio
import secrets
import time
from datetime import timedelta

import aio_pika
import aiormq
from tenacity import wait_exponential

from delayed_retry import DelayTopology, NoInstrumentation, RetryRouter
from delayed_retry.chain.digest import markers
from harness import broker_url


async def team_consumer(
    url: str, queue: str, rejected_exchange: str, handled: asyncio.Event, stop: asyncio.Event
) -> None:
    """What the other team runs: reject on failure, nothing else."""
    connection = await aiormq.connect(url)
    channel = await connection.channel()
    await channel.queue_declare(
        queue, durable=True, arguments={"x-dead-letter-exchange": rejected_exchange}
    )
    seen: dict[bytes, int] = {}
    started = time.monotonic()

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        body = message.body
        seen[body] = seen.get(body, 0) + 1
        tag = message.delivery_tag
        assert tag is not None
        if body == b"always fails" or seen[body] <= 2:
            print(f"{time.monotonic() - started:5.1f} s  {body.decode()!r}: failed, rejecting")
            await channel.basic_reject(tag, requeue=False)
            return
        print(f"{time.monotonic() - started:5.1f} s  {body.decode()!r}: handled")
        await channel.basic_ack(tag)
        handled.set()

    await channel.basic_consume(queue, on_message)
    await stop.wait()
    await connection.close()


async def run(url: str) -> None:
    suffix = secrets.token_hex(3)
    topology = DelayTopology(prefix=f"example-router-{suffix}", levels=16, queue_type="classic")
    queue = f"example-orders-{suffix}"
    handled, stop = asyncio.Event(), asyncio.Event()
    consumer = asyncio.create_task(
        team_consumer(url, queue, topology.rejected_exchange, handled, stop)
    )
    connection = await aio_pika.connect_robust(url)
    async with connection:
        channel = await connection.channel()
        while True:  # the team's consumer declares its queue
            try:
                await channel.declare_queue(queue, passive=True)
                break
            except aiormq.exceptions.ChannelNotFoundEntity:
                channel = await connection.channel()
                await asyncio.sleep(0.1)
        router = RetryRouter(
            queues=[queue],
            max_retries=3,
            wait=wait_exponential(multiplier=1, max=4),
            topology=topology,
            instrumentation=NoInstrumentation(),
        )
        router_channel = await connection.channel()
        await router.start(router_channel)
        for body in (b"order 42", b"always fails"):
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue)
        await asyncio.wait_for(handled.wait(), 30)
        parking = await channel.declare_queue(topology.default_parking_queue(queue), passive=True)
        deadline = time.monotonic() + 30
        while (parked := await parking.get(fail=False)) is None:
            if time.monotonic() > deadline:
                raise SystemExit("nothing was parked")
            await asyncio.sleep(0.2)
        headers = parked.headers or {}
        print(
            f"parked {parked.body.decode()!r} after {headers['x-retry']!r} retries: "
            f"{headers['x-parked-reason']!r}, {headers['x-exception-message']!r}"
        )
        await parked.ack()
        stop.set()
        await consumer
        await router_channel.close()
        await _clean_up(channel, topology, queue)


async def _clean_up(
    channel: aio_pika.abc.AbstractChannel, topology: DelayTopology, queue: str
) -> None:
    for name in [q.name for q in topology.queues()] + [queue, f"{queue}.parking"]:
        await channel.queue_delete(name)
    # The two markers a complete declaration leaves (delayed-retry teardown deletes them too).
    for exchange in [*(e.name for e in topology.exchanges()), *markers(topology)]:
        await channel.exchange_delete(exchange)


def main() -> None:
    with broker_url() as url:
        asyncio.run(asyncio.wait_for(run(url), timedelta(minutes=2).total_seconds()))


if __name__ == "__main__":
    main()
