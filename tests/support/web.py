"""Helpers for the web view's tests: park real messages, serve the app on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from aiohttp import web
from tenacity import retry_if_exception_type

from delayed_retry import with_delayed_retry
from delayed_retry.web import WebSettings, create_app
from tests.support.chain import Scenario


class GatewayTimeout(Exception):
    """A failure the handler raises for ``timeout`` bodies."""


class CustomerMissing(Exception):
    """A failure the handler raises for ``missing`` bodies."""


class _NeverRetried(Exception):
    pass


@dataclass(frozen=True)
class Parked:
    """One message a test parked: its id and the failure it raised."""

    message_id: str
    kind: str
    order: int


async def park(
    scenario: Scenario, queue: str, kinds: Sequence[str], *, first_order: int = 100
) -> list[Parked]:
    """Publish one message per kind into ``queue`` and let a real consumer park each one.

    ``timeout`` raises :class:`GatewayTimeout` (``gateway did not answer in 10 s (order N)``),
    ``missing`` raises :class:`CustomerMissing`; nothing is retried, so each parks at once.
    Returns when the parking queue holds them all, with the consumer stopped.
    """
    channel = await scenario.connection.channel()
    declared = await channel.declare_queue(queue, durable=True)
    finished = asyncio.Event()
    handled = 0

    @with_delayed_retry(
        queue=queue,
        topology=scenario.topology,
        retry=retry_if_exception_type(_NeverRetried),
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        data = json.loads(message.body)
        if data["kind"] == "timeout":
            raise GatewayTimeout(f"gateway did not answer in 10 s (order {data['order']})")
        raise CustomerMissing(f"customer {data['order'] * 7} does not exist")

    async def counted(message: AbstractIncomingMessage) -> None:
        # The decorated handler returns once the parked copy is confirmed and the original acked.
        nonlocal handled
        await handle(message)
        handled += 1
        if handled == len(kinds):
            finished.set()

    tag = await declared.consume(counted)
    out = []
    for i, kind in enumerate(kinds):
        order = first_order + i
        message_id = f"{kind}-{order}"
        body = json.dumps({"kind": kind, "order": order, "note": "<b>not bold</b>"}).encode()
        await channel.default_exchange.publish(
            aio_pika.Message(
                body,
                message_id=message_id,
                content_type="application/json",
                headers={"x-note": "<img src=x onerror=alert(1)>"},
            ),
            routing_key=queue,
        )
        out.append(Parked(message_id, kind, order))
    await asyncio.wait_for(finished.wait(), 30)
    await declared.cancel(tag)
    await channel.close()
    return out


async def park_forever(scenario: Scenario, queue: str) -> Callable[[], Awaitable[None]]:
    """Consume ``queue`` with a handler that parks every message; returns its stop function."""
    channel = await scenario.connection.channel()
    declared = await channel.declare_queue(queue, durable=True)

    @with_delayed_retry(
        queue=queue, topology=scenario.topology, retry=retry_if_exception_type(_NeverRetried)
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        raise CustomerMissing("customer still does not exist")

    tag = await declared.consume(handle)

    async def stop() -> None:
        await declared.cancel(tag)
        await channel.close()

    return stop


async def ids_in(scenario: Scenario, queue: str) -> list[str]:
    """Message ids now in ``queue``; taken unacked on a channel of its own, then put back."""
    channel = await scenario.connection.channel()
    try:
        q = await channel.declare_queue(queue, passive=True)
        out = []
        while (message := await q.get(no_ack=False, fail=False)) is not None:
            out.append(message.message_id or "")
        return out
    finally:
        await channel.close()


@contextlib.asynccontextmanager
async def serve(settings: WebSettings, **kwargs: object) -> AsyncIterator[str]:
    """Run the web view on 127.0.0.1 on a free port; yields its base URL."""
    runner = web.AppRunner(
        create_app(settings, **kwargs),  # type: ignore[arg-type]
        access_log=None,
        shutdown_timeout=1,
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
