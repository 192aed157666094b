"""A FastStream app whose failures are retried through the delay chain, or parked.

Run it with a broker at ``$RABBITMQ_URL`` (default ``amqp://guest:guest@localhost/``):
``python examples/faststream_app.py`` (or ``faststream run examples.faststream_app:app``);
publish to ``fs-orders``; stop it with Ctrl-C. ``delayed-retry parking list --queue
fs-orders`` shows what was parked.
"""

import asyncio
import os

from faststream import FastStream
from faststream.rabbit import QueueType, RabbitBroker, RabbitQueue
from tenacity import retry_if_exception_type, wait_fixed

from delayed_retry.faststream import CurrentRetryState, DelayedRetry, check_subscribers


class TransientError(Exception):
    """A failure worth retrying later: a timeout, a 503 from a dependency."""


broker = RabbitBroker(
    os.environ.get("RABBITMQ_URL", "amqp://guest:guest@localhost/"),
    middlewares=[
        DelayedRetry(
            max_retries=3,
            wait=wait_fixed(0.3),  # any tenacity wait_*
            retry=retry_if_exception_type(TransientError),  # others park at once
        )
    ],
)
app = FastStream(broker)


@app.on_startup
async def refuse_unsafe_subscribers() -> None:
    check_subscribers(broker)  # a forbidden ack policy (ACK_FIRST) fails the start


@broker.subscriber(RabbitQueue("fs-orders", queue_type=QueueType.QUORUM, durable=True))
async def handle(body: str, state: CurrentRetryState) -> None:
    print(f"{body}: attempt {state.attempt} (last error: {state.last_error})", flush=True)
    if body.startswith("flaky") and state.attempt < 2:
        raise TransientError("the database is restarting")  # back in 0.3 s
    if body.startswith("invalid"):
        raise ValueError("no such order")  # parked at once, with its record
    print(f"{body}: done", flush=True)


if __name__ == "__main__":
    asyncio.run(app.run())
