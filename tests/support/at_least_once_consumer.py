"""A consumer that dies right after its hand-over is confirmed, before the ack.

    python at_least_once_consumer.py URL QUEUE PREFIX LEVELS MAX_RETRIES

Wraps the consuming channel's ``basic_publish`` (aiormq) so the process
calls ``os._exit(1)`` as soon as the broker has confirmed the retry copy (or
the parking record): the window in which the original is not yet acked. Its
handler always fails. Exits 1 after that confirm; any other exit is a failure
of the test that runs it.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DelayTopology, consume, with_delayed_retry

CRASHED_AFTER_CONFIRM = 1


async def main() -> None:
    url, queue_name, prefix, levels, max_retries = sys.argv[1:6]

    topology = DelayTopology(prefix=prefix, levels=int(levels), queue_type="quorum")

    @with_delayed_retry(
        max_retries=int(max_retries), wait=tenacity.wait_fixed(0.2), topology=topology
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        raise ConnectionError("the database is down")

    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    queue = await channel.get_queue(queue_name)
    underlay = await channel.get_underlay_channel()
    publish = underlay.basic_publish

    async def confirm_then_die(*args: Any, **kwargs: Any) -> Any:
        await publish(*args, **kwargs)
        os._exit(CRASHED_AFTER_CONFIRM)

    underlay.basic_publish = confirm_then_die  # type: ignore[method-assign]
    await consume(queue, handler)
    await asyncio.sleep(60)  # the test kills us long before; exiting 0 here fails it
    await connection.close()


if __name__ == "__main__":
    asyncio.run(main())
