"""Replays waiting for the operator's confirmation: what the page proposes before acting.

A click on a replay button on the page does not act: it selects the messages
(the set as it is at that click), derives the canary wait from the would-be
canaries' records, and keeps that as a :class:`ReplayPlan` the confirmation
names (how many, from which parking queue, to which queue, canary, pace).
Only the confirmation's own button starts the job, on exactly that set. The
JSON API does not plan: a script's request is its decision.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from delayed_retry.durations import format_duration, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.parking.moving.canary_rules import CanaryWait
from delayed_retry.web.jobs import JobRequest

__all__ = ["PLAN_TTL", "PlanBook", "ReplayPlan"]

PLAN_TTL = timedelta(minutes=15)
"""A confirmation left this long is forgotten: the selection may have changed since."""
MAX_PLANS = 100
"""Confirmations kept at once (the oldest is forgotten first)."""


@dataclass(frozen=True, kw_only=True)
class ReplayPlan:
    """A replay as the confirmation shows it: the selected ids and what will happen to them."""

    id: str
    request: JobRequest
    user: str
    parking_queue: str
    target: str
    keys: tuple[str, ...]
    canary_ids: tuple[str, ...]
    canary_wait: CanaryWait | None
    """The wait the would-be canaries' records call for (``None`` without a canary)."""
    created_at: datetime = field(default_factory=utcnow)

    @property
    def canary(self) -> int:
        """How many of the selected messages go first as canaries."""
        return min(self.request.canary, len(self.keys))

    def pace(self) -> str:
        """The pace in words."""
        rate = self.request.rate
        return "all at once" if rate is None else f"at most {rate:g} messages per second"

    def canary_plan(self) -> str:
        """What the canary will do, in words (empty without a canary)."""
        if self.canary_wait is None or not self.canary:
            return ""
        rest = len(self.keys) - self.canary
        watched = f"watched until due plus {self.canary_wait.describe()}"
        if rest == 0:
            return f"the message is the canary: {watched}; the job is finished only then"
        which = "canary" if self.canary == 1 else "canaries"
        return (
            f"{self.canary} first as {which} ({', '.join(self.canary_ids)}), {watched}; if one "
            f"parks again the other {rest} stay parked. After the last message the {which} "
            f"stay watched {format_duration(self.canary_wait.seconds)} more (and until the "
            f"derived wait has passed); the job is finished only then"
        )


class PlanBook:
    """The confirmations shown and not yet answered, each usable once by the user it was for."""

    def __init__(self) -> None:
        self._plans: dict[str, ReplayPlan] = {}

    def add(self, plan: ReplayPlan) -> None:
        now = utcnow()
        for key, old in list(self._plans.items()):
            if now - old.created_at > PLAN_TTL:
                del self._plans[key]
        while len(self._plans) >= MAX_PLANS:
            del self._plans[next(iter(self._plans))]
        self._plans[plan.id] = plan

    def take(self, plan_id: str, *, user: str) -> ReplayPlan:
        """The plan confirmed now (forgotten here); refused when unknown, used, expired or
        another user's."""
        plan = self._plans.get(plan_id)
        if plan is None or plan.user != user or utcnow() - plan.created_at > PLAN_TTL:
            raise ConfigurationError(
                "this replay confirmation is no longer valid (already used, cancelled, or "
                f"older than {format_duration(PLAN_TTL)}); click Replay again to see the "
                "current selection"
            )
        del self._plans[plan_id]
        return plan

    def drop(self, plan_id: str, *, user: str) -> None:
        """Forget a plan the user cancelled (unknown ones are ignored)."""
        plan = self._plans.get(plan_id)
        if plan is not None and plan.user == user:
            del self._plans[plan_id]

    @staticmethod
    def new_id() -> str:
        return secrets.token_urlsafe(16)
