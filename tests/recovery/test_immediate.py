"""ImmediateRetries as a function: which failures run again, and the pause before."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import tenacity

from delayed_retry import headers as h
from delayed_retry.errors import ConfigurationError, ParkMessage, RetryAfter
from delayed_retry.headers import RetryState
from delayed_retry.recovery.immediate import IMMEDIATE_WAIT_LIMIT, ImmediateRetries
from delayed_retry.recovery.policy import RetryPolicy

NOW = datetime(2026, 1, 1, tzinfo=UTC)
POLICY = RetryPolicy(retry=tenacity.retry_if_exception_type(ConnectionError))


def state(immediate: int = 0) -> RetryState:
    return RetryState(
        attempt=1,
        retries=0,
        queue="q",
        original_exchange="",
        original_routing_key="q",
        immediate_retries=immediate,
    )


def pause(
    immediate: ImmediateRetries, exc: BaseException, runs_retried: int = 0, paused: float = 0.0
) -> float | None:
    return immediate.next_pause(
        POLICY, state(runs_retried), exc, now=NOW, running_for=paused, paused=paused
    )


def test_runs_again_up_to_the_number_given() -> None:
    two = ImmediateRetries(times=2)
    assert pause(two, ConnectionError(), 0) == 0.0
    assert pause(two, ConnectionError(), 1) == 0.0
    assert pause(two, ConnectionError(), 2) is None


@pytest.mark.parametrize(
    "exc", [RetryAfter(5), ParkMessage("bad"), KeyError("not retryable by the policy")]
)
def test_signals_and_rejected_exceptions_are_not_run_again(exc: BaseException) -> None:
    assert pause(ImmediateRetries(times=3), exc) is None


def test_the_wait_sees_the_immediate_attempt_number() -> None:
    exponential = ImmediateRetries(times=5, wait=tenacity.wait_exponential(multiplier=0.1))
    assert [pause(exponential, ConnectionError(), n) for n in range(3)] == [0.1, 0.2, 0.4]


def test_pauses_stop_at_the_limit_and_the_failure_goes_on() -> None:
    fixed = ImmediateRetries(times=10, wait=tenacity.wait_fixed(4))
    assert pause(fixed, ConnectionError(), 1, paused=4) == 4
    assert pause(fixed, ConnectionError(), 2, paused=8) is None  # 12 s > the limit
    assert IMMEDIATE_WAIT_LIMIT == 10.0


def test_a_wait_that_returns_nonsense_ends_the_immediate_retries() -> None:
    for bad in (lambda rs: -1.0, lambda rs: float("nan"), lambda rs: "soon"):
        assert pause(ImmediateRetries(times=3, wait=bad), ConnectionError()) is None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"times": -1}, r"immediate_retries=-1 must be in 0\.\.10"),
        ({"times": 11}, r"needs a delayed retry"),
        ({"times": True}, "must be an int"),
        ({"times": 2.0}, "must be an int"),
        ({"times": 2, "wait": 0.1}, "not a tenacity wait"),
        ({"times": 0, "wait": tenacity.wait_fixed(0.1)}, "would never be used"),
    ],
)
def test_bad_options_are_refused_with_the_fix(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        ImmediateRetries(**kwargs)  # type: ignore[arg-type]


def test_the_record_keeps_the_runs_of_each_delivery() -> None:
    first = h.failure_headers({}, state(2), ValueError("x"), now=NOW, retries=1, runs=3)
    assert first[h.X_IMMEDIATE_RUNS] == [3]
    second = h.parking_headers(first, state(0), ValueError("x"), now=NOW, reason="r", runs=1)
    assert second[h.X_IMMEDIATE_RUNS] == [3, 1]
    without = h.failure_headers({}, state(), ValueError("x"), now=NOW, retries=1)
    assert h.X_IMMEDIATE_RUNS not in without
    junk = {h.X_IMMEDIATE_RUNS: "three"}
    assert h.failure_headers(junk, state(), ValueError(), now=NOW, retries=1, runs=2)[
        h.X_IMMEDIATE_RUNS
    ] == [2]
    long = {h.X_IMMEDIATE_RUNS: list(range(h.MAX_IMMEDIATE_HISTORY))}
    kept = h.failure_headers(long, state(), ValueError(), now=NOW, retries=1, runs=7)
    assert len(kept[h.X_IMMEDIATE_RUNS]) == h.MAX_IMMEDIATE_HISTORY
    assert kept[h.X_IMMEDIATE_RUNS][-1] == 7
