"""The consumer's connection cut in the middle of publishing a retry into the chain.

A TCP proxy between consumer and broker cuts the connection at the exact
moment: either as the consumer sends the publish (the broker never sees it),
or after the broker has taken the copy but before its confirm reaches the
consumer. In both cases the original is not acked and comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DelayTopology, consume, current_retry_state, with_delayed_retry
from tests.support.queues import delete_all
from tests.support.waiting import wait_until

from ._support import QUORUM, Ledger, publish_ids

MESSAGES = 20


class CuttingProxy:
    """Forwards TCP to the broker; once armed, cuts the first connection that sends ``pattern``.

    ``mode="before"``: the chunk holding the pattern is dropped and both sides closed.
    ``mode="after"``: the chunk is forwarded; the broker's next answer (the confirm)
    is dropped and both sides closed.
    """

    def __init__(self, host: str, port: int, *, mode: str) -> None:
        self.target = (host, port)
        self.mode = mode
        self.pattern: bytes | None = None
        self.cuts = 0
        self.connections = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def arm(self, pattern: bytes) -> None:
        self.pattern = pattern

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in self._writers:
            writer.close()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        broker_r, broker_w = await asyncio.open_connection(*self.target)
        self._writers += [client_w, broker_w]
        cut = asyncio.Event()
        sent_publish = asyncio.Event()

        def close_both() -> None:
            cut.set()
            client_w.close()
            broker_w.close()

        async def upstream() -> None:
            while data := await client_r.read(65536):
                if self.pattern is not None and self.pattern in data and not self.cuts:
                    self.cuts += 1
                    if self.mode == "before":
                        close_both()
                        return
                    sent_publish.set()
                broker_w.write(data)
                await broker_w.drain()

        async def downstream() -> None:
            while data := await broker_r.read(65536):
                if sent_publish.is_set():
                    close_both()  # the confirm is in ``data``: it never arrives
                    return
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.create_task(upstream()), asyncio.create_task(downstream())]
        with contextlib.suppress(Exception):
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (client_w, broker_w):
            writer.close()


@pytest.fixture
async def broker_channel(rabbitmq_url: str) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    connection = await aio_pika.connect_robust(rabbitmq_url)
    try:
        yield await connection.channel()
    finally:
        await connection.close()


@pytest.mark.parametrize("mode", ["before", "after"])
async def test_connection_cut_while_publishing_a_retry_redelivers_the_original(
    rabbitmq_url: str,
    broker_channel: aio_pika.abc.AbstractChannel,
    unique: str,
    mode: str,
) -> None:
    url = aio_pika.connection.make_url(rabbitmq_url)
    proxy = CuttingProxy(url.host or "127.0.0.1", url.port or 5672, mode=mode)
    await proxy.start()
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=12)
    ledger = Ledger(sent=set(range(MESSAGES)))
    first_attempts: Counter[int] = Counter()
    redelivered: Counter[int] = Counter()

    # hold=None: the retry enters the chain's levels (held, a 0.1 s retry would not).
    @with_delayed_retry(max_retries=3, wait=tenacity.wait_fixed(0.1), topology=topology, hold=None)
    async def handle(message: AbstractIncomingMessage) -> None:
        i = json.loads(message.body)["id"]
        state = current_retry_state()
        assert state is not None
        if state.attempt == 1:
            first_attempts[i] += 1
            redelivered[i] += bool(message.redelivered)
            raise RuntimeError("every message fails once")
        ledger.handled[i] += 1

    await broker_channel.declare_queue(queue, durable=True, arguments=QUORUM)
    consumer = await aio_pika.connect_robust(
        url.with_port(proxy.port).with_host("127.0.0.1"), reconnect_interval=0.5
    )
    try:
        channel = await consumer.channel()
        await channel.set_qos(prefetch_count=5)
        q = await channel.declare_queue(queue, passive=True)
        await consume(q, handle)
        # From now on, the first publish into the chain's levels is cut.
        proxy.arm(f"{unique}.level.".encode())
        await publish_ids(broker_channel, queue, sorted(ledger.sent))
        await wait_until(
            lambda: set(ledger.handled) >= ledger.sent,
            timeout=60,
            what="every message back from the chain and handled",
        )
        counts = ledger.report(f"connection-cut-{mode}-publish")
        assert proxy.cuts == 1
        assert proxy.connections >= 2, "the consumer did not reconnect after the cut"
        assert counts["lost"] == 0
        # The message whose hand-over was cut was not acked: it came back as a redelivery.
        assert sum(redelivered.values()) >= 1
        if mode == "after":
            # The broker had taken the copy: it arrives as well as the redelivered original.
            assert counts["duplicates"] >= 1
    finally:
        await consumer.close()
        await proxy.close()
        await delete_all(
            broker_channel,
            queues=[
                queue,
                topology.default_parking_queue(queue),
                *(spec.name for spec in topology.queues()),
            ],
        )
