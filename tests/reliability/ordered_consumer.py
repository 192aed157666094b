"""A consumer process for the order tests: consumes every partition, writes each success.

    python ordered_consumer.py URL QUEUE PARTITIONS PREFIX OUT_FILE ordered|plain

Messages are JSON ``{"key": K, "n": N}``; those with ``N % 10 == 3`` fail their
first two attempts (retries after 200 ms, then 400 ms). Each success is written
to OUT_FILE as ``<time_ns> <pid> <key> <n>`` before the ack, so a kill -9 after
the write repeats the line: handled again, never lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import (
    DelayTopology,
    consume,
    current_retry_state,
    ordered_queue_names,
    with_delayed_retry,
)


def key_of(message: AbstractIncomingMessage) -> str:
    return str(json.loads(message.body)["key"])


async def main() -> None:
    url, queue, partitions, prefix, out_file, mode = sys.argv[1:7]
    topology = DelayTopology(prefix=prefix, levels=12)
    out = open(out_file, "a", buffering=1)  # noqa: SIM115, ASYNC230 - kept for the process's life

    @with_delayed_retry(
        max_retries=5,
        wait=tenacity.wait_exponential(multiplier=0.2, max=2),
        topology=topology,
        ordered_by=key_of if mode == "ordered" else None,
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        body = json.loads(message.body)
        state = current_retry_state()
        assert state is not None
        if body["n"] % 10 == 3 and state.attempt <= 2:
            raise RuntimeError(f"{body} fails attempt {state.attempt}")
        out.write(f"{time.time_ns()} {os.getpid()} {body['key']} {body['n']}\n")

    connection = await aio_pika.connect_robust(url, reconnect_interval=1)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=50)
    for name in ordered_queue_names(queue, int(partitions)):
        await consume(await channel.declare_queue(name, passive=True), handle)
    print("consuming", flush=True)
    await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
