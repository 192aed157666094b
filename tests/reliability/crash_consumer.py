"""A consumer process for the crash tests: run it, kill it, run it again.

    python crash_consumer.py URL QUEUE PREFIX HANDLED_FILE MODE CRASH_PROBABILITY SEED

Each body is ``{"id": n, "fail": k}``: the handler fails on the first ``k``
attempts, then appends ``n`` to HANDLED_FILE (before the ack, so a crash makes
a duplicate line, never a missing one). MODE ``handling`` makes each handling
take a while so that a SIGKILL from outside lands inside a handler; MODE
``after-publish`` makes the process SIGKILL itself, with the given
probability, right after a retry copy or parking record is confirmed and
before the original is acked.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
from datetime import timedelta

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage

import delayed_retry.consumer.handover as handover
from delayed_retry import DelayTopology, consume, current_retry_state, with_delayed_retry

MAX_RETRIES = 2


async def main() -> None:
    url, queue_name, prefix, handled_file, mode, probability, seed = sys.argv[1:8]
    rng = random.Random(int(seed))
    crash_probability = float(probability)
    fd = os.open(handled_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    topology = DelayTopology(prefix=prefix, levels=12, unit=timedelta(milliseconds=1))

    if mode == "after-publish":
        original_ack = handover.ack

        async def crashing_ack(message: AbstractIncomingMessage, queue: str) -> None:
            if rng.random() < crash_probability:
                os.kill(os.getpid(), signal.SIGKILL)
            await original_ack(message, queue)

        handover.ack = crashing_ack

    @with_delayed_retry(max_retries=MAX_RETRIES, wait=tenacity.wait_fixed(0.05), topology=topology)
    async def handle(message: AbstractIncomingMessage) -> None:
        spec = json.loads(message.body)
        state = current_retry_state()
        assert state is not None
        if mode == "handling":
            await asyncio.sleep(0.02)
        if state.attempt <= spec["fail"]:
            raise RuntimeError(f"message {spec['id']} fails on attempt {state.attempt}")
        os.write(fd, f"{spec['id']}\n".encode())

    connection = await aio_pika.connect_robust(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=20)
    queue = await channel.declare_queue(queue_name, passive=True)
    await consume(queue, handle)
    print("consuming", flush=True)
    await asyncio.Future()


if __name__ == "__main__":
    asyncio.run(main())
