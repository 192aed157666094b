"""The retry policy against tenacity itself: same strategies, same number of attempts.

Each case runs ``tenacity.Retrying`` on a function that always fails, with a
fake clock that only its sleeps move (a handler that takes no time), and
counts the calls; then feeds the same strategies to :class:`RetryPolicy` one
failed delivery at a time, the clock moved by each chosen delay, and counts
the handlings until it parks.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
import tenacity
from hypothesis import given, settings
from hypothesis import strategies as st
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from delayed_retry.errors import ConfigurationError
from delayed_retry.headers import RetryState
from delayed_retry.recovery.policy import RetryPolicy

START = datetime(2026, 1, 1, tzinfo=UTC)
CAP = tenacity.stop_after_attempt(40)
"""Added to every stop on both sides, so that every run ends."""


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def tenacity_attempts(monkeypatch: pytest.MonkeyPatch, wait: wait_base, stop: stop_base) -> int:
    """How many times tenacity calls an always-failing function with these strategies."""
    clock = _Clock()
    # tenacity reads time.monotonic through its own module's ``time`` name.
    monkeypatch.setattr(tenacity, "time", SimpleNamespace(monotonic=clock.monotonic))
    calls = 0

    def fails() -> None:
        nonlocal calls
        calls += 1
        raise ValueError(f"call {calls}")

    retrying = tenacity.Retrying(
        wait=wait,
        stop=stop | CAP,
        retry=tenacity.retry_if_exception_type(ValueError),
        sleep=clock.sleep,
        reraise=True,
    )
    with pytest.raises(ValueError, match="call "):
        retrying(fails)
    monkeypatch.undo()
    return calls


def policy_attempts(wait: wait_base, stop: stop_base) -> int:
    """How many times a message is handled under a policy with these strategies."""
    policy = RetryPolicy(max_retries=10_000, wait=wait, stop=stop | CAP)
    now, retries = START, 0
    while True:
        state = RetryState(
            attempt=retries + 1,
            retries=retries,
            queue="q",
            original_exchange="",
            original_routing_key="q",
            first_failure_at=START if retries else None,
        )
        decision = policy.decide(state, ValueError(retries), now=now)
        if decision.action == "park":
            return retries + 1
        now += timedelta(seconds=decision.delay)
        retries += 1


WAITS = st.one_of(
    st.integers(1, 30).map(tenacity.wait_fixed),
    st.tuples(st.integers(1, 10), st.integers(1, 10)).map(
        lambda a: tenacity.wait_incrementing(start=a[0], increment=a[1])
    ),
    st.tuples(st.integers(1, 4), st.integers(4, 600)).map(
        lambda a: tenacity.wait_exponential(multiplier=a[0], max=a[1])
    ),
)
STOPS = st.one_of(
    st.integers(1, 900).map(tenacity.stop_before_delay),
    st.integers(1, 900).map(tenacity.stop_after_delay),
    st.integers(1, 12).map(tenacity.stop_after_attempt),
    st.tuples(st.integers(1, 900), st.integers(1, 12)).map(
        lambda a: tenacity.stop_before_delay(a[0]) | tenacity.stop_after_attempt(a[1])
    ),
)


def test_stop_before_delay_does_not_overrun_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Attempts at 0, 10, 20, 30 s; the one at 30 s would sleep to 40 s, past 35 s: stop there.
    wait, stop = tenacity.wait_fixed(10), tenacity.stop_before_delay(35)
    assert tenacity_attempts(monkeypatch, wait, stop) == 4
    assert policy_attempts(wait, stop) == 4
    # stop_after_delay lets the attempt at 40 s happen, as tenacity does.
    assert policy_attempts(wait, tenacity.stop_after_delay(35)) == 5


@settings(max_examples=150, deadline=None)
@given(wait=WAITS, stop=STOPS)
def test_the_policy_makes_as_many_attempts_as_tenacity(wait: wait_base, stop: stop_base) -> None:
    with pytest.MonkeyPatch.context() as monkeypatch:
        expected = tenacity_attempts(monkeypatch, wait, stop)
    assert policy_attempts(wait, stop) == expected


def test_stop_sees_the_upcoming_sleep_of_a_retry_after() -> None:
    from delayed_retry.errors import RetryAfter

    policy = RetryPolicy(max_retries=100, stop=tenacity.stop_before_delay(60))
    state = RetryState(
        attempt=2,
        retries=1,
        queue="q",
        original_exchange="",
        original_routing_key="q",
        first_failure_at=START,
    )
    later = START + timedelta(seconds=30)
    assert policy.decide(state, RetryAfter(29), now=later).action == "retry"
    assert policy.decide(state, RetryAfter(30), now=later).reason == "stopped"


@pytest.mark.parametrize(
    "retry",
    [
        tenacity.retry_if_result(lambda r: r is None),
        tenacity.retry_if_not_result(bool),
        tenacity.retry_if_exception_type(OSError) | tenacity.retry_if_result(bool),
        tenacity.retry_if_exception_type(OSError)
        & (tenacity.retry_always | tenacity.retry_if_not_result(bool)),
    ],
)
def test_result_predicates_are_refused_with_the_reason(retry: tenacity.retry_base) -> None:
    with pytest.raises(ConfigurationError, match=r"return value.*retry_if_exception"):
        RetryPolicy(retry=retry)


def test_exception_predicates_combined_are_accepted() -> None:
    retry = tenacity.retry_if_exception_type(OSError) | tenacity.retry_if_exception_message(
        match="again"
    )
    assert RetryPolicy(retry=retry).retry is retry
