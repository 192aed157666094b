"""A fake channel and message for fast tests of a retrying handler, without a broker.

Use it to test what a decorated handler does with each outcome of a
hand-over (confirm, nack, return, timeout, an error) in milliseconds; use a
real broker for what only a broker can show: routing through the chain,
delivery limits, restarts.

The message is a real :class:`aio_pika.IncomingMessage` built on a
:class:`FakeChannel`, so ``message.process()``, ``ack``/``nack``/``reject``
and the closed-channel errors behave as aio-pika's own. The channel records
every publish, ack, nack and reject, and answers publishes with what the
test queued in :attr:`FakeChannel.answers` (default: ``"ack"``)::

    channel = FakeChannel()
    channel.answers.append("nack")
    message = fake_message(channel, body=b"x")
    await handler(message)
    assert channel.settlements == [("nack", message.delivery_tag, True)]
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import aio_pika
import aiormq
from aiormq.abc import DeliveredMessage
from pamqp import commands as spec
from pamqp.header import ContentHeader

__all__ = [
    "Answer",
    "FakeChannel",
    "FakeConnection",
    "Published",
    "fake_message",
]

Answer = Literal["ack", "nack", "return", "timeout", "closed"] | BaseException
"""How :class:`FakeChannel` answers one publish: a confirm, a nack, a return
(unroutable), a timeout, the channel closing under it, or raising the exception given."""


@dataclass(frozen=True)
class Published:
    """One publish the fake channel saw, with the answer it gave."""

    exchange: str
    routing_key: str
    body: bytes
    properties: spec.Basic.Properties
    answer: str

    @property
    def headers(self) -> dict[str, Any]:
        return dict(self.properties.headers or {})


@dataclass(eq=False)
class FakeConnection:
    """The connection of one or more :class:`FakeChannel`; counts the channels opened on it."""

    server_properties: dict[str, Any] = field(default_factory=lambda: {"version": "3.10.8"})
    channels_opened: int = 0
    open_channels: int = 0
    max_open_channels: int = 0
    declared: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    fail_declare: BaseException | None = None
    """Raised by every declaration on this connection's channels while set."""
    basic_nack: bool = True

    async def channel(self, *, publisher_confirms: bool = True, **_: Any) -> FakeChannel:
        """A new fake channel (the library opens them for declarations)."""
        self.channels_opened += 1
        self.open_channels += 1
        self.max_open_channels = max(self.max_open_channels, self.open_channels)
        return FakeChannel(connection=self, publisher_confirms=publisher_confirms)


class FakeChannel:
    """An aiormq-like channel that records what a handler does and answers publishes as told.

    ``answers`` is consumed one per publish; when empty, ``default_answer``
    applies. Every publish lands in :attr:`published`, every ack/nack/reject
    in :attr:`settlements` as ``(kind, delivery_tag, requeue)``.
    """

    def __init__(
        self,
        *,
        connection: FakeConnection | None = None,
        publisher_confirms: bool = True,
        default_answer: Answer = "ack",
    ) -> None:
        self.connection: Any = connection or FakeConnection()
        self.publisher_confirms = publisher_confirms
        self.default_answer: Answer = default_answer
        self.answers: deque[Answer] = deque()
        self.published: list[Published] = []
        self.settlements: list[tuple[str, int, bool]] = []
        self.is_closed = False
        self.number = next(_numbers)
        self.publish_gate: asyncio.Event | None = None
        """When set, publishes wait for this event before answering (to hold them in flight)."""
        self.in_flight = 0
        self.max_in_flight = 0

    # --- what the library and aio-pika call ----------------------------------

    async def basic_publish(
        self,
        body: bytes,
        *,
        exchange: str = "",
        routing_key: str = "",
        properties: spec.Basic.Properties | None = None,
        mandatory: bool = False,
        immediate: bool = False,
        timeout: float | None = None,
        wait: bool = True,
    ) -> Any:
        self._check_open()
        answer = self.answers.popleft() if self.answers else self.default_answer
        props = properties or spec.Basic.Properties()
        self.published.append(
            Published(
                exchange,
                routing_key,
                body,
                props,
                answer if isinstance(answer, str) else repr(answer),
            )
        )
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.publish_gate is not None:
                await self.publish_gate.wait()
        finally:
            self.in_flight -= 1
        if isinstance(answer, BaseException):
            raise answer
        if answer == "ack":
            return spec.Basic.Ack(delivery_tag=len(self.published))
        if answer == "nack":
            return spec.Basic.Nack(delivery_tag=len(self.published))
        if answer == "return":
            return DeliveredMessage(
                delivery=spec.Basic.Return(
                    reply_code=312,
                    reply_text="NO_ROUTE",
                    exchange=exchange,
                    routing_key=routing_key,
                ),
                header=ContentHeader(properties=props, body_size=len(body)),
                body=body,
                channel=cast(Any, self),
            )
        if answer == "timeout":
            raise TimeoutError
        if answer == "closed":
            self.is_closed = True
            raise aiormq.exceptions.ChannelInvalidStateError("channel closed")
        raise ValueError(f"unknown fake publish answer {answer!r}")

    async def basic_ack(self, delivery_tag: int, multiple: bool = False, wait: bool = True) -> None:
        self._check_open()
        self.settlements.append(("ack", delivery_tag, False))

    async def basic_nack(
        self,
        delivery_tag: int,
        multiple: bool = False,
        requeue: bool = True,
        wait: bool = True,
    ) -> None:
        self._check_open()
        self.settlements.append(("nack", delivery_tag, requeue))

    async def basic_reject(
        self, delivery_tag: int, *, requeue: bool = True, wait: bool = True
    ) -> None:
        self._check_open()
        self.settlements.append(("reject", delivery_tag, requeue))

    async def _declare(self, kind: str, name: str, arguments: Mapping[str, Any] | None) -> None:
        self._check_open()
        await asyncio.sleep(0)  # a round trip: let concurrent callers interleave, as on a broker
        failure = self.connection.fail_declare
        if failure is not None:
            raise failure
        self.connection.declared.append((kind, name, dict(arguments or {})))

    async def exchange_declare(self, exchange: str = "", **kwargs: Any) -> None:
        await self._declare("exchange", exchange, kwargs.get("arguments"))

    async def exchange_bind(
        self, destination: str = "", source: str = "", routing_key: str = "", **_: Any
    ) -> None:
        await self._declare("exchange-binding", f"{source}->{destination}", {"key": routing_key})

    async def exchange_unbind(
        self, destination: str = "", source: str = "", routing_key: str = "", **_: Any
    ) -> None:
        await self._declare("exchange-unbinding", f"{source}->{destination}", {"key": routing_key})

    async def queue_declare(self, queue: str = "", **kwargs: Any) -> None:
        await self._declare("queue", queue, kwargs.get("arguments"))

    async def queue_bind(
        self, queue: str = "", exchange: str = "", routing_key: str = "", **_: Any
    ) -> None:
        await self._declare("queue-binding", f"{exchange}->{queue}", {"key": routing_key})

    async def close(self, exc: Any = None, *, timeout: Any = None) -> None:
        if not self.is_closed:
            self.is_closed = True
            connection = self.connection
            if isinstance(connection, FakeConnection):
                connection.open_channels -= 1

    def _check_open(self) -> None:
        if self.is_closed:
            raise aiormq.exceptions.ChannelInvalidStateError(f"fake channel {self.number} closed")

    # --- for tests -----------------------------------------------------------

    def settlement_of(self, message: aio_pika.IncomingMessage) -> list[tuple[str, bool]]:
        """How ``message`` was settled on this channel: ``[("ack", False)]`` and so on."""
        tag = message.delivery_tag
        return [(kind, requeue) for kind, seen, requeue in self.settlements if seen == tag]

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"FakeChannel does not implement {name!r}")


aiormq.abc.AbstractChannel.register(FakeChannel)

_numbers = itertools.count(1)
_tags = itertools.count(1)


def fake_message(
    channel: FakeChannel,
    *,
    body: bytes = b"{}",
    headers: Mapping[str, Any] | None = None,
    message_id: str | None = "m-1",
    exchange: str = "",
    routing_key: str = "work",
    redelivered: bool = False,
    no_ack: bool = False,
) -> aio_pika.IncomingMessage:
    """A real aio-pika incoming message delivered on ``channel`` (a fresh delivery tag each)."""
    deliver = spec.Basic.Deliver(
        consumer_tag="fake",
        delivery_tag=next(_tags),
        redelivered=redelivered,
        exchange=exchange,
        routing_key=routing_key,
    )
    properties = spec.Basic.Properties(
        headers=dict(headers or {}), message_id=message_id, delivery_mode=2
    )
    delivered = DeliveredMessage(
        delivery=deliver,
        header=ContentHeader(properties=properties, body_size=len(body)),
        body=body,
        channel=cast(Any, channel),
    )
    return aio_pika.IncomingMessage(delivered, no_ack=no_ack)
