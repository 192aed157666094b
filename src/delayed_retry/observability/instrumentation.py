"""The seam between the middleware and telemetry: what is observed, not how.

The middleware reports each handling attempt and each hand-over through an
:class:`Instrumentation`. :mod:`delayed_retry.observability.otel` implements it with
OpenTelemetry; :class:`NoInstrumentation` does nothing, for tests and for
those who want no telemetry at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Literal, Protocol

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.headers.retry_state import RetryState

__all__ = [
    "QUIET_SCOPE",
    "AttemptScope",
    "Instrumentation",
    "NoInstrumentation",
    "Outcome",
    "PublishKind",
    "QuietScope",
]

Outcome = Literal["success", "retry", "parked", "redelayed", "error", "immediate-retry"]
"""How an attempt ended; ``error``: the hand-over failed and the message went back to its queue;
``immediate-retry``: the handler failed and runs again at once on the same delivery."""

PublishKind = Literal["retry", "park", "schedule"]


_NOTHING: AbstractContextManager[None] = nullcontext()
"""A context that does nothing: it keeps no state, so every quiet publish shares one."""


class AttemptScope(Protocol):
    """One handling attempt, open while the handler runs and the message is handed over.

    Subclassing it is optional; a subclass inherits methods that record nothing.
    """

    def publishing(
        self, headers: dict[str, Any], *, kind: PublishKind, exchange: str, routing_key: str
    ) -> AbstractContextManager[None]:
        """Wrap a publish of the message onward; may add trace context to ``headers``."""
        return _NOTHING

    def finish(
        self,
        outcome: Outcome,
        *,
        delay: float | None = None,
        exc: BaseException | None = None,
        reason: str | None = None,
    ) -> None:
        """Record how the attempt ended (called once)."""
        return None


class Instrumentation(Protocol):
    """Telemetry for the middleware and for scheduling.

    An implementation may also define ``enabled() -> bool``: while it returns
    False the middleware does not call :meth:`attempt` at all (the success
    path then costs no telemetry work); without it, it is always called.
    """

    def attempt(
        self, message: AbstractIncomingMessage, state: RetryState, *, queue: str
    ) -> AbstractContextManager[AttemptScope]:
        """Open the scope of one handling attempt of ``message``."""
        ...

    def scheduling(
        self, headers: dict[str, Any], *, queue: str, exchange: str, routing_key: str, delay: float
    ) -> AbstractContextManager[None]:
        """Wrap a :func:`~delayed_retry.publish_delayed` publish; may add trace context."""
        ...


class QuietScope(AttemptScope):
    """An attempt scope that records nothing, and its own context manager: free to enter.

    The middleware uses :data:`QUIET_SCOPE` instead of opening a scope while
    the instrumentation says it records nothing.
    """

    def __enter__(self) -> AttemptScope:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


QUIET_SCOPE = QuietScope()


class NoInstrumentation:
    """Records nothing. Use it to turn telemetry off entirely."""

    def enabled(self) -> bool:
        """Always False: the middleware never calls :meth:`attempt` of this one."""
        return False

    def attempt(
        self, message: AbstractIncomingMessage, state: RetryState, *, queue: str
    ) -> AbstractContextManager[AttemptScope]:
        return QUIET_SCOPE

    @contextmanager
    def scheduling(
        self, headers: dict[str, Any], *, queue: str, exchange: str, routing_key: str, delay: float
    ) -> Iterator[None]:
        yield
