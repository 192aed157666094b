"""An AMQP connection for bulk publishing: many publishes share one socket write.

aiormq hands each frame to the socket as it comes, so every publish costs a
``send`` system call, and on the broker a ``recv``: at a few thousand
publishes per second that is most of the CPU time of both. A
:func:`connect_batched` connection instead gathers the frames written during
one turn of the event loop and sends them together at its end, and lets more
frames wait for the writer. Nothing is delayed by more than that turn, and
flow control still comes from the socket.

Use it where one process publishes many messages concurrently with
confirms (bulk scheduling, redrive), together with
``publish_confirmed(..., wait_for_write=False)``, which lets concurrent
publishes queue their frames in the same turn. A consumer or a single
publisher gains nothing from it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import aiormq
from aiormq.connection import TCPTransportFactory, TLSTransportFactory, TransportFactory
from yarl import URL

__all__ = ["BatchingWriter", "connect_batched"]

FRAME_QUEUE = 4096
"""Frames that may wait for the connection's writer (aiormq's default is 10)."""


class BatchingWriter:
    """A stream writer that sends what was written during one event-loop turn as one write.

    Everything else (``drain``, ``transport``, ``is_closing`` …) is the
    wrapped :class:`asyncio.StreamWriter`'s.
    """

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._pending: list[bytes] = []
        self._scheduled = False
        self._loop = asyncio.get_running_loop()
        self.transport_writes = 0
        """How many writes reached the transport (each at most one ``send``)."""

    def write(self, data: bytes) -> None:
        self._pending.append(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, data: Any) -> None:
        for chunk in data:
            self.write(chunk)

    def flush(self) -> None:
        """Hand everything written so far to the transport (done at the end of each turn)."""
        self._scheduled = False
        if self._pending:
            data = b"".join(self._pending)
            self._pending.clear()
            self.transport_writes += 1
            self._writer.write(data)

    async def drain(self) -> None:
        self.flush()
        await self._writer.drain()

    def write_eof(self) -> None:
        self.flush()
        self._writer.write_eof()

    def close(self) -> None:
        self.flush()
        self._writer.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)


class _BatchingTransportFactory(TransportFactory):
    def __init__(self, inner: TransportFactory) -> None:
        self._inner = inner

    async def create(self, url: URL, **kwargs: Any) -> tuple[asyncio.StreamReader, Any]:
        reader, writer = await self._inner.create(url, **kwargs)
        return reader, BatchingWriter(writer)


class _BatchingConnection(aiormq.Connection):
    FRAME_BUFFER_SIZE = FRAME_QUEUE


async def connect_batched(url: str, *, timeout: float) -> aiormq.abc.AbstractConnection:
    """Open an aiormq connection whose frames are batched per event-loop turn.

    Raises what :func:`aiormq.connect` raises, or :class:`TimeoutError` after
    ``timeout`` seconds.
    """
    parsed = URL(url)
    inner = TLSTransportFactory() if parsed.scheme == "amqps" else TCPTransportFactory()
    connection = _BatchingConnection(url, transport_factory=_BatchingTransportFactory(inner))
    try:
        await asyncio.wait_for(connection.connect(), timeout)
    except BaseException:
        with contextlib.suppress(Exception):
            await connection.close()
        raise
    return connection
