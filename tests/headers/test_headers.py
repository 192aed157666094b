"""Reading and writing the retry state in headers; sanitizing headers for re-publish."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp.encode import decimal as encode_decimal
from pamqp.encode import field_table

from delayed_retry import headers as h
from delayed_retry.durations import to_epoch_ms
from delayed_retry.headers import values as header_values

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)

any_text = st.text(alphabet=st.characters(codec=None, categories=None), max_size=40)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.decimals(allow_nan=True, allow_infinity=True),
    any_text,
    st.binary(max_size=40),
    st.datetimes(timezones=st.none() | st.timezones()),
    st.just(object()),
    st.just({1, 2}),
)
values = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.one_of(any_text, st.integers()), children, max_size=4),
    ),
    max_leaves=20,
)
known_names = st.sampled_from(
    [
        h.X_RETRY,
        h.X_DUE_AT,
        h.X_FIRST_FAILURE_AT,
        h.X_LAST_FAILURE_AT,
        h.X_LAST_ERROR,
        h.X_ORIGINAL_EXCHANGE,
        h.X_ORIGINAL_ROUTING_KEY,
        h.X_QUEUE,
        "x-death",
        "x-first-death-queue",
        "x-last-death-reason",
        "x-delivery-count",
        "x-acquired-count",
    ]
)
death_entry = st.fixed_dictionaries(
    {},
    optional={
        "count": values,
        "reason": st.sampled_from(["rejected", "expired", "maxlen", "delivery_limit"]) | values,
        "queue": st.sampled_from(["q", "other"]) | values,
        "time": values,
    },
)
header_dicts = st.dictionaries(
    st.one_of(known_names, any_text),
    st.one_of(values, st.lists(death_entry | values, max_size=4)),
    max_size=8,
)


def death(queue: str, reason: str, count: int) -> dict[str, Any]:
    return {"queue": queue, "reason": reason, "count": count, "exchange": "", "time": NOW}


# -- parse_retry_state ---------------------------------------------------------------------


def test_no_headers_is_a_first_attempt() -> None:
    odd: tuple[object, ...] = (None, {}, "not a mapping", 7)
    for headers in odd:
        state = h.parse_retry_state(headers, exchange="ex", routing_key="rk", queue="q")  # type: ignore[arg-type]
        assert (state.attempt, state.retries, state.problems) == (1, 0, ())
        assert (state.original_exchange, state.original_routing_key, state.queue) == (
            "ex",
            "rk",
            "q",
        )
        assert state.first_failure_at is None


def test_state_written_by_failure_headers_reads_back() -> None:
    first = h.parse_retry_state({}, exchange="orders", routing_key="eu.new", queue="q")
    written = h.failure_headers({"a": 1}, first, ValueError("boom"), now=NOW, retries=1)
    # Later deliveries come from the chain: their own exchange and key say nothing.
    later = h.parse_retry_state(written, exchange="p.delivery", routing_key="0.1.q", queue="q")
    assert later.attempt == 2
    assert later.retries == 1
    assert later.original_exchange == "orders"
    assert later.original_routing_key == "eu.new"
    assert later.first_failure_at == later.last_failure_at == NOW
    assert later.last_error == "ValueError: boom"
    assert later.problems == ()
    again = h.failure_headers(
        written, later, KeyError("k"), now=NOW + timedelta(seconds=3), retries=2
    )
    third = h.parse_retry_state(again, exchange="x", routing_key="y", queue="q")
    assert third.first_failure_at == NOW
    assert third.last_failure_at == NOW + timedelta(seconds=3)
    assert third.attempt == 3


@pytest.mark.parametrize("raw", [-1, "3", 3.0, True, 10**7, b"2", [1]])
def test_malformed_retry_count_counts_from_zero_and_says_why(raw: object) -> None:
    state = h.parse_retry_state({h.X_RETRY: raw}, exchange="e", routing_key="r", queue="q")
    assert state.retries == 0
    assert len(state.problems) == 1
    assert h.X_RETRY in state.problems[0]


def test_rejections_in_x_death_count_for_the_consumed_queue_only() -> None:
    headers = {
        "x-death": [
            death("q", "rejected", 3),
            death("other", "rejected", 10),
            death("p.level.03", "expired", 50),
            death("q", "delivery_limit", 1),
        ],
        h.X_RETRY: 2,
    }
    state = h.parse_retry_state(headers, exchange="e", routing_key="r", queue="q")
    assert state.broker_deaths == 4
    assert state.retries == 4  # the larger of our own count and the broker's
    assert h.parse_retry_state(headers, exchange="e", routing_key="r", queue="q2").retries == 2


def test_odd_header_types_are_ignored_with_problems() -> None:
    state = h.parse_retry_state(
        {
            h.X_FIRST_FAILURE_AT: "yesterday",
            h.X_LAST_FAILURE_AT: -5,
            h.X_DUE_AT: 1 << 60,
            h.X_ORIGINAL_EXCHANGE: 42,
            h.X_LAST_ERROR: bytearray(b"ValueError: \xff"),
        },
        exchange="e",
        routing_key="r",
        queue="q",
    )
    assert state.first_failure_at is None
    assert state.last_failure_at is None
    assert state.due_at is None
    assert state.original_exchange == "e"
    assert state.last_error == "ValueError: \ufffd"
    assert len(state.problems) == 4


def test_timestamp_headers_may_be_aware_datetimes() -> None:
    state = h.parse_retry_state(
        {h.X_FIRST_FAILURE_AT: NOW, h.X_DUE_AT: to_epoch_ms(NOW)},
        exchange="e",
        routing_key="r",
        queue="q",
    )
    assert state.first_failure_at == NOW
    assert state.due_at == NOW


@settings(max_examples=150)
@given(header_dicts, st.sampled_from([None, "q"]))
def test_parse_retry_state_never_raises(headers: dict[str, Any], queue: str | None) -> None:
    state = h.parse_retry_state(headers, exchange="e", routing_key="r", queue=queue)
    assert 0 <= state.retries <= h.MAX_RETRY_COUNT
    assert state.attempt == state.retries + 1
    for moment in (state.first_failure_at, state.last_failure_at, state.due_at):
        assert moment is None or moment.tzinfo is not None


@given(
    st.dictionaries(
        st.sampled_from(["traceparent", "tenant", "x-other", "x-retry-replayed"]), st.text()
    ),
    st.sampled_from([None, "q"]),
    st.sampled_from([None, "", "e"]),
)
def test_a_message_without_retry_headers_reads_as_the_full_parse_would(
    headers: dict[str, Any], queue: str | None, exchange: str | None
) -> None:
    # Such a message takes a short path; an empty x-death forces the full one: same state.
    short = h.parse_retry_state(headers, exchange=exchange, routing_key="r", queue=queue)
    full = h.parse_retry_state(
        {**headers, "x-death": []}, exchange=exchange, routing_key="r", queue=queue
    )
    assert short == full
    assert short.attempt == 1 and short.original_exchange == (exchange or "")


def test_one_retry_header_is_enough_to_read_the_state() -> None:
    for name, value in ((h.X_RETRY, 2), (h.X_QUEUE, "other"), (h.X_ORIGINAL_EXCHANGE, "x")):
        state = h.parse_retry_state({name: value}, exchange="e", routing_key="r", queue="q")
        assert (state.retries, state.original_exchange) == {
            h.X_RETRY: (2, "e"),
            h.X_QUEUE: (0, "e"),
            h.X_ORIGINAL_EXCHANGE: (0, "x"),
        }[name]


# -- sanitize_headers ----------------------------------------------------------------------


def test_sanitize_removes_broker_death_headers() -> None:
    out = h.sanitize_headers(
        {
            "x-death": [death("q", "rejected", 1)],
            "x-first-death-queue": "q",
            "x-first-death-reason": "rejected",
            "x-last-death-exchange": "",
            "x-delivery-count": 3,
            "x-acquired-count": 4,  # RabbitMQ 4.3
            "keep": "me",
        }
    )
    assert out == {"keep": "me"}


def test_every_header_name_is_spelled_once_in_the_fingerprint_too() -> None:
    # fingerprint.py keeps its own spelling of four names (it ships alone to Spark executors).
    from delayed_retry.parking import fingerprint

    spelled = {
        fingerprint._X_EXCEPTION_TYPE: h.X_EXCEPTION_TYPE,
        fingerprint._X_EXCEPTION_MESSAGE: h.X_EXCEPTION_MESSAGE,
        fingerprint._X_EXCEPTION_TRACEBACK: h.X_EXCEPTION_TRACEBACK,
        fingerprint._X_LAST_ERROR: h.X_LAST_ERROR,
    }
    assert all(a == b for a, b in spelled.items()), spelled


def test_the_broker_read_counters_are_set_apart_from_the_message_headers() -> None:
    own, counters = h.split_read_counters(
        {"x-delivery-count": 3, "x-acquired-count": 4, "x-retry": 2, "tenant": "acme"}
    )
    assert own == {"x-retry": 2, "tenant": "acme"}
    assert counters == {"x-delivery-count": 3, "x-acquired-count": 4}
    assert all("each look counts" in h.BROKER_READ_COUNTERS[name] for name in counters)
    assert h.split_read_counters({"tenant": "acme"}) == ({"tenant": "acme"}, {})


def test_sanitize_makes_awkward_values_encodable() -> None:
    out = h.sanitize_headers(
        {
            "bytes": b"\x00\x01",
            "float": 0.1,
            "float32": 0.5,
            "nan": float("nan"),
            "huge": 1 << 80,
            "dec": Decimal("1e-300"),
            "tuple": (1, "a"),
            "set": {1},
            "long": "x" * 100_000,
        }
    )
    assert out["bytes"] == bytearray(b"\x00\x01")
    assert out["float"] == "0.1"
    assert out["float32"] == 0.5
    assert out["nan"] == "nan"
    assert out["huge"] == str(1 << 80)
    assert out["dec"] == "1E-300"
    assert out["tuple"] == [1, "a"]
    assert out["set"] == "{1}"
    assert len(out["long"]) < 40_000
    field_table(out)


def test_sanitize_keeps_datetimes_as_timestamps() -> None:
    out = h.sanitize_headers({"when": NOW})
    assert out["when"] == NOW
    field_table(out)


@pytest.mark.parametrize(
    "moment",
    [
        datetime(1960, 1, 1, tzinfo=UTC),
        datetime(1, 1, 1),  # noqa: DTZ001 (naive, as a publisher may send)
        datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))),
    ],
)
def test_sanitize_spells_out_datetimes_amqp_cannot_carry(moment: datetime) -> None:
    out = h.sanitize_headers({"when": moment})
    field_table(out)


def test_sanitize_bounds_long_keys_by_bytes() -> None:
    out = h.sanitize_headers({"é" * 200: 1, "nested": {"€" * 200: 2}})
    field_table(out)


def test_sanitize_ignores_non_mappings() -> None:
    assert h.sanitize_headers(None) == {}
    assert h.sanitize_headers([("a", 1)]) == {}  # type: ignore[arg-type]


@settings(max_examples=150)
@given(header_dicts)
def test_sanitized_headers_are_always_encodable(headers: dict[str, Any]) -> None:
    out = h.sanitize_headers(headers)
    field_table(out)
    assert not any(k == "x-death" or k.startswith(("x-first-death", "x-last-death")) for k in out)


@given(header_dicts)
def test_failure_and_parking_headers_are_always_encodable(headers: dict[str, Any]) -> None:
    state = h.parse_retry_state(headers, exchange="e", routing_key="r", queue="q")
    try:
        raise RuntimeError("boom \udcff " * 2000)  # surrogate: an OSError on an odd file name
    except RuntimeError as exc:
        error = exc
    field_table(h.failure_headers(headers, state, error, now=NOW, retries=state.retries + 1))
    parked = h.parking_headers(headers, state, error, now=NOW, reason="max-retries")
    field_table(parked)
    assert len(parked[h.X_EXCEPTION_MESSAGE]) <= h.MAX_ERROR_CHARS


# -- failure and parking records -----------------------------------------------------------


def test_parking_record_is_complete_and_bounded() -> None:
    state = h.parse_retry_state(
        {h.X_RETRY: 4, h.X_FIRST_FAILURE_AT: to_epoch_ms(NOW - timedelta(hours=1))},
        exchange="orders",
        routing_key="eu",
        queue="q",
    )

    def deep(n: int) -> None:
        if n:
            deep(n - 1)
        raise ValueError("x" * 50_000)

    try:
        deep(200)
    except ValueError as exc:
        error = exc
    out = h.parking_headers({h.X_DUE_AT: 1, "keep": 1}, state, error, now=NOW, reason="max-retries")
    assert out[h.X_PARKED_REASON] == "max-retries"
    assert out[h.X_PARKED_AT] == to_epoch_ms(NOW)
    assert out[h.X_EXCEPTION_TYPE] == "ValueError"
    assert out[h.X_EXCEPTION_MESSAGE].startswith("xxx")
    assert len(out[h.X_EXCEPTION_MESSAGE]) <= h.MAX_ERROR_CHARS
    assert len(out[h.X_EXCEPTION_TRACEBACK]) <= h.MAX_TRACEBACK_CHARS
    assert out[h.X_EXCEPTION_TRACEBACK].rstrip().endswith("x" * 20)  # innermost part kept
    assert out[h.X_RETRY] == 4
    assert out[h.X_FIRST_FAILURE_AT] == to_epoch_ms(NOW - timedelta(hours=1))
    assert out[h.X_LAST_FAILURE_AT] == to_epoch_ms(NOW)
    assert out[h.X_ORIGINAL_EXCHANGE] == "orders"
    assert out[h.X_ORIGINAL_ROUTING_KEY] == "eu"
    assert out[h.X_QUEUE] == "q"
    assert h.X_DUE_AT not in out
    assert out["keep"] == 1
    field_table(out)


def test_exception_type_is_qualified_outside_builtins() -> None:
    class Local(Exception):
        pass

    out = h.parking_headers(
        {},
        h.parse_retry_state({}, exchange="", routing_key="", queue="q"),
        Local("m"),
        now=NOW,
        reason="not-retryable",
    )
    assert out[h.X_EXCEPTION_TYPE].endswith(
        "test_headers.test_exception_type_is_qualified_outside_builtins.<locals>.Local"
    )


def test_header_problems_travel_to_parking() -> None:
    state = h.parse_retry_state({h.X_RETRY: "many"}, exchange="", routing_key="", queue="q")
    out = h.parking_headers({}, state, ValueError(), now=NOW, reason="max-retries")
    assert "x-retry" in out["x-retry-header-problems"]


def test_scheduled_headers_carry_the_due_time() -> None:
    out = h.scheduled_headers({"x-death": [], "a": "b"}, due_at=NOW)
    assert out == {"a": "b", h.X_DUE_AT: to_epoch_ms(NOW)}


@given(
    st.decimals(allow_nan=True, allow_infinity=True)
    | st.builds(
        lambda mantissa, exponent: Decimal(mantissa).scaleb(exponent),
        st.integers(-(1 << 40), 1 << 40),
        st.integers(-300, 300),
    )
)
def test_decimal_check_agrees_with_the_amqp_encoder(value: Decimal) -> None:
    try:
        encode_decimal(value)
        encodable = True
    except (TypeError, ValueError, OverflowError):
        encodable = False
    assert header_values._amqp_decimal(value) is encodable


WIRE_NAMES = {
    "X_RETRY": "x-retry",
    "X_DUE_AT": "x-retry-due-at",
    "X_FIRST_FAILURE_AT": "x-retry-first-failure-at",
    "X_LAST_FAILURE_AT": "x-retry-last-failure-at",
    "X_LAST_ERROR": "x-retry-last-error",
    "X_ORIGINAL_EXCHANGE": "x-retry-original-exchange",
    "X_ORIGINAL_ROUTING_KEY": "x-retry-original-routing-key",
    "X_QUEUE": "x-retry-queue",
    "X_PARKED_REASON": "x-parked-reason",
    "X_PARKED_AT": "x-parked-at",
    "X_PARKED_REFRESHED_AT": "x-parked-refreshed-at",
    "X_EXCEPTION_TYPE": "x-exception-type",
    "X_EXCEPTION_MESSAGE": "x-exception-message",
    "X_EXCEPTION_TRACEBACK": "x-exception-traceback",
    "X_REPLAYED": "x-retry-replayed",
    "X_REPLAYED_AT": "x-retry-replayed-at",
    "X_REPLAYED_BY": "x-retry-replayed-by",
    "X_REPLAY_CANARY": "x-retry-replay-canary",
    "X_DELAY": "x-delay",
    "X_FORWARD_ROUTING_KEY": "x-retry-forward-routing-key",
    "X_CLAIMED_QUEUE": "x-retry-claimed-queue",
    "X_TRACE_ORIGIN": "x-retry-trace-origin",
    "X_REDRIVE_ID": "x-redrive-id",
    "X_SCHEDULE_ID": "x-schedule-id",
    "X_PARKED_NOTE": "x-parked-note",
    "X_HEADER_PROBLEMS": "x-retry-header-problems",
    "X_MIGRATED_FROM": "x-retry-migrated-from",
    "X_IMMEDIATE_RUNS": "x-retry-immediate-runs",
    "X_RETRY_CRASHES": "x-retry-crashes",
    "X_THROTTLE_EVENT": "x-retry-throttle-event",
    "X_THROTTLE_TRIGGER": "x-retry-throttle-trigger",
    "X_THROTTLED_AT": "x-retry-throttled-at",
    "X_EDITED_AT": "x-edited-at",
    "X_EDITED_BY": "x-edited-by",
    "X_ORDER_KEY": "x-retry-order-key",
    "X_ORDER_TOKEN": "x-retry-order-token",
    "X_ORDER_SEQ": "x-retry-order-seq",
    "X_ORDER_RECORD": "x-retry-order-record",
    "X_EDITED_HEADERS": "x-edited-headers",
    "X_EDITED_OLD_BODY_SHA256": "x-edited-old-body-sha256",
    "X_DEATH": "x-death",
    "X_DELIVERY_COUNT": "x-delivery-count",
    "X_ACQUIRED_COUNT": "x-acquired-count",
}
"""Every header name as messages carry it: those waiting in a chain or parked were written with
these, so a name that changes leaves them unread."""


def test_the_header_names_on_the_wire_do_not_change() -> None:
    written = {
        name: getattr(h.names, name)
        for name in h.names.__all__
        if isinstance(getattr(h.names, name), str)
    }
    assert written == WIRE_NAMES
    assert all(getattr(h, name) == value for name, value in WIRE_NAMES.items())


@pytest.mark.parametrize(
    ("value", "expected"),
    [(3, 3), (0, 0), (-2, -2), (True, None), (False, None), ("3", None), (3.0, None), (None, None)],
)
def test_header_int_reads_integers_and_nothing_else(value: object, expected: int | None) -> None:
    result = header_values.header_int(value)
    assert result == expected
    assert type(result) is type(expected)


def test_a_boolean_parked_at_or_replay_count_is_not_read_as_a_number() -> None:
    assert h.read_epoch_ms(True) is None
    assert h.read_epoch_ms(1_700_000_000_000) == datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)
