"""What a waiting message is read as, which ones a discard selects, and its parking record."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from delayed_retry import DelayTopology
from delayed_retry.admin.waiting import (
    DISCARDED,
    READ_BUDGET,
    WaitingMessage,
    WaitingSelection,
    discarded_headers,
    over_read_budget,
    read_waiting,
    reads_are_counted,
)
from delayed_retry.chain.topology import QueueType
from delayed_retry.durations import to_epoch_ms
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers import (
    X_DUE_AT,
    X_PARKED_AT,
    X_PARKED_NOTE,
    X_PARKED_REASON,
    X_QUEUE,
)
from delayed_retry.parking.records import read_record

TOPOLOGY = DelayTopology(prefix="t", levels=8)
DUE = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


def _waiting(
    message_id: str | None = "m-1", *, destination: str = "orders", returns: int = 0
) -> WaitingMessage:
    route = TOPOLOGY.route(5, destination)
    headers = {X_DUE_AT: to_epoch_ms(DUE), "x-delivery-count": returns}
    return read_waiting(
        headers,
        message_id=message_id,
        body=b"body",
        routing_key=route.routing_key,
        level=2,
        levels=TOPOLOGY.levels,
    )


def test_a_waiting_message_names_its_destination_due_time_and_returns() -> None:
    message = _waiting(returns=3)
    assert (message.id, message.destination, message.due_at, message.returns) == (
        "m-1",
        "orders",
        DUE,
        3,
    )
    # Without a message id, the id parked messages have: a digest of the body.
    assert _waiting(None).id == read_record({}, message_id=None, body=b"body").id


def test_a_routing_key_the_chain_did_not_write_has_no_destination() -> None:
    message = read_waiting(
        {"x-delivery-count": True}, message_id=None, body=b"", routing_key="odd", level=0, levels=8
    )
    assert message.destination is None and message.due_at is None and message.returns == 0


def test_ids_and_queue_select_together_and_unmatched_ids_are_named() -> None:
    selection = WaitingSelection(ids=frozenset({"m-1", "gone"}), queue="orders")
    assert selection.matches(_waiting("m-1"))
    assert not selection.matches(_waiting("m-1", destination="billing"))
    assert not selection.matches(_waiting("m-2"))
    assert selection.unmatched([_waiting("m-1")]) == ("gone",)
    assert WaitingSelection(queue="orders").matches(_waiting("anything"))


@pytest.mark.parametrize("ids", [frozenset(), frozenset({" "})])
def test_an_empty_selection_is_refused(ids: frozenset[str]) -> None:
    with pytest.raises(ConfigurationError, match=r"teardown --discard-waiting|empty id"):
        WaitingSelection(ids=ids)


@pytest.mark.parametrize(
    ("major", "queue_type", "counted"),
    [(3, "quorum", False), (4, "classic", False), (4, "quorum", True), (None, "quorum", True)],
)
def test_reads_count_on_quorum_levels_of_rabbitmq_4(
    major: int | None, queue_type: QueueType, counted: bool
) -> None:
    assert reads_are_counted(broker_major=major, queue_type=queue_type) is counted


def test_the_budget_stops_reading_well_before_the_broker_limit_of_20() -> None:
    assert READ_BUDGET < 20
    assert over_read_budget(_waiting(returns=READ_BUDGET), counted=True)
    assert not over_read_budget(_waiting(returns=READ_BUDGET - 1), counted=True)
    assert not over_read_budget(_waiting(returns=50), counted=False)


def test_the_parking_record_of_a_discarded_message_sends_it_back_to_its_queue() -> None:
    now = datetime(2026, 11, 28, 10, 0, tzinfo=UTC)
    headers = discarded_headers(
        {X_DUE_AT: to_epoch_ms(DUE), "x-death": [{"count": 1}], "app": "kept"},
        destination="orders",
        now=now,
    )
    assert headers[X_PARKED_REASON] == DISCARDED
    assert headers[X_PARKED_AT] == to_epoch_ms(now)
    assert headers[X_QUEUE] == "orders" and headers["app"] == "kept"
    assert X_DUE_AT not in headers and "x-death" not in headers
    assert "2026-12-01T09:00:00+00:00" in headers[X_PARKED_NOTE]
    record = read_record(headers, message_id="m-1", body=b"body")
    assert (record.reason, record.queue) == ("discarded", "orders")
