"""The throttle's configuration and state machine, as functions (no broker)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from tenacity import retry_if_exception_type
from tenacity.retry import retry_base

from delayed_retry import ConfigurationError, DelayTopology, Throttle, with_delayed_retry
from delayed_retry.alerts.grouping import arrival_from, group_arrivals
from delayed_retry.consumer.throttle import ThrottleControl
from delayed_retry.headers import (
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TYPE,
    X_PARKED_REASON,
    X_QUEUE,
    X_THROTTLE_EVENT,
    X_THROTTLE_TRIGGER,
)
from delayed_retry.recovery.throttle import ThrottleState
from delayed_retry.testing import FakeChannel, fake_message


def test_default_trigger_is_five_consecutive_failures_probing_every_second() -> None:
    throttle = Throttle()
    assert throttle.consecutive == 5
    assert throttle.ratio is None
    assert throttle.probe_seconds == 1.0
    assert throttle.describe() == "5 consecutive failures"


def test_probe_interval_as_timedelta() -> None:
    assert Throttle(probe_every=timedelta(milliseconds=250)).probe_seconds == 0.25


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"consecutive": 0}, "consecutive=0"),
        ({"consecutive": True}, "consecutive=True"),
        ({"consecutive": 2.5}, "consecutive=2.5"),
        ({"consecutive": 3, "ratio": 0.5}, "sets two triggers"),
        ({"ratio": 0}, "ratio=0"),
        ({"ratio": 1.5}, "ratio=1.5"),
        ({"ratio": float("nan")}, "ratio=nan"),
        ({"ratio": 0.5, "window": 0}, "window=0"),
        ({"probe_every": 0}, "probe_every=0"),
        ({"probe_every": "1s"}, "probe_every='1s'"),
        ({"counts": ConnectionError}, "tenacity retry predicate"),
    ],
)
def test_bad_configuration_is_refused_naming_the_option(
    kwargs: dict[str, object], words: str
) -> None:
    with pytest.raises(ConfigurationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Throttle(**kwargs)  # type: ignore[arg-type]


def test_decorator_refuses_a_throttle_that_is_not_one() -> None:
    with pytest.raises(ConfigurationError, match=r"must be a delayed_retry\.Throttle"):
        with_delayed_retry(queue="q", throttle=5)  # type: ignore[call-overload]


def test_trips_after_a_run_of_counted_failures_and_a_success_resumes() -> None:
    state = ThrottleState(Throttle(consecutive=3))
    assert state.record(failed=True) is None
    assert state.record(failed=True) is None
    assert state.record(failed=True) == "tripped"
    assert state.throttled and state.trips == 1
    assert state.record(failed=True) is None  # a failed probe: still throttled
    assert state.record(failed=False) == "resumed"
    assert state.mode == "running"
    assert state.record(failed=True) is None  # the run starts again from zero


def test_a_success_breaks_the_run() -> None:
    state = ThrottleState(Throttle(consecutive=2))
    for _ in range(10):
        assert state.record(failed=True) is None
        assert state.record(failed=False) is None
    assert not state.throttled


def test_failures_that_do_not_count_neither_trip_nor_break_the_run() -> None:
    throttle = Throttle(consecutive=2, counts=retry_if_exception_type(ConnectionError))
    assert throttle.counted(ConnectionError("db down"))
    assert not throttle.counted(ValueError("bad message"))
    state = ThrottleState(throttle)
    assert state.record(failed=True, counted=True) is None
    assert state.record(failed=True, counted=False) is None
    assert state.record(failed=True, counted=True) == "tripped"


def test_ratio_trips_only_over_a_full_window() -> None:
    state = ThrottleState(Throttle(ratio=0.75, window=4))
    assert state.record(failed=True) is None
    assert state.record(failed=True) is None
    assert state.record(failed=False) is None  # 2 of 3: the window is not full yet
    assert state.record(failed=True) == "tripped"  # 3 of 4 = 75 %


def test_ratio_below_the_threshold_never_trips() -> None:
    state = ThrottleState(Throttle(ratio=0.8, window=5))
    for i in range(50):
        assert state.record(failed=i % 2 == 0) is None
    assert not state.throttled


def test_after_a_resume_the_ratio_counts_a_fresh_window() -> None:
    state = ThrottleState(Throttle(ratio=0.5, window=2))
    state.record(failed=True)
    assert state.record(failed=True) == "tripped"
    assert state.record(failed=False) == "resumed"
    assert state.record(failed=True) is None  # one handling: not a full window
    assert state.record(failed=True) == "tripped"
    assert state.trips == 2


def test_a_throttle_event_in_the_alert_queue_is_an_event_not_a_parked_message() -> None:
    tripped = arrival_from(
        {
            X_THROTTLE_EVENT: "tripped",
            X_QUEUE: "orders",
            X_THROTTLE_TRIGGER: "5 consecutive failures",
            X_EXCEPTION_TYPE: "ConnectionError",
            X_EXCEPTION_MESSAGE: "db down",
        },
        message_id=None,
        routing_key="delays.alerts",
    )
    resumed = arrival_from(
        {X_THROTTLE_EVENT: "resumed", X_QUEUE: "orders"}, message_id=None, routing_key="x"
    )
    parked = arrival_from(
        {X_PARKED_REASON: "max-retries", X_QUEUE: "orders", X_EXCEPTION_TYPE: "KeyError"},
        message_id="m1",
        routing_key="orders",
    )
    assert tripped.event == (
        "consumer of orders throttled after 5 consecutive failures (last: ConnectionError: db down)"
    )
    alert = group_arrivals([tripped, parked, resumed])
    assert alert.total == 1
    assert alert.message_ids == ("m1",)
    assert alert.events == (tripped.event, resumed.event)
    assert alert.title() == (
        "1 message parked on orders; consumer of orders resumed full speed after a successful "
        "probe (and 1 more throttle events)"
    )
    assert "  throttle: consumer of orders throttled after" in alert.text()
    assert alert.to_json()["events"] == list(alert.events)


def test_an_alert_of_throttle_events_alone_says_so() -> None:
    alert = group_arrivals(
        [arrival_from({X_THROTTLE_EVENT: "tripped"}, message_id=None, routing_key="x")]
    )
    assert alert.total == 0
    assert alert.title() == "consumer of ? throttled after a run of failures (last: -)"


async def test_a_counts_predicate_that_raises_counts_nothing_and_changes_nothing() -> None:
    class Broken(retry_base):
        def __call__(self, retry_state: object) -> bool:
            raise RuntimeError("bug in the predicate")

    control = ThrottleControl(
        Throttle(consecutive=1, counts=Broken()),
        queue="orders",
        topology=DelayTopology(),
        publish_timeout=1.0,
    )
    control.observe(fake_message(FakeChannel()), ConnectionError("down"))
    assert not control.throttled
