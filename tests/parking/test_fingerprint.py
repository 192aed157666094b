"""The failure fingerprint: templates, raising frames, keys, and parked-message headers."""

from __future__ import annotations

import traceback
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_retry.headers import (
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TRACEBACK,
    X_EXCEPTION_TYPE,
    X_LAST_ERROR,
)
from delayed_retry.parking.fingerprint import (
    UNKNOWN_TYPE,
    fill_template,
    fingerprint,
    fingerprint_headers,
    masked_values,
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
        ("took 1.5s, limit 250ms", "took <num>s, limit <num>ms"),
        ("order ORD-2024-00017 rejected", "order ORD-<num>-<num> rejected"),
        ("customer 6f1c2a0e-3b4d-4c5e-8f90-1a2b3c4d5e6f not found", "customer <uuid> not found"),
        ("object at 0x7f3a2b1c9d80 is closed", "object at <hex> is closed"),
        ("blob 5f2c9e1ab3d4e6f7 missing", "blob <hex> missing"),
        ("no such key 'sku-17' in \"cart\"", "no such key <str> in <str>"),
        ("can't reach host", "can't reach host"),
        ("mail to jane.doe+x@example.co.uk bounced", "mail to <email> bounced"),
        (
            "GET https://api.example.com/v1/orders/105?x=1 failed.",
            "GET <url> failed.",
        ),
        ("connect to 10.0.3.17:5672 refused", "connect to <ip> refused"),
        ("peer fe80::1ff:fe23:4567:890a reset", "peer <ip> reset"),
        ("expired at 2026-11-23T14:05:00Z", "expired at <time>"),
        ("expired at 2026-11-23 14:05:00.123+01:00", "expired at <time>"),
        ("lock held since 14:05:07", "lock held since <time>"),
        ("utf8 decode of sha256 failed", "utf<num> decode of sha<num> failed"),
        ("gateway down for a1", "gateway down for a<num>"),
        ("version 1.2.3 unsupported", "version <num> unsupported"),
        ("  many\n\tspaces   here ", "many spaces here"),
        ("", ""),
    ],
)
def test_message_template_masks_variable_parts(message: str, template: str) -> None:
    assert message_template(message) == template


def test_messages_differing_only_in_values_share_one_key() -> None:
    a = fingerprint(exception_type="TimeoutError", message="gateway timeout (order 105)")
    b = fingerprint(exception_type="TimeoutError", message="gateway timeout (order 106)")
    assert a == b
    assert len(a.key) == 12
    assert int(a.key, 16) >= 0


def test_type_frame_and_template_each_change_the_key() -> None:
    def key(kind: str, message: str, frame: str | None) -> str:
        return fingerprint(exception_type=kind, message=message, frame=frame).key

    base = key("ValueError", "bad 1", "a.py in f")
    assert base != key("KeyError", "bad 1", "a.py in f")
    assert base != key("ValueError", "bad x", "a.py in f")
    assert base != key("ValueError", "bad 1", "a.py in g")
    assert base != key("ValueError", "bad 1", None)


def test_key_never_drifts() -> None:
    # Keys are stored in reports and used in filters: a change here breaks them.
    fp = fingerprint(exception_type="TimeoutError", message="t 1", frame="app/x.py in h")
    assert fp.key == "cea31e990c07"


def test_missing_type_and_message_still_fingerprint() -> None:
    fp = fingerprint(exception_type=None, message=None)
    assert fp.exception_type == UNKNOWN_TYPE
    assert fp.template == ""
    assert fp.frame is None
    assert fp.label() == UNKNOWN_TYPE


def _raise_in_nested(order: int) -> str:
    def handle() -> None:
        raise TimeoutError(f"gateway did not answer (order {order})")

    try:
        try:
            int("x")
        except ValueError as first:
            raise RuntimeError("wrapped") from first
    except RuntimeError:
        try:
            handle()
        except TimeoutError as exc:
            return "".join(traceback.format_exception(exc))
    raise AssertionError("unreachable")


def test_raising_frame_is_the_innermost_frame_of_the_last_traceback() -> None:
    text = _raise_in_nested(1)
    assert "During handling" in text  # a chained traceback: the last one raised
    assert raising_frame(text) == "parking/test_fingerprint.py in handle"


def test_raising_frame_shortens_installed_paths_and_ignores_line_numbers() -> None:
    one = (
        "Traceback (most recent call last):\n"
        '  File "/a/lib/python3.11/site-packages/shop/pay.py", line 10, in charge\n'
        "    x()\n"
        "ValueError: no\n"
    )
    two = one.replace("/a/lib", "/opt/venv/lib").replace("line 10", "line 99")
    assert raising_frame(one) == "shop/pay.py in charge"
    assert raising_frame(two) == raising_frame(one)
    assert raising_frame("ValueError: no traceback here") is None
    assert raising_frame(None) is None
    assert raising_frame("") is None


def test_fingerprint_reads_the_frame_from_a_traceback() -> None:
    a = fingerprint(exception_type="TimeoutError", message="x", traceback=_raise_in_nested(1))
    assert a.frame == "parking/test_fingerprint.py in handle"
    given_frame = fingerprint(exception_type="TimeoutError", message="x", frame="f.py in g")
    assert given_frame.frame == "f.py in g"
    assert a.label() == "TimeoutError: x [parking/test_fingerprint.py in handle]"


def test_fingerprint_headers_of_a_parking_record() -> None:
    headers = {
        X_EXCEPTION_TYPE: "TimeoutError",
        X_EXCEPTION_MESSAGE: b"gateway did not answer (order 105)",
        X_EXCEPTION_TRACEBACK: _raise_in_nested(105),
        X_LAST_ERROR: "TimeoutError: gateway did not answer (order 105)",
    }
    fp = fingerprint_headers(headers)
    assert fp.exception_type == "TimeoutError"
    assert fp.template == "gateway did not answer (order <num>)"
    assert fp.frame == "parking/test_fingerprint.py in handle"
    other = dict(headers, **{X_EXCEPTION_MESSAGE: "gateway did not answer (order 7)"})
    assert fingerprint_headers(other).key == fp.key


def test_fingerprint_headers_falls_back_to_the_last_error() -> None:
    fp = fingerprint_headers({X_LAST_ERROR: "shop.errors.PaymentDeclined: card 4242 declined"})
    assert fp.exception_type == "shop.errors.PaymentDeclined"
    assert fp.template == "card <num> declined"
    plain = fingerprint_headers({X_LAST_ERROR: "something broke: badly 3"})
    assert plain.exception_type == UNKNOWN_TYPE
    assert plain.template == "something broke: badly <num>"


def test_fingerprint_headers_without_a_record_or_with_wrong_types() -> None:
    assert fingerprint_headers(None).exception_type == UNKNOWN_TYPE
    odd = fingerprint_headers({X_EXCEPTION_TYPE: 17, X_EXCEPTION_MESSAGE: ["x"]})
    assert odd == fingerprint(exception_type=None, message=None)


_pieces = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=0).map(str),
    st.uuids().map(str),
    st.sampled_from(["'", '"', " ", ":", "::", ".", "-", "@", "0x", "://", "<num>", "\n"]),
)


@given(st.lists(_pieces, max_size=12).map("".join))
def test_template_is_idempotent(message: str) -> None:
    once = message_template(message)
    assert message_template(once) == once


@given(st.text(alphabet="abc xyz", max_size=20), st.integers(min_value=0), st.integers(min_value=0))
def test_numbers_between_words_never_split_a_group(words: str, a: int, b: int) -> None:
    fa = fingerprint(exception_type="E", message=f"{words} {a} items")
    fb = fingerprint(exception_type="E", message=f"{words} {b} items")
    assert fa.key == fb.key


@given(st.uuids(), st.uuids())
def test_uuids_never_split_a_group(a: uuid.UUID, b: uuid.UUID) -> None:
    assert message_template(f"id {a}.") == message_template(f"id {b}.") == "id <uuid>."


@given(st.text(max_size=200), st.text(max_size=40))
def test_fingerprint_is_deterministic_and_well_formed(message: str, kind: str) -> None:
    one = fingerprint(exception_type=kind, message=message)
    two = fingerprint(exception_type=kind, message=message)
    assert one == two
    assert len(one.key) == 12
    assert all(c in "0123456789abcdef" for c in one.key)
    assert one.exception_type.strip() == one.exception_type
    assert one.exception_type
    assert "\n" not in one.template
    assert not any(ch.isdigit() for ch in message_template(" ".join(str(i) for i in range(5))))


def test_masked_values_are_what_the_placeholders_stand_for() -> None:
    assert masked_values("'customer_id'") == ("'customer_id'",)
    assert masked_values("gateway did not answer in 10 s (order 105)") == ("10", "105")
    assert masked_values("no  variable\n parts") == ()
    assert masked_values("") == ()
    template = message_template("gateway did not answer in 10 s (order 105)")
    assert fill_template(template, ["10", None]) == "gateway did not answer in 10 s (order <num>)"
    assert fill_template("KeyError <str>", []) == "KeyError <str>"


@given(st.text(max_size=80))
def test_filling_a_template_with_its_masked_values_gives_the_message_back(message: str) -> None:
    values = masked_values(message)
    template = message_template(message)
    if values:
        assert fill_template(template, values) == " ".join(message.split())
