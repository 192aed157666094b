"""When to retry and how long to wait, with tenacity's strategies. Pure.

A :class:`RetryPolicy` turns a failure of a handler into a :class:`Decision`:
retry after a delay, or park with a reason. It speaks tenacity: ``wait`` is
any ``tenacity.wait_*`` (combined with ``+`` as usual), ``retry`` any
``tenacity.retry_if_*`` (with ``|`` and ``&``), ``stop`` any ``tenacity.stop_*``
(``stop_after_delay`` counts from the first failure of the message, across
retries).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import tenacity
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from delayed_retry.durations import to_seconds
from delayed_retry.errors import ConfigurationError, ParkMessage, RetryAfter
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.recovery.strategies import refuse_exception_classes, refuse_result_predicates

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_WAIT",
    "Decision",
    "ParkReason",
    "RetryPolicy",
    "call_state",
]

DEFAULT_MAX_RETRIES = 5
"""Delayed retries after the first failure before a message parks: at most 6 handlings."""

DEFAULT_WAIT: wait_base = tenacity.wait_exponential_jitter(max=3600, jitter=1)
"""1 s, 2 s, 4 s … capped at one hour, plus up to 1 s of jitter to spread competing consumers."""

DEFAULT_RETRY: retry_base = tenacity.retry_if_exception_type(Exception)
"""Retry every ``Exception``."""

ParkReason = Literal[
    "max-retries",
    "not-retryable",
    "park-requested",
    "stopped",
    "delay-out-of-range",
    "unencodable",
    "internal-error",
]


@dataclass(frozen=True)
class Decision:
    """What to do with a failed message: retry after ``delay`` seconds, or park for ``reason``."""

    action: Literal["retry", "park"]
    delay: float = 0.0
    reason: ParkReason | None = None

    @classmethod
    def retry_after(cls, delay: float) -> Decision:
        return cls("retry", delay=delay)

    @classmethod
    def park(cls, reason: ParkReason) -> Decision:
        return cls("park", reason=reason)


class _NoCall(tenacity.Retrying):
    """A Retrying object that strategies may inspect; it is never called."""


_NO_CALL = _NoCall()
"""Shared by every call state: it holds no per-call data, and building one per failure
(a ``threading.local`` and a dozen attributes) was a visible part of a decision."""


def call_state(state: RetryState, exc: BaseException, *, now: datetime) -> tenacity.RetryCallState:
    """A tenacity ``RetryCallState`` describing the failed attempt ``state.attempt`` of a message.

    Time fields are wall-clock seconds so that "since start" means since the
    first failure of the message, which may be days ago in another process.
    """
    rcs = tenacity.RetryCallState(_NO_CALL, None, (), {})
    rcs.attempt_number = state.attempt
    first = state.first_failure_at or now
    rcs.start_time = first.timestamp()
    rcs.outcome_timestamp = now.timestamp()
    rcs.outcome = tenacity.Future.construct(state.attempt, exc, True)
    rcs.idle_for = max(0.0, (now - first).total_seconds())
    return rcs


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a failing handler's messages are retried.

    ``max_retries`` is the number of *delayed retries* after the first
    failure: with 5 a message is handled at most 6 times before parking.
    ``retry`` decides which exceptions are retried at all (default: every
    ``Exception``); the others are parked at once. ``stop`` adds a tenacity
    stop condition, for example ``stop_after_delay(86400)`` to park a message
    that has been failing for a day whatever its count.
    """

    max_retries: int = DEFAULT_MAX_RETRIES
    wait: wait_base = DEFAULT_WAIT
    retry: retry_base = DEFAULT_RETRY
    stop: stop_base | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise ConfigurationError(
                f"max_retries={self.max_retries!r} must be an int (0 parks on the first failure)"
            )
        if not 0 <= self.max_retries <= 10_000:
            raise ConfigurationError(f"max_retries={self.max_retries} must be in 0..10000")
        refuse_exception_classes(self.retry)
        for name, value, base in (
            ("wait", self.wait, wait_base),
            ("retry", self.retry, retry_base),
        ):
            if not isinstance(value, base) and not callable(value):
                raise ConfigurationError(
                    f"{name}={value!r} is not a tenacity strategy; use tenacity.{name}_* objects"
                )
        refuse_result_predicates(self.retry)
        if (
            self.stop is not None
            and not isinstance(self.stop, stop_base)
            and not callable(self.stop)
        ):
            raise ConfigurationError(f"stop={self.stop!r} is not a tenacity stop_* strategy")

    def retryable(
        self, state: RetryState, exc: BaseException, *, now: datetime
    ) -> tenacity.RetryCallState | bool:
        """Whether ``retry`` accepts ``exc``: ``False``, or the call state it was asked with.

        The call state (``True`` when none was needed, for the default ``retry``)
        serves the stop and the wait that follow, as in tenacity.
        """
        if self.retry is DEFAULT_RETRY:
            return isinstance(exc, Exception)
        rcs = call_state(state, exc, now=now)
        return rcs if self.retry(rcs) else False

    def decide(self, state: RetryState, exc: BaseException, *, now: datetime) -> Decision:
        """The fate of a message whose handling attempt ``state.attempt`` raised ``exc``.

        In tenacity's order: ``retry`` first, then the wait, then ``stop``, which
        sees the wait coming as ``upcoming_sleep`` (``stop_before_delay`` needs it).
        """
        if isinstance(exc, ParkMessage):
            return Decision.park("park-requested")
        # The tenacity call state is built only when a strategy needs it: a RetryAfter
        # with no stop condition needs none, and the default ``retry`` is an isinstance.
        rcs: tenacity.RetryCallState | None = None
        if not isinstance(exc, RetryAfter):
            accepted = self.retryable(state, exc, now=now)
            if accepted is False:
                return Decision.park("not-retryable")
            if not isinstance(accepted, bool):
                rcs = accepted
        if state.retries >= self.max_retries:
            return Decision.park("max-retries")
        try:
            if isinstance(exc, RetryAfter):
                delay = to_seconds(exc.delay)
            else:
                rcs = rcs or call_state(state, exc, now=now)
                delay = to_seconds(self.wait(rcs))
        except ConfigurationError:
            # Negative, NaN, or not a duration at all (``RetryAfter("soon")``, a custom wait
            # returning None): raising here would leave the message unacked, so park it.
            return Decision.park("delay-out-of-range")
        if self.stop is not None:
            rcs = rcs or call_state(state, exc, now=now)
            rcs.upcoming_sleep = delay
            if self.stop(rcs):
                return Decision.park("stopped")
        return Decision.retry_after(delay)
