"""What the ids an operator types select in a parking lot: pure, no broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayed_retry import ConfigurationError
from delayed_retry.durations import to_epoch_ms
from delayed_retry.headers import X_PARKED_AT, X_PARKED_REASON
from delayed_retry.parking.ids import IdMatch, IdMatcher, describe_candidate, selected_count
from delayed_retry.parking.records import ParkedRecord, read_record

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def parked(message_id: str | None, *, body: bytes = b"{}", hours_ago: int = 2) -> ParkedRecord:
    headers = {
        X_PARKED_REASON: "max-retries",
        X_PARKED_AT: to_epoch_ms(NOW - timedelta(hours=hours_ago)),
        "x-exception-type": "billing.errors.CardDeclined",
    }
    return read_record(headers, message_id=message_id, body=body)


LOT = [
    parked("order-1", body=b"a"),
    parked("order-10", body=b"b"),
    parked("order-2", body=b"c"),
    parked("order-2", body=b"d", hours_ago=1),
    parked(None, body=b"no id"),
]


def _match(given: str, *, keep: int = 10) -> IdMatch:
    matcher = IdMatcher([given], keep=keep)
    for record in LOT:
        matcher.add(record)
    (match,) = matcher.matches()
    return match


def test_a_unique_prefix_selects_one_message() -> None:
    match = _match("order-10")
    assert match.count == 1 and match.ids == {"order-10"} and not match.ambiguous
    digest_id = LOT[-1].id
    assert digest_id.startswith("sha256:")
    assert _match(digest_id[:12]).ids == {digest_id}


def test_a_whole_id_wins_over_the_longer_ids_it_starts() -> None:
    # Otherwise order-1 could never be named alone while order-10 is parked.
    match = _match("order-1")
    assert match.exact and match.count == 1 and match.ids == {"order-1"}


def test_a_prefix_of_several_ids_selects_them_all_and_says_so() -> None:
    match = _match("order-")
    assert not match.exact and match.ambiguous
    assert match.count == 4 and match.ids == {"order-1", "order-10", "order-2"}
    assert [r.id for r in match.records] == ["order-1", "order-10", "order-2", "order-2"]


def test_two_messages_with_one_id_are_both_selected_never_just_the_first() -> None:
    match = _match("order-2")
    assert match.exact and match.count == 2 and match.ids == {"order-2"}
    first, second = (describe_candidate(r) for r in match.records)
    # What tells them apart: when each was parked, and its body.
    assert first != second
    assert "parked 2026-03-01T10:00:00+00:00" in first and "max-retries CardDeclined" in first
    assert "parked 2026-03-01T11:00:00+00:00" in second


def test_records_kept_are_bounded_and_counts_are_not() -> None:
    match = _match("order", keep=2)
    assert match.count == 4 and len(match.records) == 2


def test_nothing_selected_and_each_given_id_on_its_own() -> None:
    matcher = IdMatcher(["nope", "order-2", "nope"])
    for record in LOT:
        matcher.add(record)
    nope, two = matcher.matches()
    assert (nope.given, nope.found, nope.count) == ("nope", False, 0)
    assert two.count == 2


def test_messages_two_ids_select_are_counted_once() -> None:
    matcher = IdMatcher(["order-", "order-2"])
    for record in LOT:
        matcher.add(record)
    prefix, whole = matcher.matches()
    assert (prefix.count, whole.count) == (4, 2)
    assert selected_count([prefix, whole]) == 4


@pytest.mark.parametrize("given", ["", "  "])
def test_an_empty_id_is_refused_rather_than_selecting_everything(given: str) -> None:
    with pytest.raises(ConfigurationError, match="an empty id selects nothing"):
        IdMatcher([given])
