"""Other delay chains a message can wait in, and when such a message is due at the latest. Pure.

``topology migrate`` moves messages out of another binary TTL chain into ours. A
:class:`SourceChain` describes one: a chain of ours with other settings, Kombu/Celery's
native delayed delivery (``celery_delayed_N``, the key's tail is a routing key, so the
operator names the queue) or NServiceBus.RabbitMQ's v2 chain. :func:`plan_move` says when a
message found in a level is due: exactly from a header that records it (``x-retry-due-at``,
Celery's ``eta``), else the latest it could be, so re-scheduling is never early.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from delayed_retry.chain.topology import NSB_LEVEL_PREFIX, DelayTopology
from delayed_retry.headers.names import X_DUE_AT
from delayed_retry.headers.retry_state import read_epoch_ms

__all__ = ["MovePlan", "SourceChain", "plan_move"]

KOMBU_LEVELS = 28


@dataclass(frozen=True, kw_only=True)
class SourceChain:
    """A delay chain to move messages out of."""

    label: str
    levels: int
    unit_ms: int
    level_prefix: str
    two_digit_levels: bool
    tail: Literal["queue", "routing-key"]

    def level_name(self, level: int) -> str:
        """The queue of level ``level``."""
        return (
            f"{self.level_prefix}{level:02d}"
            if self.two_digit_levels
            else (f"{self.level_prefix}{level}")
        )

    @classmethod
    def ours(cls, topology: DelayTopology) -> SourceChain:
        """A chain declared by delayed-retry with ``topology``'s settings."""
        return cls(
            label=f"delayed-retry chain {topology.prefix!r} ({topology.levels} levels of "
            f"{topology.unit_ms} ms)",
            levels=topology.levels,
            unit_ms=topology.unit_ms,
            level_prefix=topology.level_name(0)[:-2],
            two_digit_levels=True,
            tail="queue",
        )

    @classmethod
    def kombu(cls, *, prefix: str | None = None) -> SourceChain:
        """Kombu's native delayed delivery (``celery_delayed_0`` … ``_27``)."""
        return cls(
            label="Kombu native delayed delivery" + (f" with prefix {prefix!r}" if prefix else ""),
            levels=KOMBU_LEVELS,
            unit_ms=1000,
            level_prefix=f"{prefix}_celery_delayed_" if prefix else "celery_delayed_",
            two_digit_levels=False,
            tail="routing-key",
        )

    @classmethod
    def nservicebus(cls) -> SourceChain:
        """NServiceBus.RabbitMQ's v2 delay infrastructure."""
        return cls(
            label="NServiceBus v2 delay infrastructure",
            levels=28,
            unit_ms=1000,
            level_prefix=NSB_LEVEL_PREFIX,
            two_digit_levels=True,
            tail="queue",
        )


@dataclass(frozen=True, kw_only=True)
class MovePlan:
    """Where a waiting message goes and when it is due; or why it stays (``problem``)."""

    tail: str | None
    due_at: datetime | None
    exact: bool
    problem: str | None = None


def _celery_eta(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        eta = datetime.fromisoformat(value)
    except ValueError:
        return None
    return eta if eta.tzinfo is not None else None


def plan_move(
    source: SourceChain,
    *,
    level: int,
    routing_key: str,
    headers: Mapping[str, Any] | None,
    now: datetime,
) -> MovePlan:
    """When a message waiting in ``source``'s level ``level`` is due, and where it goes."""
    words = routing_key.split(".")
    digits, tail = words[: source.levels], ".".join(words[source.levels :])
    if len(words) <= source.levels or any(d not in ("0", "1") for d in digits) or not tail:
        return MovePlan(
            tail=None,
            due_at=None,
            exact=False,
            problem=f"routing key {routing_key[:120]!r} is not {source.levels} digit words "
            "then a destination",
        )
    lower = 0
    for digit in digits[source.levels - level :]:
        lower = lower << 1 | int(digit)
    # A full wait in this level (it may have just entered), then every lower 1 bit.
    latest = now + timedelta(milliseconds=((1 << level) + lower) * source.unit_ms)
    h = headers if isinstance(headers, Mapping) else {}
    exact = read_epoch_ms(h.get(X_DUE_AT)) or _celery_eta(h.get("eta"))
    if exact is not None and exact <= latest:
        return MovePlan(tail=tail, due_at=max(exact, now), exact=True)
    # No record, or one the chain could not honour (it would deliver by `latest`).
    return MovePlan(tail=tail, due_at=latest, exact=False)
