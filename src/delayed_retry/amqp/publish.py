"""Publish with publisher confirms, and nothing else: the one place messages leave.

Every hand-over of a message (into the delay chain, to parking) goes through
:func:`publish_confirmed`, which returns only once the broker has confirmed
the publish and raises otherwise. Callers ack the original only after it
returns: at-least-once.
"""

from __future__ import annotations

import asyncio
import struct
import weakref
from collections.abc import Awaitable, Mapping
from typing import Any, Protocol

import aiormq
import aiormq.abc
from pamqp import commands as spec
from pamqp import frame as amqp_frame
from pamqp.header import ContentHeader

from delayed_retry.errors import (
    ConfigurationError,
    PublishError,
    PublishNotConfirmedError,
    PublishTimeoutError,
)

__all__ = [
    "DEFAULT_PUBLISH_TIMEOUT",
    "Publisher",
    "check_header_size",
    "copy_properties",
    "publish_confirmed",
    "publish_copy",
]


DEFAULT_PUBLISH_TIMEOUT = 30.0
"""Seconds to wait for a publisher confirm before giving up on a publish."""

_NO_WAIT: dict[str, Any] = {"wait": False}

DEFAULT_FRAME_MAX = 131072
"""RabbitMQ's default ``frame_max``, used when the connection does not say."""


def check_header_size(
    channel: aiormq.abc.AbstractChannel, body: bytes, properties: spec.Basic.Properties
) -> None:
    """Raise ``ValueError`` when the properties do not fit in one frame of the connection.

    AMQP 0-9-1 carries all properties and headers in a single content-header
    frame; the broker closes the whole *connection* (``FRAME_ERROR``) on a
    larger one. Checked before publishing so that a message whose headers grew
    past the limit fails alone, instead of taking down the consumer's connection
    at every redelivery.
    """
    tune = getattr(getattr(channel, "connection", None), "connection_tune", None)
    frame_max = getattr(tune, "frame_max", None) or DEFAULT_FRAME_MAX
    # Encoding takes no more than 4 bytes per character of the headers' repr (a byte of
    # bytes is 4 repr characters, a character at most 4 UTF-8 bytes), plus the fixed
    # fields (at most 4 KiB): most messages are far below the limit and skip a second encoding.
    if 4 * len(repr(properties.headers)) + 4096 < frame_max:
        return
    size = len(amqp_frame.marshal(ContentHeader(0, len(body), properties), 1))
    if size > frame_max:
        raise ValueError(
            f"message properties and headers take {size} bytes, more than the connection's "
            f"frame_max of {frame_max}; make the headers smaller"
        )


def copy_properties(
    properties: spec.Basic.Properties | None,
    headers: Mapping[str, Any],
    *,
    keep_delivery_mode: bool = False,
) -> spec.Basic.Properties:
    """Properties for a re-published copy: persistent, new headers, no expiration, no user-id.

    ``expiration`` would cut a delay short (the lower of queue TTL and message
    TTL wins); ``user_id`` must match the publishing connection's user or the
    broker refuses the publish. ``keep_delivery_mode`` keeps the producer's
    delivery mode instead of making the copy persistent: for copies on their
    way to the producer's own destination (the front door and the forwarder),
    where a transient message should arrive transient, as the delayed-message
    plugin delivers it. The chain's quorum queues keep every message on disk
    whatever its mode, so only a classic chain would lose a transient copy in a
    broker restart.
    """
    p = properties or spec.Basic.Properties()
    return spec.Basic.Properties(
        content_type=p.content_type,
        content_encoding=p.content_encoding,
        headers=dict(headers),
        delivery_mode=p.delivery_mode if keep_delivery_mode else 2,
        priority=p.priority,
        correlation_id=p.correlation_id,
        reply_to=p.reply_to,
        message_id=p.message_id,
        timestamp=p.timestamp,
        message_type=p.message_type,
        app_id=p.app_id,
    )


_in_flight: weakref.WeakKeyDictionary[Any, dict[str, asyncio.Future[None]]] = (
    weakref.WeakKeyDictionary()
)


class _OnePerMessageId:
    """Hold back a publish while another with the same ``message_id`` awaits its confirm.

    aiormq matches a ``basic.return`` to its publish by ``message_id``: with
    two in flight on one channel, a return of the first would fail the second
    and the first would read its ack as a confirm. Copies keep the original's
    id, so two hand-overs of one message (a duplicate delivery) could do that.
    A class rather than a generator-based context manager: every hand-over
    enters one, and a generator costs an async generator and its finalizer each time.
    """

    __slots__ = ("_channel", "_ids", "_message_id", "_mine")

    def __init__(self, channel: Any, message_id: str | None) -> None:
        self._channel = channel
        self._message_id = message_id
        self._ids: dict[str, asyncio.Future[None]] | None = None
        self._mine: asyncio.Future[None] | None = None

    async def __aenter__(self) -> None:
        message_id = self._message_id
        if not message_id:
            return
        try:
            # get first: setdefault would build a dict and a weak reference with a callback
            # on every publish, and the channel's dict exists after its first one.
            ids = _in_flight.get(self._channel)
            if ids is None:
                ids = _in_flight.setdefault(self._channel, {})
        except TypeError:  # a channel that cannot be weakly referenced: nothing to share
            return
        while (busy := ids.get(message_id)) is not None:
            await asyncio.shield(busy)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ids[message_id] = mine
        self._ids, self._mine = ids, mine

    async def __aexit__(self, *exc_info: object) -> None:
        mine = self._mine
        if mine is not None:
            assert self._ids is not None and self._message_id is not None
            del self._ids[self._message_id]
            mine.set_result(None)


async def publish_confirmed(
    channel: aiormq.abc.AbstractChannel,
    *,
    exchange: str,
    routing_key: str,
    body: bytes,
    properties: spec.Basic.Properties,
    timeout: float = DEFAULT_PUBLISH_TIMEOUT,
    wait_for_write: bool = True,
    mandatory: bool = True,
) -> None:
    """Publish and wait for the broker's confirm; raise :class:`PublishError` if there is none.

    ``mandatory=False`` lets a message that no queue receives be confirmed and dropped by
    the broker (an event nobody subscribes to yet) instead of refused.
    ``wait_for_write=False`` releases the channel as soon as the frames are
    queued rather than once they reach the socket, so concurrent publishes
    can share a write (see :mod:`delayed_retry.amqp.batching`); the confirm is
    awaited either way.

    Raises :class:`PublishNotConfirmedError` on a nack or a return,
    :class:`PublishTimeoutError` when no confirm arrives within ``timeout``
    seconds, :class:`PublishError` when the channel closes meanwhile, and
    :class:`ConfigurationError` when the channel is not in confirm mode.
    """
    if not getattr(channel, "publisher_confirms", False):
        raise ConfigurationError(
            "the channel has no publisher confirms, so delayed-retry cannot know when a "
            "message is safely handed over; open it with channel(publisher_confirms=True)"
        )
    try:
        check_header_size(channel, body, properties)
        async with _OnePerMessageId(channel, properties.message_id):
            result = await channel.basic_publish(
                body,
                exchange=exchange,
                routing_key=routing_key,
                properties=properties,
                mandatory=mandatory,
                timeout=timeout,
                # aiormq's Channel takes ``wait``; its abstract interface does not say so.
                **({} if wait_for_write else _NO_WAIT),
            )
    except _NOT_PUBLISHED as exc:
        raise _why_not_published(exc, exchange, routing_key, timeout) from exc
    if isinstance(result, spec.Basic.Ack):
        return
    if isinstance(result, spec.Basic.Nack):
        raise PublishNotConfirmedError(f"the broker nacked a publish to exchange {exchange!r}")
    raise PublishNotConfirmedError(
        f"exchange {exchange!r} returned the message as unroutable (key {routing_key!r}); "
        "is its alternate exchange missing?"
    )


_NOT_PUBLISHED = (
    TimeoutError,
    aiormq.exceptions.AMQPError,
    ConnectionError,
    RuntimeError,
    TypeError,
    ValueError,
    struct.error,
    OverflowError,
)
"""What a publish raises when the message did not reach the broker, or was refused."""


def _why_not_published(
    exc: BaseException, exchange: str, routing_key: str, timeout: float
) -> PublishError:
    """The :class:`PublishError` that says why a publish to ``exchange`` got no confirm."""
    if isinstance(exc, TimeoutError):
        return PublishTimeoutError(
            f"no publisher confirm within {timeout} s for a publish to exchange {exchange!r}"
        )
    if isinstance(exc, aiormq.exceptions.PublishError):
        return PublishNotConfirmedError(
            f"exchange {exchange!r} returned the message as unroutable (key {routing_key!r})"
        )
    if isinstance(exc, aiormq.exceptions.DeliveryError):
        return PublishNotConfirmedError(
            f"the broker nacked a publish to exchange {exchange!r} (a full queue with "
            "reject-publish overflow, or an internal error)"
        )
    if isinstance(exc, aiormq.exceptions.AMQPError | ConnectionError | RuntimeError):
        return PublishError(f"publish to exchange {exchange!r} failed before a confirm: {exc!r}")
    return PublishError(f"the message could not be encoded for exchange {exchange!r}: {exc}")


class Publisher(Protocol):
    """What publishes with confirms: :func:`publish_confirmed`, or another with its contract.

    Consumers are built with one (``publish=publish_confirmed``) and call it for
    every hand-over: passed in rather than looked up, so whoever builds a consumer
    decides how its copies leave (one that fails or records shows what a
    hand-over does when the broker refuses, with no module patched).
    """

    async def __call__(
        self,
        channel: aiormq.abc.AbstractChannel,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: spec.Basic.Properties,
        timeout: float = DEFAULT_PUBLISH_TIMEOUT,
    ) -> None: ...


class Copyable(Protocol):
    """A message whose body and properties can be copied: incoming or outgoing."""

    @property
    def body(self) -> bytes: ...

    @property
    def properties(self) -> spec.Basic.Properties: ...


def publish_copy(
    channel: aiormq.abc.AbstractChannel,
    message: Copyable,
    *,
    exchange: str,
    routing_key: str,
    headers: Mapping[str, Any],
    timeout: float = DEFAULT_PUBLISH_TIMEOUT,
    keep_delivery_mode: bool = False,
    publish: Publisher = publish_confirmed,
) -> Awaitable[None]:
    """Publish a persistent copy of ``message`` with ``headers``; await it for the confirm.

    The one way a copy is built: it keeps the body and properties (see
    :func:`copy_properties`, which also says when to pass
    ``keep_delivery_mode``). ``publish`` is the consumer's publisher; awaiting
    raises like :func:`publish_confirmed`. Into the chain, use
    :func:`~delayed_retry.amqp.chain.send_into_chain` instead. A plain function
    returning the publisher's awaitable: every retry and parking calls it.
    """
    return publish(
        channel,
        exchange=exchange,
        routing_key=routing_key,
        body=message.body,
        properties=copy_properties(
            message.properties, headers, keep_delivery_mode=keep_delivery_mode
        ),
        timeout=timeout,
    )
