"""A loopback TCP proxy to a broker that decodes every AMQP frame a client sends.

Use it to count what a client really puts on the wire (``queue.bind``,
``exchange.declare``…), per connection, rather than the Python calls that
may or may not send them; and to cut the connections, as a network fault does,
for a robust client to reconnect through it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from pamqp import commands
from pamqp import frame as amqp_frame
from pamqp.base import Frame
from pamqp.exceptions import UnmarshalingException


@dataclass
class ClientConnection:
    """What one client connection sent through the proxy: its method frames, in order."""

    number: int
    methods: list[Frame] = field(default_factory=list)

    def of(self, kind: type[Frame]) -> list[Frame]:
        """The methods of one kind (``commands.Queue.Bind``…) this connection sent."""
        return [method for method in self.methods if isinstance(method, kind)]


def _frames(buffer: bytearray) -> list[Frame]:
    """Decode and remove the complete frames at the start of ``buffer``; keep a partial one."""
    out = []
    while buffer:
        try:
            used, _channel, decoded = amqp_frame.unmarshal(bytes(buffer))
        except UnmarshalingException:
            break  # an incomplete frame: wait for the rest
        del buffer[:used]
        if isinstance(decoded, Frame):
            out.append(decoded)
    return out


class FrameCountingProxy:
    """Forwards TCP to ``host:port`` and records, per connection, the methods the client sends.

    ``cut_after_binds``: close a connection (both sides) as it sends that many
    ``queue.bind``/``exchange.bind`` methods, before the last one reaches the broker.
    """

    def __init__(self, host: str, port: int, *, cut_after_binds: int | None = None) -> None:
        self.target = (host, port)
        self.cut_after_binds = cut_after_binds
        self.connections: list[ClientConnection] = []
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self) -> None:
        """Close every open connection, both sides, as a network fault would."""
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        seen = ClientConnection(len(self.connections))
        self.connections.append(seen)
        broker_r, broker_w = await asyncio.open_connection(*self.target)
        self._writers += [client_w, broker_w]

        def close_both() -> None:
            client_w.close()
            broker_w.close()

        async def upstream() -> None:
            buffer = bytearray()
            binds = 0
            while data := await client_r.read(65536):
                buffer += data
                for method in _frames(buffer):
                    seen.methods.append(method)
                    if isinstance(method, commands.Queue.Bind | commands.Exchange.Bind):
                        binds += 1
                        if self.cut_after_binds is not None and binds >= self.cut_after_binds:
                            close_both()
                            return
                broker_w.write(data)
                await broker_w.drain()

        async def downstream() -> None:
            while data := await broker_r.read(65536):
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        self._tasks.update(tasks)
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
            self._tasks.discard(task)
        close_both()
