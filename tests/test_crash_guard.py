"""The crash guard's option and count, as functions (no broker)."""

from __future__ import annotations

import pytest

from delayed_retry import ConfigurationError, CrashGuard, with_delayed_retry
from delayed_retry.crashes import MAX_CRASH_COUNT, crashes_of
from delayed_retry.faststream import DelayedRetry
from delayed_retry.headers import X_RETRY_CRASHES


def test_default_is_three_crashes() -> None:
    assert CrashGuard().max_crashes == 3


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "3", None])
def test_a_bad_limit_is_refused_naming_it(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"CrashGuard max_crashes=.* at least 1"):
        CrashGuard(max_crashes=bad)  # type: ignore[arg-type]


def test_decorator_and_faststream_refuse_what_is_not_a_crash_guard_alike() -> None:
    with pytest.raises(ConfigurationError) as decorated:
        with_delayed_retry(queue="q", crash_guard=3)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError) as built:
        DelayedRetry(crash_guard=3)  # type: ignore[arg-type]
    assert str(built.value) == str(decorated.value)
    assert "CrashGuard(max_crashes=3)" in str(built.value)


@pytest.mark.parametrize(
    ("headers", "count"),
    [
        (None, 0),
        ({}, 0),
        ({X_RETRY_CRASHES: 2}, 2),
        ({X_RETRY_CRASHES: 0}, 0),
        ({X_RETRY_CRASHES: -1}, 0),
        ({X_RETRY_CRASHES: True}, 0),
        ({X_RETRY_CRASHES: "2"}, 0),
        ({X_RETRY_CRASHES: 2.0}, 0),
        ({X_RETRY_CRASHES: MAX_CRASH_COUNT + 1}, 0),
        ("not a mapping", 0),
    ],
)
def test_the_count_is_read_or_taken_as_zero(headers: object, count: int) -> None:
    assert crashes_of(headers) == count  # type: ignore[arg-type]
