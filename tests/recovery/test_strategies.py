"""What ``retry=`` takes and what it means: exception classes, tenacity strategies. Pure."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import tenacity

from delayed_retry import ConfigurationError, RetryPolicy
from delayed_retry.headers import RetryState
from delayed_retry.recovery.strategies import refuse_exception_classes, retry_strategy

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FIRST = RetryState(attempt=1, retries=0, queue="q", original_exchange="", original_routing_key="q")


def _retries(retry: object, exc: BaseException) -> bool:
    """Whether a policy with the strategy ``retry`` means retries ``exc``."""
    strategy = retry_strategy(retry)
    assert isinstance(strategy, tenacity.retry_base)
    return RetryPolicy(retry=strategy).decide(FIRST, exc, now=NOW).action == "retry"


@pytest.mark.parametrize("retry", [ValueError, (ValueError,), (KeyError, ValueError)])
def test_exception_classes_mean_retry_if_exception_type(retry: object) -> None:
    assert isinstance(retry_strategy(retry), tenacity.retry_if_exception_type)
    assert _retries(retry, ValueError("bad"))
    assert _retries(retry, UnicodeDecodeError("utf-8", b"", 0, 1, "x"))  # a subclass
    assert not _retries(retry, RuntimeError("other"))


def test_a_tuple_names_every_class_it_holds() -> None:
    assert _retries((KeyError, ConnectionError), ConnectionResetError())
    assert _retries((KeyError, ConnectionError), KeyError("sku"))
    assert not _retries((KeyError, ConnectionError), ValueError())


def test_tenacity_strategies_and_other_values_pass_as_given() -> None:
    strategy = tenacity.retry_if_exception_type(KeyError)
    assert retry_strategy(strategy) is strategy
    assert retry_strategy("always") == "always"  # left for RetryPolicy to refuse


@pytest.mark.parametrize("retry", [(), (ValueError, "KeyError"), (ValueError(),)])
def test_a_tuple_of_anything_but_exception_classes_is_refused(retry: object) -> None:
    with pytest.raises(ConfigurationError, match=r"not of exception classes; pass .*\(Conn"):
        retry_strategy(retry)


def test_retry_policy_refuses_exception_classes_with_the_fix() -> None:
    with pytest.raises(ConfigurationError, match=r"use tenacity\.retry_if_exception_type\(Val"):
        RetryPolicy(retry=ValueError)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"retry_if_exception_type\(\(KeyError, Val"):
        RetryPolicy(retry=(KeyError, ValueError))  # type: ignore[arg-type]
    refuse_exception_classes(tenacity.retry_if_exception_type(ValueError))
