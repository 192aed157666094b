"""Consume the queue ``orders`` with delayed retries: the README's "Use" program.

Run it with a broker at ``$RABBITMQ_URL`` (default ``amqp://guest:guest@localhost/``):
``python examples/use.py``; publish to ``orders``; stop it with Ctrl-C.
"""

import asyncio
import os
import signal

import aio_pika
from tenacity import retry_if_exception_type, wait_exponential

from delayed_retry import consume, current_retry_state, with_delayed_retry


class TransientError(Exception):
    """A failure worth retrying later: a timeout, a 503 from a dependency."""


async def process(body: bytes) -> None:
    """Your work. Raise TransientError to retry later; any other exception parks the message."""
    print(f"processing {body!r}", flush=True)


@with_delayed_retry(
    queue="orders",  # retries come back to this queue
    max_retries=5,
    wait=wait_exponential(multiplier=1, max=3600),  # any tenacity wait_*
    retry=retry_if_exception_type(TransientError),  # others park at once
)
async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    state = current_retry_state()  # attempt, first failure, original exchange/key, last error
    if state is not None and state.attempt > 1:
        print(f"attempt {state.attempt} (last error: {state.last_error})", flush=True)
    await process(message.body)  # raise to fail; return to succeed (the decorator acks)


async def main() -> None:
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost/")
    connection = await aio_pika.connect_robust(url)
    async with connection:
        channel = await connection.channel()  # publisher confirms are on by default
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue("orders", durable=True)
        await consume(queue, handle)  # declares the delay chain and binds the queue first
        print("consuming 'orders'; Ctrl-C to stop", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()  # keep consuming until asked to stop


if __name__ == "__main__":
    asyncio.run(main())
