"""Normalise durations and due times in one place.

The public API takes seconds (``int``/``float``) or :class:`~datetime.timedelta`
for durations, and an aware :class:`~datetime.datetime` for absolute due times.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from delayed_retry.errors import ConfigurationError, DelayOutOfRangeError

__all__ = [
    "Duration",
    "format_duration",
    "from_epoch_ms",
    "parse_duration",
    "resolve_due_at",
    "to_epoch_ms",
    "to_seconds",
    "utcnow",
]

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


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def to_epoch_ms(moment: datetime) -> int:
    """Milliseconds since the Unix epoch, rounded up so a due time never moves earlier."""
    micros = (moment - _EPOCH) // _MICROSECOND
    return -(-micros // 1000)


def from_epoch_ms(ms: int) -> datetime:
    """The aware UTC datetime of ``ms`` milliseconds since the Unix epoch."""
    return _EPOCH + timedelta(milliseconds=ms)


_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_PART = re.compile(r"(\d+(?:\.\d+)?|\.\d+)\s*(ms|s|m|h|d|w)", re.IGNORECASE)
_PLAIN = re.compile(r"\d+(?:\.\d+)?|\.\d+")


def parse_duration(text: str, *, name: str = "duration") -> float:
    """Seconds in a duration written for people: ``90s``, ``15m``, ``1h``, ``2d``, ``250ms``.

    Use it for durations typed on a command line or in a configuration file.
    Plain numbers are seconds (``90``, ``1.5``); parts add up (``1h30m``,
    ``1h 30m``); ``w`` is a week. Empty, NaN and unknown units are refused
    with a :class:`~delayed_retry.errors.ConfigurationError` naming ``name``
    and the accepted forms; a negative duration (``-5s``) with a
    :class:`~delayed_retry.errors.DelayOutOfRangeError` saying so.
    """
    if not isinstance(text, str):
        raise ConfigurationError(f"{name}={text!r} is not a duration; write it like 90s, 15m, 1h")
    raw = text.strip()
    if raw.startswith("-") and raw != "-":
        try:
            magnitude = parse_duration(raw[1:], name=name)
        except ConfigurationError:
            magnitude = None  # not a duration with a minus: refused below as not a duration
        if magnitude == 0:
            return 0.0
        if magnitude is not None:
            raise DelayOutOfRangeError(
                f"{name}={text!r} must not be negative; write zero or more, e.g. 90s or 0"
            )
    if _PLAIN.fullmatch(raw):
        return float(raw)
    position = 0
    total = 0.0
    compact = raw.replace(" ", "")
    for match in _PART.finditer(compact):
        if match.start() != position:
            break
        total += float(match.group(1)) * _UNIT_SECONDS[match.group(2).lower()]
        position = match.end()
    if position == 0 or position != len(compact):
        raise ConfigurationError(
            f"{name}={text!r} is not a duration; write a number with a unit: 250ms, 90s, 15m, "
            "1h, 2d (or plain seconds)"
        )
    if math.isinf(total):
        raise DelayOutOfRangeError(f"{name}={text!r} is not a finite duration")
    return total


_FORMAT_UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def format_duration(seconds: float | timedelta) -> str:
    """A duration as people read it: ``250 ms``, ``1.5 s``, ``15 m 30 s``, ``3 d 4 h``.

    Shows at most the two largest units, rounding down the smaller one, so
    ``format_duration(3 * 86400 + 4 * 3600 + 59)`` is ``3 d 4 h``. Use it for
    every duration a person reads (command-line output, log lines, the web view).
    """
    value = seconds.total_seconds() if isinstance(seconds, timedelta) else float(seconds)
    if math.isnan(value):
        return "?"
    if value < 0:
        return "-" + format_duration(-value)
    if math.isinf(value):
        return "forever"
    if value < 1:
        ms = value * 1000
        return f"{ms:.3g} ms" if ms < 10 and ms != int(ms) else f"{round(ms):d} ms"
    if value < 60:
        text = f"{value:.1f}".rstrip("0").rstrip(".")
        return f"{text} s"
    whole = int(value)
    for index, (unit, size) in enumerate(_FORMAT_UNITS):
        if whole >= size:
            big, rest = divmod(whole, size)
            next_unit, next_size = _FORMAT_UNITS[index + 1]
            small = rest // next_size
            return f"{big} {unit} {small} {next_unit}" if small else f"{big} {unit}"
    raise AssertionError("unreachable")  # pragma: no cover
