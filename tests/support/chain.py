"""Helpers for the broker tests of the delay chain and the retry middleware.

Not fixtures: each test module wraps :class:`Scenario` in its own small
fixture, so a test reads top to bottom without a hidden conftest.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aio_pika
import aiormq
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from delayed_retry import DelayTopology
from delayed_retry.topology import QueueType

WAIT = 15.0
"""Generous upper bound for anything a test waits for: a bug fails, a slow machine does not."""


@dataclass(frozen=True)
class Arrival:
    """A delivery and the wall-clock time (epoch seconds) it reached the consumer."""

    at: float
    message: AbstractIncomingMessage

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.message.headers or {})


class Inbox:
    """A consumer callback that acks and records each delivery, to be awaited one by one."""

    def __init__(self, *, ack: bool = True) -> None:
        self._arrivals: asyncio.Queue[Arrival] = asyncio.Queue()
        self._ack = ack

    async def __call__(self, message: AbstractIncomingMessage) -> None:
        self._arrivals.put_nowait(Arrival(time.time(), message))
        if self._ack:
            await message.ack()

    async def get(self, timeout: float = WAIT) -> Arrival:
        return await asyncio.wait_for(self._arrivals.get(), timeout)

    async def take(self, n: int, timeout: float = WAIT) -> list[Arrival]:
        return [await self.get(timeout) for _ in range(n)]

    def pending(self) -> int:
        return self._arrivals.qsize()


class Scenario:
    """A unique topology and the queues of one test, all deleted afterwards."""

    def __init__(
        self, connection: AbstractRobustConnection, unique: str, topology: DelayTopology
    ) -> None:
        self.connection = connection
        self.unique = unique
        self.topology = topology
        self.channel: AbstractChannel | None = None
        self._queues: list[str] = []
        self._exchanges: list[str] = []

    async def open(self) -> AbstractChannel:
        self.channel = await self.connection.channel()
        return self.channel

    @property
    def ch(self) -> AbstractChannel:
        assert self.channel is not None
        return self.channel

    def name(self, suffix: str) -> str:
        return f"{self.unique}.{suffix}"

    async def queue(
        self,
        suffix: str = "q",
        *,
        queue_type: str = "quorum",
        channel: AbstractChannel | None = None,
    ) -> AbstractQueue:
        """Declare a durable queue named after the test, remembered for deletion."""
        name = self.name(suffix)
        self.track_queue(name, self.topology.default_parking_queue(name))
        return await (channel or self.ch).declare_queue(
            name, durable=True, arguments={"x-queue-type": queue_type}
        )

    def track_queue(self, *names: str) -> None:
        self._queues.extend(names)

    def track_exchange(self, *names: str) -> None:
        self._exchanges.extend(names)

    async def depth(self, queue: str) -> int:
        """Messages ready in ``queue``, through a passive declare on a channel of its own."""
        channel = await self.connection.channel()
        try:
            q = await channel.declare_queue(queue, passive=True)
            count = q.declaration_result.message_count
            assert count is not None
            return count
        finally:
            await channel.close()

    async def wait_for_depth(self, queue: str, n: int, timeout: float = WAIT) -> None:
        """Poll until ``queue`` holds ``n`` ready messages (quorum queues count asynchronously)."""
        deadline = time.monotonic() + timeout
        while (got := await self.depth(queue)) != n:
            if time.monotonic() > deadline:
                raise AssertionError(f"queue {queue!r} holds {got} messages, expected {n}")
            await asyncio.sleep(0.05)

    async def close(self, url: str) -> None:
        """Delete the topology and every tracked queue and exchange, on a fresh connection."""
        conn = await aio_pika.connect(url)
        try:
            channel = await conn.channel()
            names = [q.name for q in self.topology.queues()]
            for name in [*names, *self._queues]:
                try:
                    await channel.queue_delete(name)
                except aiormq.exceptions.ChannelClosed:
                    channel = await conn.channel()
            for spec in self.topology.exchanges():
                await channel.exchange_delete(spec.name)
            for name in self._exchanges:
                await channel.exchange_delete(name)
        finally:
            await conn.close()


async def publish(channel: AbstractChannel, routing_key: str, body: bytes, **props: Any) -> None:
    """Publish to the default exchange (straight into queue ``routing_key``), confirmed."""
    await channel.default_exchange.publish(aio_pika.Message(body, **props), routing_key)


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = WAIT) -> None:
    """Wait until ``check()`` is true, polling; for broker state with no event to await."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{check!r} still false after {timeout} s")
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def open_scenario(
    connection: AbstractRobustConnection,
    unique: str,
    rabbitmq_url: str,
    queue_type: QueueType,
    *,
    levels: int = 16,
) -> AsyncIterator[Scenario]:
    """A :class:`Scenario` on a topology of its own (16 levels), cleaned up afterwards."""
    scenario = Scenario(
        connection, unique, DelayTopology(prefix=unique, levels=levels, queue_type=queue_type)
    )
    await scenario.open()
    try:
        yield scenario
    finally:
        await scenario.close(rabbitmq_url)
