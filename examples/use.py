"""Consume the queue ``orders`` with delayed retries: the README's "Your first consumer" program.

Run it with a broker at ``$RABBITMQ_URL`` (default ``amqp://guest:guest@localhost/``):
``python examples/use.py``; in another terminal publish to ``orders``, e.g.
``delayed-retry publish --queue orders --delay 0s --body flaky-1``; stop it with Ctrl-C.
"""

import asyncio
import logging
import os
import signal

import aio_pika
from tenacity import retry_if_exception_type, wait_exponential

from delayed_retry import consume, current_retry_state, with_delayed_retry, work_queue_arguments


class TransientError(Exception):
    """A failure worth retrying later: a timeout, a 503 from a dependency."""


async def process(body: bytes, attempt: int) -> None:
    """Your work. Raise TransientError to retry later; any other exception parks the message.

    This one fails on purpose, by the body, so that you can watch each outcome.
    """
    print(f"processing {body!r} (attempt {attempt})", flush=True)
    if body.startswith(b"flaky") and attempt < 3:
        raise TransientError("the payment service timed out")  # retried; passes on attempt 3
    if body.startswith(b"down"):
        raise TransientError("the payment service is down")  # retried 3 times, then parked
    if body.startswith(b"invalid"):
        raise ValueError("no such order")  # not retryable: parked at once, with its record


@with_delayed_retry(
    queue="orders",  # retries come back to this queue
    max_retries=3,
    wait=wait_exponential(multiplier=1, max=3600),  # 1 s, 2 s, 4 s …; any tenacity wait_*
    retry=retry_if_exception_type(TransientError),  # others park at once
)
async def handle(message: aio_pika.abc.AbstractIncomingMessage) -> None:
    state = current_retry_state()  # attempt, first failure, original exchange/key, last error
    attempt = state.attempt if state is not None else 1
    await process(message.body, attempt)  # raise to fail; return to succeed (the decorator acks)


async def main() -> None:
    # The library logs each retry (INFO) and each parked message (WARNING).
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    url = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost/")
    connection = await aio_pika.connect_robust(url)
    async with connection:
        channel = await connection.channel()  # publisher confirms are on by default
        await channel.set_qos(prefetch_count=10)
        # A quorum queue whose broker moves aside, after 5 deliveries, a message no consumer
        # can take (one the client cannot even decode) to orders.dead-letter.
        queue = await channel.declare_queue(
            "orders", durable=True, arguments=work_queue_arguments("orders")
        )
        await consume(queue, handle)  # declares the delay chain and binds the queue first
        print("consuming 'orders'; Ctrl-C to stop", flush=True)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()  # keep consuming until asked to stop


if __name__ == "__main__":
    asyncio.run(main())
