"""Short-lived channels: the one way the library opens a channel for a few operations; and
the aiormq channel or connection under an aio-pika one (:func:`underlay_channel`,
:func:`underlay_connection`).

A broker refusal (a passive declare of something missing, an inequivalent
argument) closes the channel it came on. Operations that may be refused, and
operations that must not disturb a caller's channel, run on a channel of
their own that is closed afterwards unless the broker closed it already.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import aiormq
import aiormq.abc
from pamqp import commands as amqp_commands

from delayed_retry.errors import ConfigurationError
from delayed_retry.rabbitmq.urls import vhost_of

__all__ = [
    "close_quietly",
    "connection_vhost",
    "declared_queue",
    "exchange_exists",
    "on_scratch_channel",
    "scratch_channel",
    "underlay_channel",
    "underlay_connection",
]

_T = TypeVar("_T")


async def close_quietly(channel: object | None) -> None:
    """Close ``channel`` (aio-pika or aiormq) unless it is missing or closed already."""
    if channel is None or getattr(channel, "is_closed", True):
        return
    close = getattr(channel, "close")  # noqa: B009 - both kinds have it; typed loosely here
    await close()


def connection_vhost(connection: object) -> str:
    """The vhost ``connection`` (aiormq or aio-pika) was opened on; ``/`` when it says none.

    Use it wherever a message tells an operator what to run on the broker, so the command
    acts on the vhost the library uses, not on ``/``.
    """
    url = getattr(connection, "url", None)
    return "/" if url is None else vhost_of(str(url))


@contextlib.asynccontextmanager
async def scratch_channel(
    connection: aiormq.abc.AbstractConnection, *, confirms: bool = False
) -> AsyncIterator[aiormq.abc.AbstractChannel]:
    """A new channel on ``connection`` for the block, closed after it (if still open).

    Use it for declarations, passive checks and ``basic.get`` peeks: a refusal
    closes only this channel. ``confirms=True`` opens it in confirm mode.
    """
    channel = await connection.channel(publisher_confirms=confirms)
    try:
        yield channel
    finally:
        await close_quietly(channel)


async def on_scratch_channel(
    connection: aiormq.abc.AbstractConnection,
    action: Callable[[aiormq.abc.AbstractChannel], Awaitable[_T]],
) -> _T:
    """Run ``action`` on a :func:`scratch_channel` of ``connection`` and return its result."""
    async with scratch_channel(connection) as channel:
        return await action(channel)


async def underlay_channel(channel: object) -> aiormq.abc.AbstractChannel:
    """The aiormq channel under an aio-pika channel (or the aiormq channel itself).

    Use it where the library needs what only aiormq offers (its connection, ``basic_get``
    with the raw frame); :func:`underlay_connection` is the same for a connection.
    """
    if isinstance(channel, aiormq.abc.AbstractChannel):
        return channel
    get = getattr(channel, "get_underlay_channel", None)
    if get is None:
        raise ConfigurationError(f"{channel!r} is not an aio-pika or aiormq channel")
    underlay: aiormq.abc.AbstractChannel = await get()
    return underlay


async def underlay_connection(connection: object) -> aiormq.abc.AbstractConnection:
    """The aiormq connection under an aio-pika connection (or the aiormq connection itself).

    Declarations are cached per aiormq connection: a robust connection's
    reconnect brings a new one, and with it a fresh cache.
    """
    if isinstance(connection, aiormq.abc.AbstractConnection):
        return connection
    transport = getattr(connection, "transport", None)  # aio-pika's UnderlayConnection
    if transport is not None and not transport.connection.is_closed:
        found: aiormq.abc.AbstractConnection = transport.connection
        return found
    channel = await connection.channel(publisher_confirms=False)  # type: ignore[attr-defined]
    try:
        underlay: aiormq.abc.AbstractChannel = await channel.get_underlay_channel()
        return underlay.connection
    finally:
        await close_quietly(channel)


async def declared_queue(connection: object, name: str) -> amqp_commands.Queue.DeclareOk | None:
    """The broker's answer to a passive declare of ``name``, or ``None`` if there is none.

    Use it for both counts (ready messages and consumers);
    :func:`~delayed_retry.admin.chain_probe.queue_depth` for the messages alone.
    ``connection``: aio-pika's or aiormq's. It runs on a scratch channel of its own.
    """

    async def declare(channel: aiormq.abc.AbstractChannel) -> amqp_commands.Queue.DeclareOk:
        return await channel.queue_declare(name, passive=True)

    try:
        return await on_scratch_channel(await underlay_connection(connection), declare)
    except aiormq.exceptions.ChannelNotFoundEntity:
        return None


async def exchange_exists(connection: object, name: str) -> bool:
    """Whether exchange ``name`` exists (a passive declare on a scratch channel of its own)."""
    try:
        await on_scratch_channel(
            await underlay_connection(connection),
            lambda channel: channel.exchange_declare(name, passive=True),
        )
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    return True
