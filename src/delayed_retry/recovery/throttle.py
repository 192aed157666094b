"""Throttle: when failures come in a run, stop taking messages and probe one at a time. Pure.

When every message fails, the cause is a dependency (a database, a partner
API), not the messages: sending each one through its delayed retries only
moves the queue into the parking queue. A :class:`Throttle` says when a
consumer should stop taking messages (a run of ``consecutive`` failures, or
a failure ratio over a window of recent handlings), which failures count
(a tenacity ``retry_if_*`` predicate) and how often it then tries one message
(``probe_every``). :class:`ThrottleState` is the state machine, with no I/O:
the consumer's :mod:`delayed_retry.consumer.throttle` acts on its transitions.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Literal

import tenacity
from tenacity.retry import retry_base, retry_if_exception_type

from delayed_retry.durations import to_seconds
from delayed_retry.errors import ConfigurationError

__all__ = [
    "MARKER_EXPIRES_MS",
    "Throttle",
    "ThrottleMode",
    "ThrottleState",
    "Transition",
    "marker_queue_name",
]

ThrottleMode = Literal["running", "throttled"]
Transition = Literal["tripped", "resumed"]


MARKER_EXPIRES_MS = 3_600_000
"""A marker queue no one has used for an hour is deleted by the broker (``x-expires``)."""


def marker_queue_name(prefix: str, queue: str) -> str:
    """The queue whose consumers are the throttled consumer processes of ``queue``.

    Nothing is ever published to it: each process whose throttle has tripped
    consumes it until it resumes (or dies, which ends its consumer too), so
    its consumer count, which ``delayed-retry status`` reads, is the number of
    processes throttled now.
    """
    return f"{prefix}.throttled.{queue}"


class _NoCall(tenacity.Retrying):
    """A Retrying object a predicate may inspect; it is never called."""


_NO_CALL = _NoCall()


@dataclass(frozen=True, kw_only=True)
class Throttle:
    """When a consumer stops taking messages because failures come in a run, and how it probes.

    Use it on a consumer whose failures mostly mean "a dependency is down":
    instead of every message of a busy queue spending its delayed retries
    (and parking) during an outage, the consumer stops taking messages after
    ``consecutive`` counted failures in a row (or, with ``ratio``, when at
    least that share of the last ``window`` handlings failed), then handles
    one message every ``probe_every``; the first success resumes full speed.
    The messages wait in their queue meanwhile.

    ``counts`` chooses which failures count (default: every ``Exception``):
    ``retry_if_exception_type(ConnectionError)`` keeps a bad message (a
    ``ValueError``) from stopping the consumer. Failures that do not count
    neither trip nor reset the run. Give either ``consecutive`` or ``ratio``
    (``consecutive`` is 5 when neither is given).
    """

    consecutive: int | None = None
    ratio: float | None = None
    window: int = 20
    """With ``ratio``: how many recent handlings the ratio is taken over (and the least
    number of handlings before it can trip)."""
    counts: retry_base = field(default_factory=lambda: retry_if_exception_type(Exception))
    probe_every: float | timedelta = 1.0

    def __post_init__(self) -> None:
        if self.consecutive is not None and self.ratio is not None:
            raise ConfigurationError(
                f"Throttle(consecutive={self.consecutive!r}, ratio={self.ratio!r}) sets two "
                "triggers; give one: consecutive=N (a run of failures) or ratio=R with window=W"
            )
        if self.consecutive is None and self.ratio is None:
            object.__setattr__(self, "consecutive", 5)
        if self.consecutive is not None and (
            isinstance(self.consecutive, bool)
            or not isinstance(self.consecutive, int)
            or self.consecutive < 1
        ):
            raise ConfigurationError(
                f"Throttle consecutive={self.consecutive!r} must be a whole number of at least 1"
            )
        if self.ratio is not None and (
            isinstance(self.ratio, bool)
            or not isinstance(self.ratio, int | float)
            or not math.isfinite(self.ratio)
            or not 0 < self.ratio <= 1
        ):
            raise ConfigurationError(
                f"Throttle ratio={self.ratio!r} must be a share of failures above 0 and at "
                "most 1, e.g. 0.8"
            )
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ConfigurationError(
                f"Throttle window={self.window!r} must be a whole number of handlings, at least 1"
            )
        if not isinstance(self.counts, retry_base):
            raise ConfigurationError(
                f"Throttle counts={self.counts!r} must be a tenacity retry predicate, e.g. "
                "retry_if_exception_type(ConnectionError)"
            )
        seconds = to_seconds(self.probe_every, name="Throttle probe_every")
        if seconds <= 0:
            raise ConfigurationError(
                f"Throttle probe_every={self.probe_every!r} must be a positive duration "
                "(seconds or a timedelta), e.g. 1.0"
            )
        object.__setattr__(self, "probe_every", seconds)

    @property
    def probe_seconds(self) -> float:
        """``probe_every`` in seconds."""
        assert isinstance(self.probe_every, float | int)
        return float(self.probe_every)

    def counted(self, exc: BaseException) -> bool:
        """Whether the failure ``exc`` counts toward tripping (the ``counts`` predicate)."""
        rcs = tenacity.RetryCallState(_NO_CALL, None, (), {})
        rcs.outcome = tenacity.Future.construct(1, exc, True)
        return bool(self.counts(rcs))

    def describe(self) -> str:
        """The trigger in words, for log lines and alerts."""
        if self.consecutive is not None:
            return f"{self.consecutive} consecutive failures"
        return f"{self.ratio:.0%} of the last {self.window} handlings failing"


class ThrottleState:
    """The state machine of one consumer's throttle: running or throttled, and why.

    Feed it each handling's outcome with :meth:`record`; it answers the
    transition that outcome caused, if any. Not thread-safe (one event loop).
    """

    __slots__ = ("_recent", "_run", "mode", "throttle", "trips")

    def __init__(self, throttle: Throttle) -> None:
        self.throttle = throttle
        self.mode: ThrottleMode = "running"
        self.trips = 0
        self._run = 0
        self._recent: deque[bool] = deque(maxlen=throttle.window)

    @property
    def throttled(self) -> bool:
        return self.mode == "throttled"

    def record(self, *, failed: bool, counted: bool = True) -> Transition | None:
        """Record one handling: a success, a counted failure, or a failure that does not count.

        Any success while throttled resumes. A failure that does not count
        changes nothing.
        """
        if not failed:
            self._run = 0
            self._recent.append(False)
            if self.mode == "throttled":
                self.mode = "running"
                self._recent.clear()
                return "resumed"
            return None
        if not counted:
            return None
        self._run += 1
        self._recent.append(True)
        if self.mode == "throttled" or not self._tripping():
            return None
        self.mode = "throttled"
        self.trips += 1
        return "tripped"

    def _tripping(self) -> bool:
        t = self.throttle
        if t.consecutive is not None:
            return self._run >= t.consecutive
        assert t.ratio is not None
        recent = self._recent
        return len(recent) >= t.window and sum(recent) >= t.ratio * len(recent)
