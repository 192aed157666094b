"""A consumer process with a crash guard whose handler kills it on one message.

    python poison_consumer.py URL QUEUE PREFIX QUEUE_TYPE HANDLED_FILE MAX_CRASHES MODE

Bodies are ids; the handler appends each id it handles to HANDLED_FILE (the
poison never gets there). MODE ``poison``: the body ``poison`` ends the
process at once with ``os._exit`` (as an out-of-memory kill or a crash in a C
extension would), leaving the message unacked. MODE ``graceful``: each
message takes a while; SIGTERM shuts the consumer down gracefully, the way a
rolling deploy stops a process (cancel the consumer, release what it holds,
wait for the handlers running, close), then it prints ``stopped`` and exits 0.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from datetime import timedelta

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import CrashGuard, DelayTopology, consume, with_delayed_retry
from delayed_retry.consumer.in_flight import InFlight


async def main() -> None:
    url, queue_name, prefix, queue_type, handled_file, max_crashes, mode = sys.argv[1:8]
    fd = os.open(handled_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    topology = DelayTopology(
        prefix=prefix,
        levels=12,
        unit=timedelta(milliseconds=1),
        queue_type="classic" if queue_type == "classic" else "quorum",
    )
    in_flight = InFlight()

    @with_delayed_retry(topology=topology, crash_guard=CrashGuard(max_crashes=int(max_crashes)))
    async def handle(message: AbstractIncomingMessage) -> None:
        body = message.body.decode()
        if mode == "poison" and body == "poison":
            os._exit(3)
        with in_flight.track():
            if mode == "graceful":
                await asyncio.sleep(0.2)
            os.write(fd, f"{body}\n".encode())

    connection = await aio_pika.connect_robust(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=5 if mode == "graceful" else 1)
    queue = await channel.declare_queue(queue_name, passive=True)
    tag = await consume(queue, handle)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("consuming", flush=True)  # after the handler: a SIGTERM from now on is graceful
    await stop.wait()
    # A graceful shutdown: take nothing new, give back what is held, let handlers finish.
    await queue.cancel(tag)
    await handle.release_held()
    assert await in_flight.wait_idle(30), "handlers still running after 30 s"
    await connection.close()
    print("stopped", flush=True)
    os.close(fd)
    os._exit(0)  # done: nothing left to run, whatever the interpreter's exit would do


if __name__ == "__main__":
    asyncio.run(main())
