"""Edit and replay one parked message from its page: the form, read into a
:class:`~delayed_retry.parking.edit_rules.MessageEdit`, then
:func:`~delayed_retry.parking.edit.edit_and_replay`, with an audit entry.

The form shows the body (JSON indented) and one row per header the edit may
change; :func:`edit_fields` says what to show, :func:`read_edit` (pure) reads what
the operator changed. ``edit-preview`` shows the diff, ``edit-replay`` replays;
both refuse when the message is not the one the page showed (its body changed).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from multidict import MultiDictProxy

from delayed_retry.errors import ConfigurationError, NotFoundError
from delayed_retry.headers.names import owned_header_reason, split_read_counters
from delayed_retry.parking.edit import edit_and_replay
from delayed_retry.parking.edit_rules import MessageEdit, body_for_editing
from delayed_retry.parking.records import ParkedRecord
from delayed_retry.web.forms import form_field
from delayed_retry.web.render import header_rows
from delayed_retry.web.state import WebState

__all__ = [
    "EDIT_OPS",
    "EditFields",
    "EditOutcome",
    "audit_entry",
    "edit_fields",
    "edit_from_form",
    "read_edit",
]

EDIT_OPS = ("edit-preview", "edit-replay")
"""The form's ``op`` values: show the diff, or replay with the edit."""


@dataclass(frozen=True, kw_only=True)
class EditFields:
    """What the edit form shows for one parked message."""

    body: str | None
    """The body to edit (JSON indented), or ``None`` when it is not text (not editable here)."""
    headers: list[tuple[str, str]]
    """The headers the edit may change, as (name, text) rows."""
    seen: str
    """The SHA-256 of the body shown: the edit applies only to that message."""


def _text_body(body: bytes) -> bool:
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _editable(headers: Mapping[str, Any]) -> list[tuple[str, str]]:
    own, _counters = split_read_counters(headers)
    return [(n, v) for n, v in header_rows(own) if owned_header_reason(n) is None]


def edit_fields(record: ParkedRecord) -> EditFields:
    """The edit form's fields for ``record``."""
    return EditFields(
        body=body_for_editing(record.body, record.content_type)
        if _text_body(record.body)
        else None,
        headers=_editable(record.headers),
        seen=hashlib.sha256(record.body).hexdigest(),
    )


def read_edit(
    record: ParkedRecord,
    *,
    body: str | None,
    names: Sequence[str],
    values: Sequence[str],
    removed: Sequence[str],
) -> MessageEdit:
    """The edit the form asks for: only what differs from what :func:`edit_fields` showed.

    ``names``/``values`` are the header rows (an added header is a row with a
    new name), ``removed`` the names ticked for removal. A header set is set
    as text. The body is compared with newlines as ``\\n`` (browsers send
    ``\\r\\n``).
    """
    if len(names) != len(values):
        raise ConfigurationError("the form's header rows are broken: reload the page")
    fields = edit_fields(record)
    shown = dict(fields.headers)
    set_headers: dict[str, str] = {}
    for name, value in zip(names, values, strict=True):
        name = name.strip()
        if name and name not in removed and shown.get(name) != value:
            set_headers[name] = value
    new_body: bytes | None = None
    if body is not None and fields.body is not None:
        text = body.replace("\r\n", "\n")
        if text != fields.body:
            new_body = text.encode("utf-8")
    return MessageEdit(
        body=new_body,
        set_headers=set_headers,
        unset_headers=frozenset(n for n in removed if n),
    )


@dataclass(frozen=True, kw_only=True)
class EditOutcome:
    """What the form did: a line for the operator, and the diff."""

    notice: str
    diff: str
    replayed: bool


def _texts(form: MultiDictProxy[Any], name: str) -> list[str]:
    return [v for v in form.getall(name, []) if isinstance(v, str)]


async def _shown_record(state: WebState, form: MultiDictProxy[Any], queue: str) -> ParkedRecord:
    """The parked message the form names, if it is still the one its page showed."""
    lot, _ = state.parts()
    parking = state.parking_queue(queue)
    key = form_field(form, "key")
    record = await lot.find(parking, key) if key else None
    if record is None:
        raise NotFoundError(f"no parked message {key!r} in {parking!r} (replayed or purged?)")
    if hashlib.sha256(record.body).hexdigest() != form_field(form, "seen"):
        raise ConfigurationError(
            f"parked message {key!r} is not the one this page showed (its body changed): "
            "reload the page and edit again"
        )
    return record


def audit_entry(
    *, user: str, queue: str, to_queue: str, record: ParkedRecord, edit: MessageEdit
) -> dict[str, Any]:
    """The audit log's ``edited`` entry: who, which message, what changed (bodies as digests)."""
    return {
        "event": "edited",
        "user": user,
        "queue": queue,
        "message_id": record.id,
        "to_queue": to_queue,
        "set_headers": dict(edit.set_headers),
        "removed_headers": sorted(edit.unset_headers),
        "body_changed": edit.body is not None,
        "old_body_sha256": hashlib.sha256(record.body).hexdigest(),
        "new_body_sha256": hashlib.sha256(edit.body).hexdigest() if edit.body else None,
    }


async def edit_from_form(state: WebState, form: MultiDictProxy[Any], *, user: str) -> EditOutcome:
    """Preview or replay the form's edit of one parked message; replays go to the audit log."""
    if state.settings.read_only:
        raise ConfigurationError("this view is read-only: editing is refused")
    lot, _ = state.parts()
    queue = state.known(form_field(form, "queue"))
    record = await _shown_record(state, form, queue)
    to_queue = state.known(form_field(form, "to_queue") or queue)
    if to_queue == state.settings.topology.unroutable_queue:
        raise ConfigurationError("choose the queue to replay the edited message to")
    body = form.get("body")
    edit = read_edit(
        record,
        body=body if isinstance(body, str) else None,
        names=_texts(form, "header_name"),
        values=_texts(form, "header_value"),
        removed=_texts(form, "header_remove"),
    )
    replay = form_field(form, "op") == "edit-replay"
    result = await edit_and_replay(
        await lot.channel(),
        queue=queue,
        parking_queue=state.parking_queue(queue),
        id=record.id,
        edit=edit,
        to_queue=to_queue,
        edited_by=f"{user} (web)",
        dry_run=not replay,
        topology=state.settings.topology,
        publish_timeout=lot.publish_timeout,
    )
    if not replay:
        return EditOutcome(notice="the edit would change:", diff=result.diff, replayed=False)
    state.audit.write(
        audit_entry(user=user, queue=queue, to_queue=to_queue, record=record, edit=edit)
    )
    return EditOutcome(
        notice=f"edited and replayed {record.id} to {to_queue}: the parked original is gone",
        diff=result.diff,
        replayed=True,
    )
