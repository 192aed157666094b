"""Failure fingerprints: the same failure with other values is one group; others are not."""

from __future__ import annotations

import traceback as tb
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_retry import headers as h
from delayed_retry.fingerprint import (
    fingerprint,
    fingerprint_headers,
    message_template,
    raising_frame,
)


@pytest.mark.parametrize(
    ("message", "template"),
    [
        (
            "gateway did not answer in 10 s (order 105)",
            "gateway did not answer in <num> s (order <num>)",
        ),
        ("timeout after 2.5s", "timeout after <num>s"),
        ("order 7f3c9a1e-0b1d-4c2e-9f00-1234567890ab not found", "order <uuid> not found"),
        ("user 'alice' has no account", "user <str> has no account"),
        ('key "a b c" missing', "key <str> missing"),
        ("mail to bob.smith+x@example.co.uk bounced", "mail to <email> bounced"),
        ("GET https://api.example.com/v1/orders/42?x=1 gave 503", "GET <url> gave <num>"),
        ("cannot reach 10.0.0.12:5432", "cannot reach <ip>"),
        ("object at 0x7f00deadbeef freed", "object at <hex> freed"),
        ("sha deadbeef0123 mismatch", "sha <hex> mismatch"),
        ("expired at 2026-11-23T13:45:07.123Z", "expired at <time>"),
        ("run at 13:45:07 failed", "run at <time> failed"),
        ("stream reset by utf8 codec v1 for msg42", "stream reset by <id> codec <id> for <id>"),
        ("no order_105 or ID a7", "no <id> or ID <id>"),
        ("  many   spaces\nand lines  ", "many spaces and lines"),
        ("", ""),
    ],
)
def test_template_replaces_values_and_keeps_words(message: str, template: str) -> None:
    assert message_template(message) == template


def test_messages_differing_only_in_values_share_a_fingerprint() -> None:
    a = fingerprint(exception_type="TimeoutError", message="no answer in 10 s (order 105)")
    b = fingerprint(exception_type="TimeoutError", message="no answer in 30 s (order 9106)")
    assert a == b
    assert str(a) == a.key
    assert len(a.key) == 12


@pytest.mark.parametrize(
    "other",
    [
        {"exception_type": "ValueError", "message": "no answer in 10 s (order 105)"},
        {"exception_type": "TimeoutError", "message": "refused in 10 s (order 105)"},
        {
            "exception_type": "TimeoutError",
            "message": "no answer in 10 s (order 105)",
            "traceback": 'Traceback:\n  File "/srv/app/pay.py", line 3, in charge\n',
        },
    ],
)
def test_another_type_frame_or_wording_is_another_group(other: dict[str, str]) -> None:
    base = fingerprint(exception_type="TimeoutError", message="no answer in 10 s (order 105)")
    assert fingerprint(**other).key != base.key


def _real_traceback() -> str:
    def charge() -> None:
        raise TimeoutError("gateway")

    try:
        charge()
    except TimeoutError:
        return tb.format_exc()
    raise AssertionError("charge() did not raise")


def test_raising_frame_is_the_innermost_without_line_or_directory() -> None:
    assert raising_frame(_real_traceback()) == "test_fingerprint.py:charge"
    moved = _real_traceback().replace("line ", "line 9")  # another deploy, other line numbers
    assert raising_frame(moved) == "test_fingerprint.py:charge"
    assert raising_frame(None) == ""
    assert raising_frame("not a traceback") == ""


def test_headers_of_a_parked_message() -> None:
    now = datetime.now(UTC)
    try:
        raise TimeoutError("order 105 timed out after 10 s")
    except TimeoutError as exc:
        state = h.parse_retry_state({}, exchange="", routing_key="orders", queue="orders")
        record = h.parking_headers({}, state, exc, now=now, reason="max-retries")
    print_ = fingerprint_headers(record)
    assert print_.exception_type == "TimeoutError"
    assert print_.template == "order <num> timed out after <num> s"
    assert print_.frame == "test_fingerprint.py:test_headers_of_a_parked_message"


def test_headers_with_only_the_last_error_and_bytes_values() -> None:
    from_last = fingerprint_headers({h.X_LAST_ERROR: "app.Boom: order 5 failed"})
    from_record = fingerprint_headers(
        {h.X_EXCEPTION_TYPE: b"app.Boom", h.X_EXCEPTION_MESSAGE: bytearray(b"order 6 failed")}
    )
    assert from_last == from_record
    assert from_last.label() == "app.Boom: order <num> failed"


def test_nothing_known_is_one_stable_group() -> None:
    assert fingerprint_headers(None) == fingerprint_headers({"x-other": 1})
    assert fingerprint_headers(None).label() == "unknown"


@given(st.text(max_size=300))
def test_template_is_stable_bounded_and_idempotent(message: str) -> None:
    template = message_template(message)
    assert len(template) <= 500
    assert message_template(message) == template
    assert message_template(template) == template


@given(st.integers(), st.integers())
def test_any_numbers_give_one_group(a: int, b: int) -> None:
    one = fingerprint(exception_type="E", message=f"order {a} failed after {b} tries")
    two = fingerprint(exception_type="E", message=f"order {b} failed after {a} tries")
    assert one.key == two.key
