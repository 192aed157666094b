"""Batched frame writes for bulk publishing: fewer socket writes, every message intact."""

from __future__ import annotations

import asyncio

import pytest
from aio_pika.abc import AbstractRobustConnection
from pamqp import commands as spec

from delayed_retry.amqp.batching import BatchingWriter, connect_batched
from delayed_retry.amqp.publish import publish_confirmed


async def _loopback() -> tuple[asyncio.StreamWriter, asyncio.Future[bytes], asyncio.Server]:
    """A writer to a server on 127.0.0.1, and what the server read until the writer closed."""
    received: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.set_result(await reader.read())
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    return writer, received, server


async def test_writes_of_one_turn_reach_the_transport_as_one() -> None:
    writer, received, server = await _loopback()
    batching = BatchingWriter(writer)
    for i in range(100):
        batching.write(b"frame-%03d;" % i)
    assert batching.transport_writes == 0  # nothing leaves before the turn ends
    await asyncio.sleep(0)
    assert batching.transport_writes == 1
    batching.write(b"last;")
    batching.close()  # closing sends what is pending
    assert batching.transport_writes == 2
    data = await asyncio.wait_for(received, 10)
    assert data == b"".join(b"frame-%03d;" % i for i in range(100)) + b"last;"
    server.close()


async def test_concurrent_confirmed_publishes_share_writes_and_all_arrive(
    rabbitmq_url: str, connection: AbstractRobustConnection, unique: str
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique, durable=True)
    batched = await connect_batched(rabbitmq_url, timeout=30)
    try:
        publisher = await batched.channel(publisher_confirms=True)
        await asyncio.gather(
            *(
                publish_confirmed(
                    publisher,
                    exchange="",
                    routing_key=unique,
                    body=b"%d" % i,
                    properties=spec.Basic.Properties(delivery_mode=2),
                    wait_for_write=False,
                )
                for i in range(500)
            )
        )
    finally:
        await batched.close()
    bodies = []
    while (message := await queue.get(fail=False, no_ack=True)) is not None:
        bodies.append(int(message.body))
    assert bodies == list(range(500))  # all there, in publish order
    await queue.delete(if_unused=False, if_empty=False)


async def test_an_unroutable_mandatory_publish_still_fails(rabbitmq_url: str, unique: str) -> None:
    batched = await connect_batched(rabbitmq_url, timeout=30)
    try:
        publisher = await batched.channel(publisher_confirms=True)
        with pytest.raises(Exception, match="unroutable"):
            await publish_confirmed(
                publisher,
                exchange="",
                routing_key=f"{unique}-missing",
                body=b"x",
                properties=spec.Basic.Properties(),
                wait_for_write=False,
            )
    finally:
        await batched.close()


async def test_no_broker_is_a_clear_error() -> None:
    with pytest.raises(ConnectionError, match="Connect call failed"):
        await connect_batched("amqp://guest:guest@127.0.0.1:1/", timeout=5)
