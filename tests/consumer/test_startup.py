"""The one start-up check of a retrying consumer: what it refuses, warns about and returns. Pure."""

from __future__ import annotations

import logging

import pytest

from delayed_retry import DEFAULT_TOPOLOGY, ConfigurationError, work_queue_arguments
from delayed_retry.consumer.startup import ConsumerStart, check_start


def _start(**changes: object) -> ConsumerStart:
    fields: dict[str, object] = {
        "consumer": "<RetryingHandler 'handle' queue='orders'>",
        "queue": "orders",
        "topology": DEFAULT_TOPOLOGY,
        "returns_to": ("orders",),
        "confirms": True,
    }
    return ConsumerStart(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_confirming_start_passes_and_names_no_dead_letter_queue() -> None:
    assert check_start(_start()) is None
    assert check_start(_start(confirms=None)) is None  # no channel to know: not refused


def test_a_channel_without_confirms_is_refused_naming_the_consumer_and_the_fix() -> None:
    with pytest.raises(ConfigurationError) as refused:
        check_start(_start(confirms=False, confirms_fix="leave Channel(publisher_confirms=True)"))
    text = str(refused.value)
    assert text.startswith("queue 'orders' is consumed on a channel without publisher confirms")
    assert "<RetryingHandler 'handle' queue='orders'>" in text
    assert text.endswith("; leave Channel(publisher_confirms=True)")
    with pytest.raises(ConfigurationError, match=r"connection\.channel\(publisher_confirms=True"):
        check_start(_start(confirms=False))


def test_every_queue_retries_return_to_is_checked() -> None:
    with pytest.raises(ConfigurationError, match=r"'a\.\*' cannot receive delays"):
        check_start(_start(returns_to=("orders", "a.*")))


def test_a_work_queue_names_its_dead_letter_queue() -> None:
    arguments = work_queue_arguments("orders")
    assert check_start(_start(arguments=arguments)) == arguments["x-dead-letter-routing-key"]


def test_a_risky_delivery_limit_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    risky = {"x-queue-type": "quorum", "x-delivery-limit": 5}
    with caplog.at_level(logging.WARNING):
        assert check_start(_start(arguments=risky, max_retries=3)) is None
    assert "quorum queue 'orders' has a delivery limit of 5" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        check_start(_start(arguments={"x-queue-type": "quorum", "x-delivery-limit": 1000}))
    assert caplog.text == ""
