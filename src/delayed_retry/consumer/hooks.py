"""``on_retry`` and ``on_park``: the application told of each retry and parking, afterwards.

A hook is called once the retry copy or the parking record is confirmed by
the broker and the original acked: what it is told has happened. It can
neither change nor delay what happens to the message. A hook that raises is
logged; one that takes longer than :data:`HOOK_TIMEOUT` is logged and no
longer waited for (an async hook is cancelled; a plain one runs in a daemon
thread of its own, which Python cannot stop, so it finishes there on its own).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.recovery.policy import Decision

__all__ = ["HOOK_TIMEOUT", "FailureEvent", "FailureHook", "FailureHooks"]

log = logging.getLogger(__name__)

HOOK_TIMEOUT = 5.0
"""Seconds a hook is waited for; the handler's slot is busy meanwhile (after the ack)."""


@dataclass(frozen=True, kw_only=True)
class FailureEvent:
    """What a hook is told: a message's failure, and what was done about it."""

    message: AbstractIncomingMessage
    """The delivery that failed (already acked: read it, do not settle it)."""
    queue: str
    state: RetryState
    """The retry state of the failed attempt (``attempt``, ``immediate_retries`` …)."""
    exception: BaseException
    decision: Decision
    """What was done: ``retry`` with its ``delay``, or ``park`` with its ``reason``."""


FailureHook = Callable[[FailureEvent], Awaitable[object] | object]
"""A plain or async callable taking a :class:`FailureEvent`."""


@dataclass(frozen=True, kw_only=True)
class FailureHooks:
    """The hooks of one handler; each is optional."""

    on_retry: FailureHook | None = None
    on_park: FailureHook | None = None
    timeout: float = HOOK_TIMEOUT

    def __post_init__(self) -> None:
        for name, hook in (("on_retry", self.on_retry), ("on_park", self.on_park)):
            if hook is not None and not callable(hook):
                raise ConfigurationError(
                    f"{name}={hook!r} is not callable; pass a function (plain or async) "
                    "taking one FailureEvent"
                )

    @property
    def any(self) -> bool:
        return self.on_retry is not None or self.on_park is not None

    async def notify(self, event: FailureEvent) -> None:
        """Call the hook for ``event.decision``, bounded by ``timeout``; never raises."""
        name = "on_retry" if event.decision.action == "retry" else "on_park"
        hook = self.on_retry if event.decision.action == "retry" else self.on_park
        if hook is None:
            return
        try:
            await asyncio.wait_for(_call(hook, event), self.timeout)
        except TimeoutError:
            log.error(
                "%s hook %r did not finish within %.1f s for message %s on queue %r; no longer "
                "waiting for it (the message was %s already)",
                name,
                hook,
                self.timeout,
                event.message.message_id,
                event.queue,
                "retried" if event.decision.action == "retry" else "parked",
            )
        except Exception:
            log.exception(
                "%s hook %r raised for message %s on queue %r; ignored (the message was %s "
                "already)",
                name,
                hook,
                event.message.message_id,
                event.queue,
                "retried" if event.decision.action == "retry" else "parked",
            )


async def _call(hook: FailureHook, event: FailureEvent) -> None:
    if inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
        getattr(hook, "__call__", None)  # noqa: B004
    ):
        await hook(event)  # type: ignore[misc]
        return
    result = await _in_thread(hook, event)
    if inspect.isawaitable(result):
        await result


def _in_thread(hook: FailureHook, event: FailureEvent) -> asyncio.Future[object]:
    """Run a plain hook in a daemon thread of its own.

    Not the loop's default executor: a hook that never returns would occupy
    one of its few workers for good, and keep ``asyncio.run`` from ending.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[object] = loop.create_future()

    def settle(result: object, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result: object = None
        error: BaseException | None = None
        try:
            result = hook(event)
        except BaseException as err:  # handed to the loop, logged there
            error = err
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=run, name=f"delayed-retry hook {hook!r:.40}", daemon=True).start()
    return future
