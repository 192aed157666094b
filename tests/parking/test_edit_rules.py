"""An edit of a parked message as pure logic: what it may change, the JSON rule, its record."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest

from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.names import (
    X_EDITED_AT,
    X_EDITED_BY,
    X_EDITED_HEADERS,
    X_EDITED_OLD_BODY_SHA256,
    owned_header_reason,
)
from delayed_retry.parking.edit_rules import (
    MessageEdit,
    apply_edit,
    body_for_editing,
    check_body,
    check_headers,
    edit_diff,
    is_json,
)

NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.mark.parametrize(
    "name",
    [
        "x-retry",
        "x-retry-queue",
        "X-Retry-Replayed",
        "x-parked-reason",
        "x-death",
        "x-first-death-queue",
        "x-delivery-count",
        "x-exception-type",
        "x-edited-by",
        "x-delay",
    ],
)
def test_headers_the_library_or_broker_owns_are_refused_by_name(name: str) -> None:
    assert owned_header_reason(name) is not None
    with pytest.raises(ConfigurationError, match=f"header '{name}' cannot be edited: it is "):
        check_headers(MessageEdit(set_headers={name: "1"}))
    with pytest.raises(ConfigurationError, match="cannot be edited"):
        check_headers(MessageEdit(unset_headers=frozenset({name})))


def test_the_message_own_headers_may_be_edited() -> None:
    assert owned_header_reason("tenant") is None
    assert owned_header_reason("x-tenant") is None
    check_headers(MessageEdit(set_headers={"tenant": "eu"}, unset_headers=frozenset({"x-tenant"})))


def test_an_empty_edit_and_a_header_set_and_removed_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="changes nothing"):
        check_headers(MessageEdit())
    with pytest.raises(ConfigurationError, match="'a' is both set and removed"):
        check_headers(MessageEdit(set_headers={"a": "1"}, unset_headers=frozenset({"a"})))


def test_json_is_told_by_content_type_or_by_parsing() -> None:
    assert is_json(b"not json", "application/vnd.acme+json")
    assert is_json(b'{"a": 1}', None)
    assert not is_json(b"order 7", "text/plain")


def test_a_json_body_must_stay_json_and_the_error_says_where() -> None:
    with pytest.raises(ConfigurationError, match=r"not JSON \(line 2 column 8: Expecting value"):
        check_body("m-1", b'{"a": 1}', None, b'{"a": 1,\n  "b": }')
    check_body("m-1", b'{"a": 1}', None, b'{"a": 2}')
    check_body("m-1", b"plain", "text/plain", b"{ not json")


def test_apply_edit_changes_the_headers_and_body_and_records_the_edit() -> None:
    old = b'{"amount": -5}'
    headers = {"tenant": "eu", "trace": "t", X_EDITED_BY: "earlier@host"}
    edit = MessageEdit(
        body=b'{"amount": 5}', set_headers={"tenant": "us"}, unset_headers=frozenset({"trace"})
    )
    out, body = apply_edit(headers, old, edit, edited_by="ops@box", now=NOW)
    assert body == b'{"amount": 5}'
    assert out["tenant"] == "us" and "trace" not in out
    assert out[X_EDITED_BY] == "ops@box"
    assert out[X_EDITED_AT] == int(NOW.timestamp() * 1000)
    assert out[X_EDITED_HEADERS] == "set: tenant; removed: trace"
    assert out[X_EDITED_OLD_BODY_SHA256] == hashlib.sha256(old).hexdigest()


def test_a_header_only_edit_keeps_the_body_and_drops_an_earlier_body_record() -> None:
    headers = {X_EDITED_OLD_BODY_SHA256: "abc"}
    out, body = apply_edit(
        headers, b"b", MessageEdit(set_headers={"k": "v"}), edited_by=None, now=NOW
    )
    assert body == b"b"
    assert X_EDITED_OLD_BODY_SHA256 not in out and X_EDITED_BY not in out
    assert out[X_EDITED_HEADERS] == "set: k"


def test_bodies_are_shown_for_editing_pretty_when_json() -> None:
    shown = body_for_editing(b'{"a":{"b":1}}', None)
    assert shown == '{\n  "a": {\n    "b": 1\n  }\n}\n'
    assert json.loads(shown) == {"a": {"b": 1}}
    assert body_for_editing(b"order 7", "text/plain") == "order 7"


def test_the_diff_shows_the_changed_headers_and_body_lines() -> None:
    edit = MessageEdit(body=b'{"amount": 5, "id": 1}', set_headers={"tenant": "us"})
    diff = edit_diff("m-1", {"tenant": "eu"}, b'{"amount": -5, "id": 1}', None, edit)
    assert "-tenant: eu\n+tenant: us\n" in diff
    assert '-  "amount": -5,\n+  "amount": 5,\n' in diff
    assert '   "id": 1' in diff
