"""Handlers running right now, so that a consumer can stop and let them finish first.

A service that stops (SIGTERM) cancels its consumers, then waits a bounded
time for the messages it is handing over: a message whose publish is
confirmed gets its ack instead of going back and coming twice. What does not
finish in time goes back to its queue when the channel closes: at least once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

__all__ = ["InFlight"]


class InFlight:
    """A count of handlers running now, and a wait until there are none.

    Use one per consumer object: wrap each delivery in :meth:`track`, and on
    shutdown cancel the consumer, then ``await in_flight.wait_idle(timeout)``
    before closing the channel.
    """

    __slots__ = ("_count", "_idle")

    def __init__(self) -> None:
        self._count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def __len__(self) -> int:
        return self._count

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count the handler running inside the ``with`` block."""
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if not self._count:
                self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for no handler to run; ``False`` if some still do."""
        if timeout <= 0:
            return not self._count
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout)
        return not self._count
