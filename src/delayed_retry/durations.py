"""Normalise durations and due times in one place.

The public API takes seconds (``int``/``float``) or :class:`~datetime.timedelta`
for durations, and an aware :class:`~datetime.datetime` for absolute due times.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

from delayed_retry.errors import ConfigurationError, DelayOutOfRangeError

__all__ = ["Duration", "from_epoch_ms", "resolve_due_at", "to_epoch_ms", "to_seconds", "utcnow"]

Duration = float | int | timedelta
"""A length of time: seconds as a number, or a :class:`~datetime.timedelta`."""


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def to_seconds(value: Duration, *, name: str = "delay") -> float:
    """Return ``value`` in seconds, rejecting negative, NaN, infinite and non-numeric values."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{name}={value!r} is not a duration; pass seconds as a number or a datetime.timedelta"
        )
    else:
        seconds = float(value)
    if math.isnan(seconds) or math.isinf(seconds):
        raise DelayOutOfRangeError(f"{name}={value!r} is not a finite duration; pass a real number")
    if seconds < 0:
        raise DelayOutOfRangeError(f"{name}={value!r} is negative; pass zero or more seconds")
    return seconds


def resolve_due_at(delay: Duration | datetime, *, now: datetime) -> datetime:
    """The absolute due time of a delay given as a duration or an aware datetime.

    A due time in the past means "now": it is returned as ``now``.
    """
    if isinstance(delay, datetime):
        if delay.tzinfo is None or delay.utcoffset() is None:
            raise ConfigurationError(
                f"due time {delay.isoformat()} has no timezone; pass an aware datetime, "
                "for example datetime(..., tzinfo=UTC)"
            )
        return max(delay, now)
    seconds = to_seconds(delay)
    try:
        return now + timedelta(seconds=seconds)
    except OverflowError:
        # Past datetime's range (year 9999): far beyond any delay chain's maximum.
        raise DelayOutOfRangeError(
            f"delay={delay!r} seconds is beyond any due time a datetime can hold; pass a "
            "delay the delay chain can hold"
        ) from None


def to_epoch_ms(moment: datetime) -> int:
    """Milliseconds since the Unix epoch, rounded up so a due time never moves earlier."""
    micros = (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    return -(-micros // 1000)


def from_epoch_ms(ms: int) -> datetime:
    """The aware UTC datetime of ``ms`` milliseconds since the Unix epoch."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
