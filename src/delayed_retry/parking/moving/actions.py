"""What a move does to each parked message it selects: :class:`ReplayAction` (a confirmed
copy through the chain, then ack), :class:`PurgeAction` (ack), or any other
:class:`MessageAction` (:class:`~delayed_retry.parking.refresh.RefreshAction`).

Write a new :class:`MessageAction` for a new kind of move; the engine
(:func:`~delayed_retry.parking.moving.engine.move`) takes care of selecting, pacing and
running them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar, Literal, Protocol

import aiormq.abc

from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT, copy_properties, publish_confirmed
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.durations import utcnow
from delayed_retry.parking.records import replay_copy

__all__ = ["Channel", "Delivery", "MessageAction", "PurgeAction", "ReplayAction", "copy_then_ack"]

Channel = aiormq.abc.AbstractChannel
"""The move's own channel, on which a :class:`MessageAction` settles each message."""
Delivery = aiormq.abc.DeliveredMessage
"""A parked message as the move took it (unacked): what a :class:`MessageAction` settles."""


class MessageAction(Protocol):
    """What a move does to each selected message; it ends by acking the parked original."""

    @property
    def name(self) -> Literal["replay", "purge", "refresh"]: ...

    @property
    def confirms(self) -> bool:
        """Whether the channel must be in confirm mode (it publishes)."""
        ...

    @property
    def to_queue(self) -> str | None:
        """Where the messages go (``None``: nowhere)."""
        ...

    async def settle(self, own: Channel, got: Delivery, *, canary_token: str | None) -> None:
        """Act on ``got`` (taken unacked on ``own``) and ack it; raise to leave it parked."""
        ...


async def copy_then_ack(
    own: Channel,
    got: Delivery,
    *,
    exchange: str,
    routing_key: str,
    headers: dict[str, Any],
    timeout: float,
    body: bytes | None = None,
) -> None:
    """Publish ``got``'s body (or ``body``) and properties with ``headers``, confirmed, then
    ack ``got``.

    The order is the move's promise: the original goes only once the broker holds
    its copy, so a failure leaves it parked (at worst there twice, never lost).
    """
    await publish_confirmed(
        own,
        exchange=exchange,
        routing_key=routing_key,
        body=got.body if body is None else body,
        properties=copy_properties(got.header.properties, headers),
        timeout=timeout,
    )
    await own.basic_ack(got.delivery_tag or 0)


class PurgeAction:
    """Purge: ack the parked message, so the broker deletes it for good."""

    name: ClassVar[Literal["purge"]] = "purge"
    confirms: ClassVar[bool] = False
    to_queue: ClassVar[None] = None

    async def settle(self, own: Channel, got: Delivery, *, canary_token: str | None) -> None:
        await own.basic_ack(got.delivery_tag or 0)


@dataclass(frozen=True, kw_only=True)
class ReplayAction:
    """Replay: publish a copy through the chain to ``target``, due after ``delay`` seconds,
    with a fresh retry budget; ack the original only once the broker confirmed the copy."""

    topology: DelayTopology
    target: str
    delay: float = 0.0
    replayed_by: str | None = None
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT

    name: ClassVar[Literal["replay"]] = "replay"
    confirms: ClassVar[bool] = True

    @property
    def to_queue(self) -> str:
        return self.target

    async def settle(self, own: Channel, got: Delivery, *, canary_token: str | None) -> None:
        now = utcnow()
        headers, body = self.content(got, now=now)
        route, headers = replay_copy(
            headers,
            topology=self.topology,
            target=self.target,
            delay=self.delay,
            now=now,
            replayed_by=self.replayed_by,
            canary_token=canary_token,
        )
        await copy_then_ack(
            own,
            got,
            exchange=route.exchange,
            routing_key=route.routing_key,
            headers=headers,
            timeout=self.publish_timeout,
            body=body,
        )

    def content(
        self, got: Delivery, *, now: datetime
    ) -> tuple[Mapping[str, Any] | None, bytes | None]:
        """The headers and body the copy starts from: the parked message's own (``None``: the
        body unchanged). An edit and replay gives others."""
        del now
        return got.header.properties.headers, None
