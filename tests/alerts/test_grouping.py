"""Storm control and alert texts, as pure functions with a controllable clock."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from delayed_retry.alerts import Alert, AlertWindow, ParkedArrival, arrival_from, group_arrivals
from delayed_retry.durations import to_epoch_ms
from delayed_retry.headers import (
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TRACEBACK,
    X_EXCEPTION_TYPE,
    X_PARKED_AT,
    X_PARKED_REASON,
    X_QUEUE,
)
from delayed_retry.parking.fingerprint import fingerprint


def arrival(i: int, queue: str = "orders", exc: str = "TimeoutError") -> ParkedArrival:
    return ParkedArrival(
        message_id=f"m{i}",
        queue=queue,
        exception_type=exc,
        reason="max-retries",
        parked_at=datetime(2026, 1, 1, 0, 0, i % 60, tzinfo=UTC),
    )


def test_window_opens_on_first_arrival_and_closes_after_window() -> None:
    window: AlertWindow[int] = AlertWindow(window=10.0)
    assert window.deadline() is None
    assert not window.ready(now=0.0)
    window.add(arrival(1), 1, now=100.0)
    window.add(arrival(2), 2, now=105.0)
    assert window.deadline() == 110.0
    assert not window.ready(now=109.9)
    assert window.ready(now=110.0)
    taken = window.take()
    assert taken is not None
    alert, tokens = taken
    assert tokens == [1, 2]
    assert alert.total == 2
    assert window.deadline() is None
    assert window.take() is None


def test_arrivals_after_a_take_open_a_new_window() -> None:
    window: AlertWindow[int] = AlertWindow(window=5.0)
    window.add(arrival(1), 1, now=0.0)
    assert window.take() is not None
    window.add(arrival(2), 2, now=50.0)
    assert window.deadline() == 55.0


def test_full_batch_is_ready_before_the_window_closes_and_the_rest_waits() -> None:
    window: AlertWindow[int] = AlertWindow(window=60.0, max_batch=3)
    for i in range(5):
        window.add(arrival(i), i, now=float(i))
    assert window.ready(now=4.0)
    taken = window.take()
    assert taken is not None
    assert taken[1] == [0, 1, 2]
    assert len(window) == 2
    # The remainder keeps the open window's deadline: it is alerted on without a new wait.
    assert window.deadline() == 60.0
    assert not window.ready(now=59.0)
    taken = window.take()
    assert taken is not None
    assert taken[1] == [3, 4]


def test_zero_window_is_ready_at_once() -> None:
    window: AlertWindow[str] = AlertWindow(window=0.0)
    window.add(arrival(1), "a", now=7.0)
    assert window.ready(now=7.0)


@pytest.mark.parametrize(("window", "batch"), [(-1.0, 10), (1.0, 0)])
def test_window_rejects_bad_settings(window: float, batch: int) -> None:
    with pytest.raises(ValueError, match="AlertWindow"):
        AlertWindow(window=window, max_batch=batch)


def test_storm_groups_counts_by_queue_and_exception_and_names_first_ids() -> None:
    arrivals = (
        [arrival(i, "orders", "TimeoutError") for i in range(120)]
        + [arrival(200 + i, "orders", "KeyError") for i in range(3)]
        + [arrival(300 + i, "payments", "TimeoutError") for i in range(7)]
    )
    alert = group_arrivals(arrivals, max_ids=4)
    assert alert.total == 130
    assert [(g.queue, g.exception_type, g.count) for g in alert.groups] == [
        ("orders", "TimeoutError", 120),
        ("payments", "TimeoutError", 7),
        ("orders", "KeyError", 3),
    ]
    assert alert.message_ids == ("m0", "m1", "m2", "m3")
    assert alert.more == 126
    assert alert.queues == ("orders", "payments")
    text = alert.text()
    assert text.splitlines()[0] == "130 messages parked on orders, payments"
    assert "orders: 120 × TimeoutError" in text
    assert "… and 126 more." in text
    assert "delayed-retry parking list --queue orders" in text
    assert "delayed-retry parking list --queue payments" in text
    assert alert.first_parked_at == datetime(2026, 1, 1, 0, 0, 0, tzinfo=UTC)
    assert alert.last_parked_at == datetime(2026, 1, 1, 0, 0, 59, tzinfo=UTC)


def test_json_and_slack_payloads() -> None:
    alert = group_arrivals([arrival(1)], max_ids=5)
    payload = alert.to_json()
    assert payload["total"] == 1
    assert payload["message_ids"] == ["m1"]
    assert payload["more"] == 0
    key = fingerprint(exception_type="TimeoutError", message=None).key
    assert payload["groups"] == [
        {
            "queue": "orders",
            "exception_type": "TimeoutError",
            "count": 1,
            "example": None,
            "key": key,
            "template": None,
        }
    ]
    assert payload["title"] == "1 message parked on orders"
    slack = alert.to_slack()
    assert slack["text"] == "1 message parked on orders"
    assert slack["blocks"][0]["type"] == "section"
    assert "orders: 1 × TimeoutError" in slack["blocks"][0]["text"]["text"]


def test_arrival_from_parking_record() -> None:
    when = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
    headers = {
        X_PARKED_REASON: "max-retries",
        X_QUEUE: "orders",
        X_EXCEPTION_TYPE: "myapp.GatewayDown",
        X_EXCEPTION_MESSAGE: b"gateway down",
        X_PARKED_AT: to_epoch_ms(when),
    }
    got = arrival_from(headers, message_id="abc", routing_key="orders")
    assert got == ParkedArrival(
        message_id="abc",
        queue="orders",
        exception_type="myapp.GatewayDown",
        reason="max-retries",
        exception_message="gateway down",
        parked_at=when,
    )


def test_arrival_from_unroutable_chain_message_names_its_queue() -> None:
    got = arrival_from({}, message_id=None, routing_key="0.1.0.1.shop.orders", levels=4)
    assert got.queue == "shop.orders"
    assert got.exception_type == "unroutable"
    assert got.reason == "unroutable"


def test_arrival_from_unroutable_with_a_foreign_routing_key_keeps_the_key() -> None:
    assert arrival_from({}, message_id=None, routing_key="x.y", levels=4).queue == "x.y"
    assert arrival_from({X_QUEUE: "orders"}, message_id=None, routing_key="", levels=4).queue == (
        "orders"
    )


def test_arrival_from_malformed_headers_does_not_raise() -> None:
    got = arrival_from(
        {X_PARKED_REASON: "max-retries", X_PARKED_AT: "yesterday", X_EXCEPTION_TYPE: 5},
        message_id="x",
        routing_key="q",
    )
    assert got.parked_at is None
    assert got.exception_type == "unknown"
    assert got.queue == "q"


def test_empty_alert_text_has_no_listing() -> None:
    alert = Alert(total=0, groups=(), message_ids=())
    assert alert.more == 0
    assert "List them" not in alert.text()


def test_messages_differing_only_in_values_form_one_group_per_fingerprint() -> None:
    def failing(i: int, message: str, frame: str | None = None) -> ParkedArrival:
        return ParkedArrival(
            message_id=f"m{i}",
            queue="orders",
            exception_type="TimeoutError",
            reason="max-retries",
            exception_message=message,
            frame=frame,
        )

    arrivals = [failing(i, f"gateway did not answer in 10 s (order {100 + i})") for i in range(5)]
    arrivals += [failing(10, "gateway did not answer in 10 s (order 7)", frame="b.py in pay")]
    arrivals += [failing(11, "database locked by 'batch-7'")]
    alert = group_arrivals(arrivals)
    first, *rest = alert.groups
    assert (first.count, first.template) == (5, "gateway did not answer in <num> s (order <num>)")
    # Equal counts are ordered by queue, type and key: the same order in every run.
    assert sorted((g.count, g.template or "") for g in rest) == [
        (1, "database locked by <str>"),
        (1, "gateway did not answer in <num> s (order <num>)"),
    ]
    assert first.example == "gateway did not answer in 10 s (order 100)"
    assert first.key == arrivals[0].fingerprint.key
    other_frame = next(g for g in rest if g.template and g.template.startswith("gateway"))
    assert other_frame.key == arrivals[5].fingerprint.key != first.key


def test_arrival_reads_the_raising_frame_from_the_traceback() -> None:
    trace = (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/shop/orders.py", line 41, in handle\n'
        "    raise TimeoutError('x')\n"
        "TimeoutError: x\n"
    )
    got = arrival_from(
        {
            X_PARKED_REASON: "max-retries",
            X_EXCEPTION_TYPE: "TimeoutError",
            X_EXCEPTION_MESSAGE: "x",
            X_EXCEPTION_TRACEBACK: trace,
        },
        message_id="m1",
        routing_key="orders",
    )
    assert got.frame == "shop/orders.py in handle"
    assert got.fingerprint.frame == "shop/orders.py in handle"
