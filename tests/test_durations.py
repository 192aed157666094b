"""Durations as seconds or timedelta, due times as aware datetimes, epoch milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_retry import ConfigurationError, DelayOutOfRangeError
from delayed_retry.durations import (
    format_duration,
    from_epoch_ms,
    parse_duration,
    resolve_due_at,
    to_epoch_ms,
    to_seconds,
    utcnow,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(0, 0.0), (1.5, 1.5), (7, 7.0), (timedelta(minutes=2), 120.0), (timedelta(0), 0.0)],
)
def test_to_seconds_accepts_numbers_and_timedeltas(value: float, seconds: float) -> None:
    assert to_seconds(value) == seconds


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (-1, DelayOutOfRangeError, "negative"),
        (timedelta(seconds=-1), DelayOutOfRangeError, "negative"),
        (float("nan"), DelayOutOfRangeError, "finite"),
        (float("inf"), DelayOutOfRangeError, "finite"),
        ("5", ConfigurationError, "not a duration"),
        (None, ConfigurationError, "not a duration"),
        (True, ConfigurationError, "not a duration"),
    ],
)
def test_to_seconds_rejects_with_the_name(
    value: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match) as info:
        to_seconds(value, name="wait_for")  # type: ignore[arg-type]
    assert "wait_for=" in str(info.value)


def test_resolve_due_at() -> None:
    assert resolve_due_at(5, now=NOW) == NOW + timedelta(seconds=5)
    assert resolve_due_at(timedelta(hours=1), now=NOW) == NOW + timedelta(hours=1)
    later = NOW + timedelta(days=3)
    assert resolve_due_at(later, now=NOW) == later
    assert resolve_due_at(NOW - timedelta(days=3), now=NOW) == NOW  # the past means now
    other_zone = later.astimezone(timezone(timedelta(hours=-7)))
    assert resolve_due_at(other_zone, now=NOW) == later


@pytest.mark.parametrize("seconds", [1e12, 1e15, 1e300])
def test_a_delay_past_datetime_range_is_out_of_range_not_an_overflow(seconds: float) -> None:
    with pytest.raises(DelayOutOfRangeError, match="beyond any due time"):
        resolve_due_at(seconds, now=NOW)


def test_naive_due_time_is_refused_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"no timezone.*tzinfo=UTC"):
        resolve_due_at(datetime(2030, 1, 1), now=NOW)  # noqa: DTZ001 (the bad input)


def test_utcnow_is_aware() -> None:
    assert utcnow().tzinfo is not None


def test_epoch_ms_rounds_up() -> None:
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    assert to_epoch_ms(epoch) == 0
    assert to_epoch_ms(epoch + timedelta(microseconds=1)) == 1
    assert to_epoch_ms(epoch + timedelta(microseconds=1000)) == 1
    assert to_epoch_ms(epoch - timedelta(microseconds=1)) == 0
    assert from_epoch_ms(1500) == epoch + timedelta(milliseconds=1500)


@given(st.datetimes(min_value=datetime(1971, 1, 1), timezones=st.just(UTC)))  # noqa: DTZ001
def test_epoch_ms_never_moves_a_due_time_earlier(moment: datetime) -> None:
    ms = to_epoch_ms(moment)
    assert from_epoch_ms(ms) >= moment
    assert from_epoch_ms(ms) - moment < timedelta(milliseconds=1)
    assert to_epoch_ms(from_epoch_ms(ms)) == ms


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90.0),
        ("15m", 900.0),
        ("1h", 3600.0),
        ("2d", 172800.0),
        ("1.5s", 1.5),
        ("250ms", 0.25),
        ("90", 90.0),
        ("1.5", 1.5),
        ("0", 0.0),
        (" 1h30m ", 5400.0),
        ("1h 30m", 5400.0),
        ("2D", 172800.0),
        ("1w", 604800.0),
        (".5s", 0.5),
        ("-0", 0.0),
    ],
)
def test_parse_duration_accepts_what_people_type(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", "  ", "-", "--5s", "5x", "h", "1.2.3s", "s5", "1h-30m", "nan", "inf", "1e3", "5 s x"],
)
def test_parse_duration_refuses_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(ConfigurationError, match=r"--delay='.*' is not a duration.*90s, 15m") as e:
        parse_duration(text, name="--delay")
    assert repr(text) in str(e.value)


@pytest.mark.parametrize("text", ["-5s", " -1h30m", "-90", "-.5"])
def test_parse_duration_says_a_negative_duration_is_negative(text: str) -> None:
    with pytest.raises(DelayOutOfRangeError, match=r"--delay='.*' must not be negative"):
        parse_duration(text, name="--delay")


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 ms"),
        (0.25, "250 ms"),
        (0.0015, "1.5 ms"),
        (1.5, "1.5 s"),
        (45, "45 s"),
        (59.96, "60 s"),
        (90, "1 m 30 s"),
        (900, "15 m"),
        (3600, "1 h"),
        (5400, "1 h 30 m"),
        (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"),
        (2 * 86400, "2 d"),
        (timedelta(hours=2), "2 h"),
        (-90, "-1 m 30 s"),
        (34359738.368, "397 d 16 h"),
    ],
)
def test_format_duration_reads_like_people_write(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


@given(st.floats(min_value=1, max_value=1e9))
def test_format_duration_round_trips_through_parse_within_its_precision(seconds: float) -> None:
    shown = format_duration(seconds).replace(" ", "")
    back = parse_duration(shown)
    assert back <= seconds + 0.05
    # two units shown: the loss is below one of the smaller unit (a day loses < 1 h)
    assert seconds - back < max(0.05 * seconds, 0.06)
