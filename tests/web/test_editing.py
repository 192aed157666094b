"""The edit form of the web view as pure logic: what it offers, what it reads back."""

from __future__ import annotations

import hashlib

import pytest

from delayed_retry.errors import ConfigurationError
from delayed_retry.parking.records import ParkedRecord, read_record
from delayed_retry.web.editing import edit_fields, read_edit


def _record(body: bytes = b'{"order":7}') -> ParkedRecord:
    headers = {"x-parked-reason": "max-retries", "x-retry": 3, "tenant": "eu", "n": 5}
    return read_record(headers, message_id="m-1", body=body, content_type="application/json")


def test_the_form_offers_the_message_own_headers_and_the_json_body_indented() -> None:
    fields = edit_fields(_record())
    assert fields.headers == [("n", "5"), ("tenant", "eu")]
    assert fields.body == '{\n  "order": 7\n}\n'
    assert fields.seen == hashlib.sha256(b'{"order":7}').hexdigest()
    assert edit_fields(_record(b"\xff\x00")).body is None  # not text: not editable here


def test_only_what_the_operator_changed_is_edited() -> None:
    record = _record()
    shown = edit_fields(record).body
    assert shown is not None
    edit = read_edit(
        record,
        body=shown.replace("\n", "\r\n"),  # browsers send CRLF: not a change
        names=["n", "tenant", "added"],
        values=["5", "us", "yes"],
        removed=[],
    )
    assert edit.body is None
    assert dict(edit.set_headers) == {"tenant": "us", "added": "yes"}
    edit = read_edit(
        record, body=shown.replace("7", "8"), names=["n", ""], values=["5", ""], removed=["n"]
    )
    assert edit.body == b'{\n  "order": 8\n}\n'
    assert not edit.set_headers and edit.unset_headers == {"n"}


def test_broken_header_rows_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="header rows are broken"):
        read_edit(_record(), body=None, names=["a"], values=[], removed=[])
