"""What a handler may do to its own message inside ``@with_delayed_retry``.

A wrapped handler gets a :class:`GuardedMessage`: the message itself, except
that a ``reject`` or ``nack`` is deferred until the handler finishes. So
aio-pika's ``async with message.process():``, which rejects on an exception
before the decorator sees it, no longer drops the message: if the handler
then raises, the failure is retried or parked like any other and the deferred
reject is dropped; if the handler returns normally, the deferred reject or nack
is sent as asked. An ``ack`` is sent at once: it says the work is done.
"""

from __future__ import annotations

import logging
from typing import Any

from aio_pika.abc import AbstractIncomingMessage, AbstractProcessContext
from aio_pika.exceptions import MessageProcessError
from aio_pika.message import ProcessContext

from delayed_retry.recovery.policy import Decision

__all__ = ["GuardedMessage", "DeferredSettlement"]

log = logging.getLogger(__name__)


class DeferredSettlement:
    """A reject or nack a handler asked for, not yet sent."""

    __slots__ = ("kind", "requeue")

    def __init__(self, kind: str, requeue: bool) -> None:
        self.kind = kind
        self.requeue = requeue

    def __repr__(self) -> str:
        return f"{self.kind}(requeue={self.requeue})"


class GuardedMessage:
    """The incoming message as a wrapped handler sees it; rejects and nacks are deferred.

    Everything else (body, headers, channel, ``ack``, ``info()``...) is the
    original message's. ``processed`` is true once the handler acked or asked
    for a reject or nack.
    """

    __slots__ = ("_acked", "deferred", "handed_over", "message")

    def __init__(self, message: AbstractIncomingMessage) -> None:
        self.message = message
        self.deferred: DeferredSettlement | None = None
        self._acked = False
        self.handed_over: Decision | None = None
        """After a failure: the retry or the parking carried out (confirmed, then acked)."""

    @property
    def acked(self) -> bool:
        """Whether the handler acked the message itself."""
        return self._acked

    @property
    def processed(self) -> bool:
        return self.deferred is not None or self.message.processed

    def _check_unsettled(self) -> None:
        if self.processed:
            raise MessageProcessError("Message already processed", self.message)

    async def ack(self, multiple: bool = False) -> None:
        self._check_unsettled()
        await self.message.ack(multiple=multiple)
        self._acked = True

    async def reject(self, requeue: bool = False) -> None:
        self._check_unsettled()
        self.deferred = DeferredSettlement("reject", requeue)

    async def nack(self, multiple: bool = False, requeue: bool = True) -> None:
        self._check_unsettled()
        if multiple:
            raise ValueError(
                "nack(multiple=True) inside @with_delayed_retry would settle other handlers' "
                "messages; nack only this one"
            )
        self.deferred = DeferredSettlement("nack", requeue)

    def process(
        self,
        requeue: bool = False,
        reject_on_redelivered: bool = False,
        ignore_processed: bool = False,
    ) -> AbstractProcessContext:
        return ProcessContext(
            self,  # type: ignore[arg-type]
            requeue=requeue,
            reject_on_redelivered=reject_on_redelivered,
            ignore_processed=ignore_processed,
        )

    async def send_deferred(self) -> None:
        """Send the reject or nack the handler asked for (after it returned normally)."""
        deferred = self.deferred
        deferred = self.deferred
        if deferred is None or self.message.processed:
            return
        if deferred.kind == "reject":
            await self.message.reject(requeue=deferred.requeue)
        else:
            await self.message.nack(requeue=deferred.requeue)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.message, name)

    def __repr__(self) -> str:
        return f"<GuardedMessage {self.message!r} deferred={self.deferred!r}>"


AbstractIncomingMessage.register(GuardedMessage)
