"""The one way a test waits: for a condition, with a deadline, never for a fixed time."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable

WAIT = 15.0
"""Generous upper bound for anything a test waits for: a bug fails, a slow machine does not."""


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = WAIT,
    what: str | None = None,
    interval: float = 0.05,
) -> None:
    """Poll ``predicate`` (plain or async) until it is true; fail naming ``what`` after ``timeout``.

    Use it for broker state that has no event to await (queue depths, a
    consumer's ledger filled from another task); await the event itself when
    there is one.
    """

    async def poll() -> None:
        while True:
            result = predicate()
            if inspect.isawaitable(result):
                result = await result
            if result:
                return
            await asyncio.sleep(interval)

    try:
        await asyncio.wait_for(poll(), timeout)
    except TimeoutError:
        described = what or getattr(predicate, "__qualname__", repr(predicate))
        raise AssertionError(f"timed out after {timeout} s waiting for {described}") from None
