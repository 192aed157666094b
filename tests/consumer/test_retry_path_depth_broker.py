"""The named steps a failing handler's retry or parking takes to ``basic_publish``.

A retry enters the chain through its one way in (``amqp.chain:send_into_chain``),
a parking through the parking step; the path reads as a list of named steps
(docs/architecture.md quotes it). The test wraps the consuming channel's
``basic_publish`` (aiormq, under aio-pika) and records the stack at the moment
the copy leaves, on a real broker.

To see the frames themselves::

    .venv/bin/pytest tests/consumer/test_retry_path_depth_broker.py -s -k chain

prints them (``-s``) as ``module:function`` from the outermost in.
"""

from __future__ import annotations

import asyncio
import traceback
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from tenacity import wait_fixed

import delayed_retry
from delayed_retry import DelayTopology, NoInstrumentation, consume, with_delayed_retry
from tests.support.failures import Flaky

pytestmark = pytest.mark.broker

RETRY_STEPS = [
    "consumer.handler:__call__",
    "consumer.handler:_handle",
    "consumer.handler:_attempt",
    "consumer.handler:_failed",
    "consumer.failures:failed",
    "consumer.handover:hand_over",
    "consumer.failures:_send",
    "consumer.failures:_retry",
    "amqp.chain:send_into_chain",
]
"""The steps of a retry from the handler's failure into the chain, outermost first."""

PACKAGE = Path(delayed_retry.__file__).parent


def library_frames(stack: traceback.StackSummary) -> list[str]:
    """The frames of ``stack`` that run the library's own code, outermost first."""
    frames = []
    for frame in stack:
        path = Path(frame.filename)
        if path.is_relative_to(PACKAGE):
            module = ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
            frames.append(f"{module}:{frame.name}")
    return frames


async def stack_at_publish(
    url: str,
    queue_name: str,
    topology: DelayTopology,
    **options: Any,
) -> tuple[list[str], str]:
    """Consume one failing message; the library frames and exchange of the first publish.

    On a connection of its own, closed at the end while the handler may still be retrying:
    a channel closed under a publish in flight would be a connection error for the
    fixture's connection, which cleans up after the test.
    """
    connection = await aio_pika.connect(url)
    try:
        return await _stack_at_publish(connection, queue_name, topology, **options)
    finally:
        await connection.close()


async def _stack_at_publish(
    connection: aio_pika.abc.AbstractConnection,
    queue_name: str,
    topology: DelayTopology,
    **options: Any,
) -> tuple[list[str], str]:
    channel = await connection.channel()
    queue = await channel.declare_queue(queue_name, durable=True)
    underlay = await channel.get_underlay_channel()
    seen: asyncio.Future[tuple[list[str], str]] = asyncio.get_running_loop().create_future()
    confirmed = asyncio.Event()
    real = underlay.basic_publish

    async def recording(*args: Any, **kwargs: Any) -> Any:
        if not seen.done():
            seen.set_result((library_frames(traceback.extract_stack()), kwargs.get("exchange", "")))
        try:
            return await real(*args, **kwargs)
        finally:
            confirmed.set()

    underlay.basic_publish = recording  # type: ignore[method-assign]

    @with_delayed_retry(topology=topology, instrumentation=NoInstrumentation(), **options)
    async def handle(message: AbstractIncomingMessage) -> None:
        raise Flaky("the database is down")

    await consume(queue, handle)
    producer = await connection.channel()  # not the consuming channel, whose publishes count
    await producer.default_exchange.publish(aio_pika.Message(b"x"), routing_key=queue_name)
    await producer.close()
    frames, exchange = await asyncio.wait_for(seen, 30)
    await asyncio.wait_for(confirmed.wait(), 30)
    print("\n".join(["", *frames]))
    return frames, exchange


async def test_a_retry_through_the_chain_is_shallow(
    rabbitmq_url: str, unique: str, topology: DelayTopology
) -> None:
    frames, exchange = await stack_at_publish(
        rabbitmq_url, f"{unique}.q", topology, max_retries=3, wait=wait_fixed(0.1), hold=None
    )
    assert exchange.startswith(f"{unique}.level."), exchange  # it did go into the chain
    assert frames[: len(RETRY_STEPS)] == RETRY_STEPS, frames
    assert frames[-1] == "amqp.publish:publish_confirmed", frames


async def test_a_retry_due_at_once_is_shallow(
    rabbitmq_url: str, unique: str, topology: DelayTopology
) -> None:
    frames, exchange = await stack_at_publish(
        rabbitmq_url, f"{unique}.q", topology, max_retries=3, wait=wait_fixed(0)
    )
    assert exchange == ""  # straight back to the queue
    assert frames[: len(RETRY_STEPS)] == RETRY_STEPS, frames  # by the same way in


async def test_a_parking_is_shallow(
    rabbitmq_url: str, unique: str, topology: DelayTopology
) -> None:
    frames, exchange = await stack_at_publish(rabbitmq_url, f"{unique}.q", topology, max_retries=0)
    assert exchange == topology.parking_exchange
    assert "consumer.failures:_park" in frames, frames
    assert "amqp.chain:send_into_chain" not in frames, frames
