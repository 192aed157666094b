"""RetryPolicy: tenacity strategies applied across deliveries, and the park decisions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import tenacity

from delayed_retry import ConfigurationError, ParkMessage, RetryAfter, RetryPolicy
from delayed_retry.headers import RetryState
from delayed_retry.recovery.policy import Decision, call_state

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def state(retries: int, *, first: datetime | None = None) -> RetryState:
    """The retry state of a message that has been retried ``retries`` times."""
    return RetryState(
        attempt=retries + 1,
        retries=retries,
        queue="q",
        original_exchange="e",
        original_routing_key="r",
        first_failure_at=first,
    )


def test_exponential_backoff_follows_the_attempt_across_deliveries() -> None:
    policy = RetryPolicy(max_retries=10, wait=tenacity.wait_exponential(multiplier=1, max=60))
    delays = [policy.decide(state(n), ValueError(), now=NOW).delay for n in range(8)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60]


def test_combined_waits_add_up() -> None:
    policy = RetryPolicy(wait=tenacity.wait_fixed(2) + tenacity.wait_incrementing(1, 3))
    assert [policy.decide(state(n), ValueError(), now=NOW).delay for n in range(3)] == [3, 6, 9]


def test_jitter_stays_within_its_bounds() -> None:
    policy = RetryPolicy(max_retries=100, wait=tenacity.wait_random(0.5, 1.5))
    delays = {policy.decide(state(3), ValueError(), now=NOW).delay for _ in range(50)}
    assert all(0.5 <= d <= 1.5 for d in delays)
    assert len(delays) > 1


def test_default_wait_is_exponential_with_jitter() -> None:
    policy = RetryPolicy(max_retries=50)
    first = policy.decide(state(0), ValueError(), now=NOW).delay
    tenth = policy.decide(state(9), ValueError(), now=NOW).delay
    assert 1 <= first <= 2
    assert 512 <= tenth <= 513
    assert policy.decide(state(40), ValueError(), now=NOW).delay <= 3601


def test_max_retries_parks_after_that_many_retries() -> None:
    policy = RetryPolicy(max_retries=2, wait=tenacity.wait_fixed(1))
    assert policy.decide(state(0), ValueError(), now=NOW).action == "retry"
    assert policy.decide(state(1), ValueError(), now=NOW).action == "retry"
    assert policy.decide(state(2), ValueError(), now=NOW) == Decision.park("max-retries")
    assert RetryPolicy(max_retries=0).decide(state(0), ValueError(), now=NOW).reason == (
        "max-retries"
    )


def test_exceptions_not_chosen_by_retry_park_at_once() -> None:
    policy = RetryPolicy(retry=tenacity.retry_if_exception_type(ConnectionError))
    assert policy.decide(state(0), ConnectionError(), now=NOW).action == "retry"
    assert policy.decide(state(0), KeyError(), now=NOW) == Decision.park("not-retryable")
    either = RetryPolicy(
        retry=tenacity.retry_if_exception_type(KeyError)
        | tenacity.retry_if_exception_message(match=".*again")
    )
    assert either.decide(state(0), ValueError("try again"), now=NOW).action == "retry"
    assert either.decide(state(0), ValueError("no"), now=NOW).action == "park"


def test_retry_after_overrides_the_wait_and_the_filter_but_not_the_limit() -> None:
    policy = RetryPolicy(
        max_retries=3,
        wait=tenacity.wait_fixed(100),
        retry=tenacity.retry_if_exception_type(KeyError),
    )
    assert policy.decide(state(0), RetryAfter(7.5), now=NOW) == Decision.retry_after(7.5)
    assert policy.decide(state(0), RetryAfter(timedelta(minutes=2)), now=NOW).delay == 120
    assert policy.decide(state(3), RetryAfter(1), now=NOW).reason == "max-retries"


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf")])
def test_retry_after_with_an_impossible_delay_parks(delay: float) -> None:
    decision = RetryPolicy().decide(state(0), RetryAfter(delay), now=NOW)
    assert decision == Decision.park("delay-out-of-range")


def test_retry_after_with_a_non_duration_parks_instead_of_raising() -> None:
    decision = RetryPolicy().decide(state(0), RetryAfter("soon"), now=NOW)  # type: ignore[arg-type]
    assert decision == Decision.park("delay-out-of-range")


def test_park_message_parks_whatever_the_policy() -> None:
    policy = RetryPolicy(max_retries=10)
    assert policy.decide(state(0), ParkMessage("invalid"), now=NOW) == Decision.park(
        "park-requested"
    )


def test_stop_after_delay_counts_from_the_first_failure() -> None:
    policy = RetryPolicy(max_retries=100, stop=tenacity.stop_after_delay(3600))
    young = state(5, first=NOW - timedelta(minutes=59))
    old = state(5, first=NOW - timedelta(minutes=61))
    assert policy.decide(young, ValueError(), now=NOW).action == "retry"
    assert policy.decide(old, ValueError(), now=NOW) == Decision.park("stopped")


def test_stop_after_attempt_uses_the_attempt_number() -> None:
    policy = RetryPolicy(max_retries=100, stop=tenacity.stop_after_attempt(3))
    assert policy.decide(state(1), ValueError(), now=NOW).action == "retry"
    assert policy.decide(state(2), ValueError(), now=NOW).reason == "stopped"


def test_call_state_describes_the_attempt() -> None:
    exc = ValueError("x")
    rcs = call_state(state(4, first=NOW - timedelta(seconds=30)), exc, now=NOW)
    assert rcs.attempt_number == 5
    assert rcs.outcome is not None
    assert rcs.outcome.exception() is exc
    assert rcs.seconds_since_start == pytest.approx(30)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 10_001}, "max_retries"),
        ({"max_retries": "3"}, "max_retries"),
        ({"max_retries": True}, "max_retries"),
        ({"wait": 5}, "wait"),
        ({"retry": "always"}, "retry"),
        ({"stop": 3}, "stop"),
    ],
)
def test_bad_options_raise_configuration_error(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "exc", [ValueError("x"), ConnectionError("y"), KeyboardInterrupt(), SystemExit(1)]
)
def test_the_default_retry_filter_decides_as_tenacity_would(exc: BaseException) -> None:
    # The default filter is answered without building a tenacity call state: same answer.
    policy = RetryPolicy()
    tenacity_says = tenacity.retry_if_exception_type(Exception)(call_state(state(0), exc, now=NOW))
    assert (policy.decide(state(0), exc, now=NOW).action == "retry") is tenacity_says


def test_retry_after_still_meets_the_stop_condition() -> None:
    policy = RetryPolicy(max_retries=100, stop=tenacity.stop_after_attempt(3))
    assert policy.decide(state(1), RetryAfter(1), now=NOW) == Decision.retry_after(1)
    assert policy.decide(state(2), RetryAfter(1), now=NOW) == Decision.park("stopped")


def test_a_custom_filter_and_wait_see_the_attempt() -> None:
    seen: list[int] = []

    def wait(rcs: tenacity.RetryCallState) -> float:
        seen.append(rcs.attempt_number)
        return 2.0

    def retry(rcs: tenacity.RetryCallState) -> bool:
        seen.append(rcs.attempt_number)
        return True

    policy = RetryPolicy(max_retries=10, wait=wait, retry=retry)  # type: ignore[arg-type]
    assert policy.decide(state(3), ValueError(), now=NOW) == Decision.retry_after(2.0)
    assert seen == [4, 4]
