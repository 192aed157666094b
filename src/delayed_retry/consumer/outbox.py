"""The outbox of one delivery: what its handler publishes leaves only when the handler succeeds.

With ``outbox=True``, a handler publishes through :func:`current_outbox`
instead of a channel: the messages are held in memory until the handler
returns, then published with confirms, in order, and only then is the
delivery acked (through the one hand-over,
:func:`~delayed_retry.consumer.handover.hand_over`). A failed run drops them.
Each held message gets a deterministic ``message_id`` (:func:`outbox_message_id`)
so that a repeat after a crash can be recognised downstream. What it
guarantees and what it does not: ``docs/outbox.md``.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiormq.abc
from aio_pika.abc import AbstractIncomingMessage, AbstractMessage
from pamqp import commands as spec

from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT, publish_confirmed
from delayed_retry.errors import ConfigurationError

__all__ = ["CURRENT_OUTBOX", "HeldPublish", "Outbox", "current_outbox", "outbox_message_id"]


def outbox_message_id(incoming_id: str | None, body: bytes, position: int) -> str:
    """The ``message_id`` of the ``position``-th (from 1) message a delivery's handler publishes.

    ``<incoming id>:outbox:<position>``: the same for every delivery of one
    message, so a consumer downstream can deduplicate. A message without an id
    is named by a digest of its body instead (two such messages with the same
    body then share ids: give messages ids).
    """
    source = incoming_id or "sha256-" + hashlib.sha256(body).hexdigest()[:32]
    return f"{source}:outbox:{position}"


@dataclass(frozen=True, slots=True)
class HeldPublish:
    """One publish held by an :class:`Outbox`: where it goes and what it carries."""

    exchange: str
    routing_key: str
    body: bytes
    properties: spec.Basic.Properties
    mandatory: bool = False


class Outbox:
    """The messages one handler run publishes, held until it succeeds.

    Get it with :func:`current_outbox` inside a handler wrapped with
    ``outbox=True``; the library releases it after the handler returns.
    """

    __slots__ = ("_incoming", "confirmed", "held", "released")

    def __init__(self, incoming: AbstractIncomingMessage) -> None:
        self._incoming = incoming
        self.held: list[HeldPublish] = []
        self.confirmed = 0
        """How many of :attr:`held` the broker confirmed: a retried release skips them."""
        self.released = False
        """Whether every held message was confirmed and the delivery acked after them."""

    def __repr__(self) -> str:
        return f"<Outbox of message {self._incoming.message_id} holding {len(self.held)}>"

    def publish(
        self,
        message: AbstractMessage | bytes,
        *,
        routing_key: str,
        exchange: str = "",
        headers: Mapping[str, Any] | None = None,
        mandatory: bool = False,
    ) -> str:
        """Hold ``message`` for ``exchange`` (default: the default exchange) and ``routing_key``.

        ``message`` is an ``aio_pika.Message`` (its properties are kept) or a
        body, sent persistent. Returns its ``message_id``: the one the message
        set, else :func:`outbox_message_id`. Nothing reaches the broker before
        the handler returns. ``mandatory=True``: a message no queue receives is refused, and
        the delivery waits for a route (the hand-over's rules) instead of being acked; leave
        it ``False`` for events that may have no subscriber yet, which the broker drops.
        """
        if isinstance(message, bytes):
            body = message
            properties = spec.Basic.Properties(delivery_mode=2, headers=dict(headers or {}))
        else:
            body = message.body
            properties = message.properties
            if headers is not None:
                properties.headers = {**(properties.headers or {}), **headers}
        if not properties.message_id:
            position = len(self.held) + 1
            properties.message_id = outbox_message_id(
                self._incoming.message_id, self._incoming.body, position
            )
        self.held.append(HeldPublish(exchange, routing_key, body, properties, mandatory))
        return properties.message_id

    async def release(
        self,
        channel: aiormq.abc.AbstractChannel,
        *,
        timeout: float = DEFAULT_PUBLISH_TIMEOUT,
    ) -> bool:
        """Publish the held messages not yet confirmed, in order, each confirmed before the next.

        Raises like :func:`~delayed_retry.amqp.publish.publish_confirmed` at the
        first one without a confirm; called again, it goes on from there. For
        :func:`~delayed_retry.consumer.handover.hand_over`, hence ``True``.
        """
        while self.confirmed < len(self.held):
            held = self.held[self.confirmed]
            await publish_confirmed(
                channel,
                exchange=held.exchange,
                routing_key=held.routing_key,
                body=held.body,
                properties=held.properties,
                timeout=timeout,
                mandatory=held.mandatory,
            )
            self.confirmed += 1
        return True


CURRENT_OUTBOX: contextvars.ContextVar[Outbox | None] = contextvars.ContextVar(
    "delayed_retry_outbox", default=None
)
"""The outbox of the handler run in this task; set around each run when ``outbox=True``."""


def current_outbox() -> Outbox:
    """The outbox of the delivery this task handles: publish through it to hold until success.

    Only inside a handler wrapped with ``outbox=True`` (``@with_delayed_retry``,
    ``consume``'s handler or FastStream's ``DelayedRetry``); publishes made on
    a channel directly are not held.
    """
    outbox = CURRENT_OUTBOX.get()
    if outbox is None:
        raise ConfigurationError(
            "current_outbox() was called outside a handler run with an outbox; pass "
            "outbox=True to @with_delayed_retry or DelayedRetry, and call it inside the handler"
        )
    return outbox
