"""The crash guard with a consumer process that really dies, and one that stops gracefully.

The consumer runs as a child process (``poison_consumer.py``), started again
by the test each time it dies. A message that kills it is parked as
``crashed`` after ``max_crashes`` deaths, with the count in its record, while
the other messages are handled; a graceful stop (a rolling deploy) while it
holds messages counts as no crash, even with ``max_crashes=1``.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from delayed_retry import CrashGuard, DelayTopology, consume, with_delayed_retry
from delayed_retry.headers import X_PARKED_REASON, X_RETRY_CRASHES
from tests.support.queues import delete_all, depth
from tests.support.waiting import wait_until

CHILD = Path(__file__).with_name("poison_consumer.py")
GOOD = 20


class Child:
    """The consumer process: started, restarted when it died, stopped by its pid."""

    def __init__(self, args: list[str], log: Path) -> None:
        self.args = args
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.deaths = 0
        self.starts = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(CHILD), *self.args], stdout=out, stderr=subprocess.STDOUT
            )
        self.starts += 1

    def restart_if_dead(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            assert self.proc.returncode == 3, self.log.read_text()[-3000:]
            self.deaths += 1
            self.start()

    def terminate(self) -> int:
        """SIGTERM: the graceful stop; returns its exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def _publish(channel: AbstractChannel, queue: str, bodies: list[str]) -> None:
    for body in bodies:
        await channel.default_exchange.publish(
            aio_pika.Message(body.encode(), message_id=body, delivery_mode=2), queue
        )


def _handled(path: Path) -> list[str]:
    return path.read_text().split()


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_a_message_that_kills_its_consumer_is_parked_as_crashed(
    channel: AbstractChannel, rabbitmq_url: str, unique: str, tmp_path: Path, queue_type: str
) -> None:
    max_crashes = 3
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=12, queue_type=queue_type)  # type: ignore[arg-type]
    parking = topology.default_parking_queue(queue)
    await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": queue_type})
    handled_file = tmp_path / "handled.txt"
    handled_file.touch()
    child = Child(
        [rabbitmq_url, queue, unique, queue_type, str(handled_file), str(max_crashes), "poison"],
        tmp_path / "child.log",
    )
    good = [f"good-{i}" for i in range(GOOD)]
    try:
        await _publish(channel, queue, [*good[:10], "poison", *good[10:]])
        child.start()

        async def parked_and_handled() -> bool:
            child.restart_if_dead()
            return set(_handled(handled_file)) == set(good) and await depth(channel, parking) >= 1

        await wait_until(
            parked_and_handled, timeout=120, what="the poison parked, the rest handled"
        )
        assert child.deaths == max_crashes, child.log.read_text()[-3000:]
        record = await channel.declare_queue(parking, passive=True)
        got = await record.get(no_ack=True, fail=False)
        assert got is not None and got.body == b"poison"
        headers = got.headers or {}
        assert headers[X_PARKED_REASON] == "crashed"
        assert headers[X_RETRY_CRASHES] == max_crashes
        assert "went away" in str(headers.get("x-exception-message"))
        assert await depth(channel, parking) == 0  # nothing else parked
        assert await depth(channel, topology.alerts_queue) == 1  # the alert's copy
    finally:
        child.kill()
        await delete_all(
            channel, queues=[queue, parking, *(spec.name for spec in topology.queues())]
        )


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
async def test_a_graceful_stop_holding_messages_counts_as_no_crash(
    channel: AbstractChannel, rabbitmq_url: str, unique: str, tmp_path: Path, queue_type: str
) -> None:
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=12, queue_type=queue_type)  # type: ignore[arg-type]
    parking = topology.default_parking_queue(queue)
    await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": queue_type})
    handled_file = tmp_path / "handled.txt"
    handled_file.touch()
    # Classic queues: any crash counted would park (max_crashes=1). Quorum queues: a message the
    # queue was sending as the consumer was cancelled comes back marked redelivered (the cancel
    # race, see docs/rabbitmq-versions.md), so a stop may count it once: max_crashes=3 there.
    max_crashes = "1" if queue_type == "classic" else "3"
    args = [rabbitmq_url, queue, unique, queue_type, str(handled_file), max_crashes, "graceful"]
    child = Child(args, tmp_path / "child.log")
    bodies = [f"m-{i}" for i in range(150)]  # enough that no stop finds the queue empty
    try:
        await _publish(channel, queue, bodies)
        for _ in range(3):  # three rolling deploys, each while it holds a prefetch
            before = len(_handled(handled_file))
            child.start()

            def consuming_and_handling(before: int = before) -> bool:
                return (
                    child.log.read_text().count("consuming") == child.starts
                    and len(_handled(handled_file)) >= before + 3
                )

            await wait_until(consuming_and_handling, what="the new process consuming and handling")
            assert await asyncio.to_thread(child.terminate) == 0, child.log.read_text()[-3000:]
        child.start()
        await wait_until(
            lambda: set(_handled(handled_file)) == set(bodies), timeout=90, what="all handled"
        )
        assert await depth(channel, parking) == 0, child.log.read_text()[-3000:]
        counted = child.log.read_text().count("came back from a consumer that went away")
        assert counted == 0 if queue_type == "classic" else counted <= 2 * 3, counted
    finally:
        child.kill()
        await delete_all(
            channel, queues=[queue, parking, *(spec.name for spec in topology.queues())]
        )


async def test_a_consumer_not_cancelled_before_its_shutdown_is_cancelled_not_spun(
    channel: AbstractChannel, rabbitmq_url: str, unique: str
) -> None:
    queue_name = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=12)
    await channel.set_qos(prefetch_count=1)
    queue = await channel.declare_queue(
        queue_name, durable=True, arguments={"x-queue-type": "quorum"}
    )
    handled: list[bytes] = []

    @with_delayed_retry(topology=topology, crash_guard=CrashGuard())
    async def handle(message: AbstractIncomingMessage) -> None:
        handled.append(message.body)

    try:
        await consume(queue, handle)
        await handle.release_held()  # a shutdown begun without cancelling the consumer first
        await _publish(channel, queue_name, [f"m-{i}" for i in range(5)])

        async def stopped_and_waiting() -> bool:
            other = await aio_pika.connect(rabbitmq_url)  # a channel of its own: fresh counts
            try:
                declared = await (await other.channel()).declare_queue(queue_name, passive=True)
            finally:
                await other.close()
            result = declared.declaration_result
            return result.consumer_count == 0 and result.message_count == 5

        await wait_until(stopped_and_waiting, what="no consumer, the 5 messages waiting")
        assert handled == []
    finally:
        await delete_all(
            channel,
            queues=[
                queue_name,
                topology.default_parking_queue(queue_name),
                *(spec.name for spec in topology.queues()),
            ],
        )
