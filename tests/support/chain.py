"""Scenarios for the broker tests of the delay chain and the retry middleware.

A :class:`Scenario` is a topology and the queues of one test, deleted
afterwards; ``tests/conftest.py`` opens them as the ``scenario`` and
``quorum`` fixtures through :func:`open_scenario`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)

from delayed_retry import DelayTopology
from delayed_retry.chain.topology import QueueType
from tests.support.queues import delete_all, depth, wait_for_depth
from tests.support.waiting import WAIT


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
        """Messages ready in ``queue`` (see :func:`tests.support.queues.depth`)."""
        return await depth(self.connection, queue)

    async def wait_for_depth(self, queue: str, n: int, timeout: float = WAIT) -> None:
        """Wait until ``queue`` holds ``n`` ready messages (quorum queues count asynchronously)."""
        await wait_for_depth(self.connection, queue, n, timeout=timeout)

    async def close(self, url: str) -> None:
        """Delete the topology and every tracked queue and exchange, on a fresh connection."""
        conn = await aio_pika.connect(url)
        try:
            await delete_all(
                conn, topology=self.topology, queues=self._queues, exchanges=self._exchanges
            )
        finally:
            await conn.close()


async def publish(channel: AbstractChannel, routing_key: str, body: bytes, **props: Any) -> None:
    """Publish to the default exchange (straight into queue ``routing_key``), confirmed."""
    await channel.default_exchange.publish(aio_pika.Message(body, **props), routing_key)


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
