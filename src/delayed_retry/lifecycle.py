"""Started and stopped: the one shape of the library's long-running parts.

:class:`Lifecycle` gives a part with ``start()`` and ``stop()`` its ``async with`` form:
the chain monitor and the parking alerts.
"""

from __future__ import annotations

from typing import Self

__all__ = ["Lifecycle"]


class Lifecycle:
    """A part that runs until stopped: ``await part.start()`` and ``await part.stop()``, or
    ``async with part:``, which starts it and stops it on the way out, whatever happened."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
