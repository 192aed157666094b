"""What an edit of a parked message may change, and the message it makes. Pure.

An operator fixes a bad field of one parked message, then replays it
(:func:`~delayed_retry.parking.edit.edit_and_replay` is the broker half). A
:class:`MessageEdit` says what changes: a new body, headers set to text,
headers removed. :func:`check_headers` refuses the headers the library or the
broker owns; :func:`check_body` refuses a new body that is not JSON when the
old one was; :func:`apply_edit` gives the edited headers (with the record of
the edit, :data:`~delayed_retry.headers.names.X_EDITED_BY` and its family)
and body; :func:`edit_diff` shows it before anything moves; :func:`checked_diff` does
every check, then gives the diff. What an edit
guarantees: docs/parking.md, "Edit and replay".
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from delayed_retry.durations import to_epoch_ms
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.names import (
    X_EDITED_AT,
    X_EDITED_BY,
    X_EDITED_HEADERS,
    X_EDITED_OLD_BODY_SHA256,
    owned_header_reason,
)
from delayed_retry.parking.records import ParkedRecord

__all__ = [
    "MessageEdit",
    "apply_edit",
    "body_for_editing",
    "check_body",
    "check_headers",
    "checked_diff",
    "edit_diff",
    "is_json",
]


@dataclass(frozen=True, kw_only=True)
class MessageEdit:
    """One edit of a parked message: a new body and/or headers set (as text) or removed.

    ``body=None`` keeps the body. A header both set and removed is refused by
    :func:`check_headers`.
    """

    body: bytes | None = None
    set_headers: Mapping[str, str] = field(default_factory=dict)
    unset_headers: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not isinstance(self.unset_headers, frozenset):
            object.__setattr__(self, "unset_headers", frozenset(self.unset_headers))

    @property
    def is_empty(self) -> bool:
        """Whether it changes nothing (an edit must change something)."""
        return self.body is None and not self.set_headers and not self.unset_headers


def check_headers(edit: MessageEdit) -> None:
    """Refuse an edit that changes nothing, or a header the library or the broker owns."""
    if edit.is_empty:
        raise ConfigurationError(
            "the edit changes nothing: give a new body or a header to set or remove"
        )
    both = sorted(set(edit.set_headers) & edit.unset_headers)
    if both:
        raise ConfigurationError(
            f"header {both[0]!r} is both set and removed by the edit; do one or the other"
        )
    for name in sorted({*edit.set_headers, *edit.unset_headers}):
        if not name.strip():
            raise ConfigurationError("an empty header name cannot be edited; name the header")
        reason = owned_header_reason(name)
        if reason is not None:
            raise ConfigurationError(
                f"header {name!r} cannot be edited: it is {reason}; edit the message's own "
                "headers or its body only"
            )


def is_json(body: bytes, content_type: str | None) -> bool:
    """Whether a body is edited as JSON: its content type says JSON, or it parses as JSON."""
    if content_type and "json" in content_type.lower():
        return True
    try:
        json.loads(body)
    except ValueError:
        return False
    return True


def check_body(record_id: str, old: bytes, content_type: str | None, new: bytes) -> None:
    """Refuse ``new`` when the old body is JSON and ``new`` does not parse as JSON.

    The error names the parse error's position, so the operator can fix the
    right line.
    """
    if not is_json(old, content_type):
        return
    try:
        json.loads(new)
    except ValueError as exc:
        where = (
            f"line {exc.lineno} column {exc.colno}: {exc.msg}"
            if isinstance(exc, json.JSONDecodeError)
            else str(exc)
        )
        raise ConfigurationError(
            f"the new body of parked message {record_id!r} is not JSON ({where}); its body "
            "was JSON, so the edit must be too: fix the JSON and edit again"
        ) from exc


def body_for_editing(body: bytes, content_type: str | None) -> str:
    """The body as people edit it: JSON pretty-printed (two spaces), other text as it is."""
    if is_json(body, content_type):
        try:
            return json.dumps(json.loads(body), indent=2, ensure_ascii=False) + "\n"
        except ValueError:
            pass  # says JSON, is not: shown as it is
    return body.decode("utf-8", "replace")


def _changed_headers(edit: MessageEdit) -> str:
    parts = []
    if edit.set_headers:
        parts.append("set: " + ", ".join(sorted(edit.set_headers)))
    if edit.unset_headers:
        parts.append("removed: " + ", ".join(sorted(edit.unset_headers)))
    return "; ".join(parts) or "none"


def apply_edit(
    headers: Mapping[str, Any] | None,
    body: bytes,
    edit: MessageEdit,
    *,
    edited_by: str | None,
    now: datetime,
) -> tuple[dict[str, Any], bytes]:
    """The edited headers (with the record of this edit) and body of a parked message.

    The record replaces any earlier edit's: ``x-edited-at``, ``x-edited-by``
    (when known), ``x-edited-headers`` (which were set or removed) and, when
    the body changed, ``x-edited-old-body-sha256``. Replaying the result
    (:func:`~delayed_retry.parking.records.replay_copy`) then drops the parking
    record and starts a fresh retry budget.
    """
    out = dict(headers or {})
    for name in (X_EDITED_AT, X_EDITED_BY, X_EDITED_HEADERS, X_EDITED_OLD_BODY_SHA256):
        out.pop(name, None)
    for name in edit.unset_headers:
        out.pop(name, None)
    out.update(edit.set_headers)
    out[X_EDITED_AT] = to_epoch_ms(now)
    if edited_by:
        out[X_EDITED_BY] = edited_by[:200]
    out[X_EDITED_HEADERS] = _changed_headers(edit)
    if edit.body is None or edit.body == body:
        return out, body
    out[X_EDITED_OLD_BODY_SHA256] = hashlib.sha256(body).hexdigest()
    return out, edit.body


def _header_lines(headers: Mapping[str, Any], names: set[str]) -> list[str]:
    return [f"{name}: {headers[name]}\n" for name in sorted(names) if name in headers]


def edit_diff(
    record_id: str,
    headers: Mapping[str, Any],
    body: bytes,
    content_type: str | None,
    edit: MessageEdit,
) -> str:
    """A unified diff of what ``edit`` changes (edited headers, then the body as edited).

    Use it for a dry run and before asking for a confirmation.
    """
    names = {*edit.set_headers, *edit.unset_headers}
    after = {k: v for k, v in headers.items() if k not in edit.unset_headers}
    after.update(edit.set_headers)
    lines = list(
        difflib.unified_diff(
            _header_lines(headers, names),
            _header_lines(after, names),
            f"{record_id} headers (parked)",
            f"{record_id} headers (edited)",
        )
    )
    if edit.body is not None:
        old = body_for_editing(body, content_type)
        new = body_for_editing(edit.body, content_type)
        lines += difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"{record_id} body (parked)",
            f"{record_id} body (edited)",
        )
    text = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    return text or "(no change)\n"


def checked_diff(record: ParkedRecord, edit: MessageEdit) -> str:
    """Refuse ``edit`` of ``record`` if any check fails (:func:`check_headers`,
    :func:`check_body`); otherwise the diff of :func:`edit_diff`."""
    check_headers(edit)
    if edit.body is not None:
        check_body(record.id, record.body, record.content_type, edit.body)
    return edit_diff(record.id, record.headers, record.body, record.content_type, edit)
