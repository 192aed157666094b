"""Timed waits of unacked messages that a shutdown can end at once.

A handler keeps a message unacked while it waits: held until its due time
(:class:`~delayed_retry.consumer.hold.HeldUntilDue`) or pausing between
immediate runs (:class:`~delayed_retry.consumer.immediate.Pauses`). Both need
the same thing: wait a number of seconds, and let a stopping consumer end every
wait now so each message goes back to its queue instead of waiting out its time.
"""

from __future__ import annotations

import asyncio

__all__ = ["Waits"]


def _settle(future: asyncio.Future[bool], done: bool) -> None:
    if not future.done():
        future.set_result(done)


class Waits:
    """The waits one handler (and its copies for other queues) is in right now."""

    __slots__ = ("_waiting",)

    def __init__(self) -> None:
        self._waiting: set[asyncio.Future[bool]] = set()

    def __len__(self) -> int:
        return len(self._waiting)

    async def wait(self, seconds: float) -> bool:
        """Wait ``seconds``: ``True`` when the time is up, ``False`` when released before."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(seconds, _settle, future, True)
        self._waiting.add(future)
        try:
            return await future
        finally:
            timer.cancel()
            self._waiting.discard(future)

    def release(self) -> int:
        """End every wait now (each message goes back to its queue); returns how many."""
        waiting = list(self._waiting)
        for future in waiting:
            _settle(future, False)
        return len(waiting)
