"""The parking-lot filter and the replay headers: pure functions, no broker."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayed_retry import ConfigurationError
from delayed_retry.durations import to_epoch_ms
from delayed_retry.headers import (
    X_FIRST_FAILURE_AT,
    X_LAST_ERROR,
    X_LAST_FAILURE_AT,
    X_PARKED_AT,
    X_PARKED_REASON,
    X_QUEUE,
    X_REPLAY_CANARY,
    X_REPLAYED,
    X_REPLAYED_AT,
    X_REPLAYED_BY,
    X_RETRY,
)
from delayed_retry.parking.lot import (
    ParkedFilter,
    ParkedRecord,
    read_record,
    replay_headers,
)

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def record(
    *,
    exception_type: str | None = "billing.errors.CardDeclined",
    reason: str = "max-retries",
    parked_ago: timedelta | None = timedelta(hours=2),
    body: bytes = b'{"order": 17, "customer": "acme"}',
    message_id: str | None = "m-1",
    **extra: object,
) -> ParkedRecord:
    headers: dict[str, object] = {X_PARKED_REASON: reason, **extra}
    if exception_type is not None:
        headers["x-exception-type"] = exception_type
        headers["x-exception-message"] = "card 4242 declined"
    if parked_ago is not None:
        headers[X_PARKED_AT] = to_epoch_ms(NOW - parked_ago)
    return read_record(headers, message_id=message_id, body=body)


def test_an_empty_filter_matches_everything_even_foreign_messages() -> None:
    assert ParkedFilter().is_empty
    assert ParkedFilter().matches(record(), now=NOW)
    foreign = read_record(None, message_id=None, body=b"\xff\xfe")
    assert foreign.reason == "unknown" and foreign.id.startswith("sha256:")
    assert ParkedFilter().matches(foreign, now=NOW)


@pytest.mark.parametrize(
    ("where", "selected"),
    [
        (ParkedFilter(exception_type="CardDeclined"), True),
        (ParkedFilter(exception_type="billing.errors.CardDeclined"), True),
        (ParkedFilter(exception_type="Declined"), False),
        (ParkedFilter(exception_type="TimeoutError"), False),
        (ParkedFilter(reason="max-retries"), True),
        (ParkedFilter(reason="not-retryable"), False),
        (ParkedFilter(older_than=timedelta(hours=1)), True),
        (ParkedFilter(older_than=timedelta(hours=3)), False),
        (ParkedFilter(newer_than=timedelta(hours=3)), True),
        (ParkedFilter(newer_than=timedelta(hours=1)), False),
        (ParkedFilter(older_than=timedelta(hours=1), newer_than=timedelta(hours=3)), True),
        (ParkedFilter(headers=(("tenant", "ac"),)), True),
        (ParkedFilter(headers=(("tenant", "zz"),)), False),
        (ParkedFilter(headers=(("missing", ""),)), False),
        (ParkedFilter(body_contains='"customer": "acme"'), True),
        (ParkedFilter(body_contains="globex"), False),
        (ParkedFilter(ids=frozenset({"m-1"})), True),
        (ParkedFilter(ids=frozenset({"m-2"})), False),
        (ParkedFilter(reason="max-retries", body_contains="globex"), False),
    ],
)
def test_each_criterion_selects_and_all_must_match(where: ParkedFilter, selected: bool) -> None:
    assert where.matches(record(tenant=b"acme-corp"), now=NOW) is selected


def test_age_filters_skip_records_without_a_parking_time() -> None:
    undated = record(parked_ago=None)
    assert not ParkedFilter(older_than=timedelta(0)).matches(undated, now=NOW)
    assert not ParkedFilter(newer_than=timedelta(days=999)).matches(undated, now=NOW)


def test_fingerprint_groups_the_same_failure_and_separates_others() -> None:
    one = record(message_id="a")
    two = record(message_id="b", body=b"other")
    other = record(exception_type="TimeoutError")
    assert one.fingerprint and one.fingerprint == two.fingerprint != other.fingerprint
    assert ParkedFilter(fingerprint=one.fingerprint).matches(two, now=NOW)
    assert not ParkedFilter(fingerprint=one.fingerprint).matches(other, now=NOW)


def test_ages_may_be_given_in_seconds_and_bad_header_pairs_are_refused() -> None:
    where = ParkedFilter(older_than=90)  # type: ignore[arg-type]
    assert where.older_than == timedelta(seconds=90)
    with pytest.raises(ConfigurationError, match="name=text"):
        ParkedFilter(headers=(("", "x"),))


def test_a_replay_starts_a_fresh_budget_in_every_respect_and_records_the_replay() -> None:
    headers = {
        X_RETRY: 5,
        X_FIRST_FAILURE_AT: to_epoch_ms(NOW - timedelta(days=3)),
        X_LAST_FAILURE_AT: to_epoch_ms(NOW - timedelta(hours=1)),
        X_LAST_ERROR: "ValueError: no",
        X_QUEUE: "orders",
        X_PARKED_REASON: "max-retries",
        "x-exception-traceback": "Traceback ...",
        "x-death": [{"count": 1}],
        X_REPLAYED: 2,
        X_REPLAYED_BY: "someone-else",
        X_REPLAY_CANARY: "old-token",
        "app": "kept",
    }
    out = replay_headers(headers, due_at=NOW, now=NOW, replayed_by="ops@host")
    for gone in (
        X_FIRST_FAILURE_AT,
        X_LAST_FAILURE_AT,
        X_LAST_ERROR,
        X_QUEUE,
        X_PARKED_REASON,
        "x-exception-traceback",
        "x-death",
        X_REPLAY_CANARY,
    ):
        assert gone not in out, gone
    assert out[X_RETRY] == 0
    assert out[X_REPLAYED] == 3
    assert out[X_REPLAYED_AT] == to_epoch_ms(NOW)
    assert out[X_REPLAYED_BY] == "ops@host"
    assert out["app"] == "kept"
    assert X_REPLAYED_BY not in replay_headers(headers, due_at=NOW, now=NOW)
