"""Immediate retries: how often a failed handler runs again at once, and the pause between. Pure.

An immediate retry runs the handler again in the same process, on the same
delivery, before the failure counts as one delayed retry: for glitches that
pass in milliseconds (a dropped pooled connection, a deadlock victim). The
message stays unacked meanwhile, so the pauses between runs are bounded by
:data:`IMMEDIATE_WAIT_LIMIT`; a longer wait belongs in the delay chain, where
it survives a crash and holds nothing in the consumer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

import tenacity
from tenacity.wait import wait_base

from delayed_retry.errors import ConfigurationError, ParkMessage, RetryAfter
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.recovery.policy import RetryPolicy

__all__ = ["IMMEDIATE_WAIT_LIMIT", "MAX_IMMEDIATE_RETRIES", "ImmediateRetries"]

MAX_IMMEDIATE_RETRIES = 10
"""The most immediate retries a delivery may make (NServiceBus defaults to 5)."""

IMMEDIATE_WAIT_LIMIT = 10.0
"""Seconds of pauses between immediate runs one delivery may spend, in all.

The message is unacked and takes a prefetch slot while it waits. 10 s is far
inside RabbitMQ's ``consumer_timeout`` (30 min by default; a channel that
overruns it is closed with every message it holds), inside the usual 30 s a
deployment gives a stopping process, and long past any glitch an immediate
retry is for. A pause that would take a delivery past it is not made: the
failure goes on to the delayed retries.
"""

_NO_CALL = tenacity.Retrying()


@dataclass(frozen=True, kw_only=True)
class ImmediateRetries:
    """Run a failed handler again at once, up to ``times`` times per delivery.

    Use it for failures that pass in milliseconds; leave it at 0 (the default)
    where a failure means a dependency is down, since each immediate run then
    only adds load. ``wait`` is a tenacity wait between runs (default: none),
    seeing the immediate attempt number (1 after the first run failed); pauses
    are capped at :data:`IMMEDIATE_WAIT_LIMIT` per delivery in all.
    """

    times: int = 0
    wait: wait_base | None = None

    def __post_init__(self) -> None:
        if isinstance(self.times, bool) or not isinstance(self.times, int):
            raise ConfigurationError(
                f"immediate_retries={self.times!r} must be an int (0 turns them off)"
            )
        if not 0 <= self.times <= MAX_IMMEDIATE_RETRIES:
            raise ConfigurationError(
                f"immediate_retries={self.times} must be in 0..{MAX_IMMEDIATE_RETRIES}; a "
                "failure that needs more runs needs a delayed retry (max_retries=, wait=)"
            )
        if self.wait is not None and not (isinstance(self.wait, wait_base) or callable(self.wait)):
            raise ConfigurationError(
                f"immediate_wait={self.wait!r} is not a tenacity wait; use e.g. "
                "tenacity.wait_fixed(0.05) or tenacity.wait_random(0, 0.1)"
            )
        if self.wait is not None and not self.times:
            raise ConfigurationError(
                f"immediate_wait={self.wait!r} is set but immediate_retries=0, so it would never "
                "be used; set immediate_retries=N or drop immediate_wait"
            )

    def next_pause(
        self,
        policy: RetryPolicy,
        state: RetryState,
        exc: BaseException,
        *,
        now: datetime,
        running_for: float,
        paused: float,
    ) -> float | None:
        """Seconds to pause before running the handler again, or ``None``: no more runs.

        ``state.immediate_retries`` runs have been retried so far in this
        delivery, whose first run started ``running_for`` seconds ago and which
        has paused ``paused`` seconds of it; ``now`` is the wall-clock time.
        ``RetryAfter`` and ``ParkMessage`` ask for something else, and an
        exception that ``policy.retry`` rejects would park anyway: none of
        them is run again. Nor is one whose pause would pass the limit.
        """
        if state.immediate_retries >= self.times or isinstance(exc, RetryAfter | ParkMessage):
            return None
        if policy.retryable(state, exc, now=now) is False:
            return None
        if self.wait is None:
            return 0.0
        rcs = tenacity.RetryCallState(_NO_CALL, None, (), {})
        rcs.attempt_number = state.immediate_retries + 1
        rcs.start_time = 0.0
        rcs.outcome_timestamp = running_for
        rcs.outcome = tenacity.Future.construct(rcs.attempt_number, exc, True)
        rcs.idle_for = paused
        try:
            pause = float(self.wait(rcs))
        except (TypeError, ValueError):
            return None
        if not math.isfinite(pause) or pause < 0 or paused + pause > IMMEDIATE_WAIT_LIMIT:
            return None
        return pause
