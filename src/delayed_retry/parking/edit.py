"""Edit one parked message and replay it: the broker half of
:mod:`~delayed_retry.parking.edit_rules`.

Use :func:`edit_and_replay` when a message parked for bad data (a wrong
field, a missing header) and only fixing it will let it through. It is a
replay of one message (:mod:`~delayed_retry.parking.moving`) whose copy
carries the edit: through the chain, with a fresh retry budget, the parked
original acked only after the broker confirmed the edited copy. What it
guarantees and what it does not: docs/parking.md, "Edit and replay".
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import aiormq.abc

from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import Duration, to_seconds
from delayed_retry.errors import ConfigurationError, NotFoundError
from delayed_retry.parking.edit_rules import MessageEdit, apply_edit, check_headers, checked_diff
from delayed_retry.parking.ids import IdMatcher, describe_candidate
from delayed_retry.parking.lot import ParkedFilter, iter_parked, prepare_replay_target
from delayed_retry.parking.moving.actions import ReplayAction
from delayed_retry.parking.moving.engine import MoveRequest, move
from delayed_retry.parking.records import ParkedRecord

__all__ = ["EditAction", "EditResult", "MessageEdit", "edit_and_replay", "find_one_parked"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class EditResult:
    """What an edit and replay did (or would do, in a dry run)."""

    id: str
    """The record id of the parked message edited."""
    to_queue: str
    diff: str
    """The change as a unified diff (:func:`~delayed_retry.parking.edit_rules.edit_diff`)."""
    replayed: bool
    """Whether the edited copy was confirmed and the original acked (``False``: dry run)."""


async def find_one_parked(
    channel: Any,
    *,
    queue: str,
    id: str,
    parking_queue: str | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
) -> ParkedRecord:
    """The one parked message of ``queue`` that ``id`` (a record id or its start) selects.

    Raises :class:`NotFoundError` when it selects none and
    :class:`ConfigurationError` naming the candidates when it selects several.
    """
    matcher = IdMatcher([id], keep=5)
    async for record in iter_parked(
        channel, queue=queue, parking_queue=parking_queue, topology=topology
    ):
        matcher.add(record)
    (match,) = matcher.matches()
    if not match.found:
        raise NotFoundError(
            f"no parked message with id {id!r} (or an id starting with it) in the parking lot "
            f"of {queue!r}; 'delayed-retry parking list --queue {queue}' shows the ids"
        )
    if match.ambiguous:
        shown = "; ".join(describe_candidate(r) for r in match.records)
        raise ConfigurationError(
            f"{id!r} selects {match.count} parked messages of {queue!r} ({shown}): an edit "
            "takes exactly one; give more of the id, or purge the duplicate first"
        )
    return match.records[0]


@dataclass(frozen=True, kw_only=True)
class EditAction(ReplayAction):
    """Replay one parked message with ``edit`` applied: the copy carries the new body and
    headers and the record of the edit (by ``replayed_by``); the original is acked only once
    the copy is confirmed.

    ``body_sha256`` is the digest of the body the edit was checked against: a
    message whose body differs (another one parked under the same id since) is
    left parked.
    """

    edit: MessageEdit
    body_sha256: str

    def content(
        self, got: aiormq.abc.DeliveredMessage, *, now: datetime
    ) -> tuple[Mapping[str, Any] | None, bytes | None]:
        if hashlib.sha256(got.body).hexdigest() != self.body_sha256:
            raise ConfigurationError(
                "the parked message changed since the edit was checked (another message with "
                "its id was parked): nothing replayed; edit it again"
            )
        return apply_edit(
            got.header.properties.headers, got.body, self.edit, edited_by=self.replayed_by, now=now
        )


async def edit_and_replay(
    channel: Any,
    *,
    queue: str,
    id: str,
    edit: MessageEdit,
    parking_queue: str | None = None,
    to_queue: str | None = None,
    delay: Duration = 0,
    edited_by: str | None = None,
    dry_run: bool = False,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT,
) -> EditResult:
    """Replay the one parked message ``id`` selects with ``edit`` applied.

    Use it when a message parked for its data and a fix of that data lets it
    through; for messages that only need the cause fixed use
    :func:`~delayed_retry.parking.lot.replay_matching`. The edit is refused
    before anything moves when it touches a header the library or the broker
    owns, when the old body is JSON and the new one is not, or when ``id``
    selects no message or several. Like a replay, the copy goes through the
    chain to ``to_queue`` (default ``queue``) with a fresh retry budget; the
    original leaves the parking queue only after the copy is confirmed.
    ``dry_run`` returns the diff and moves nothing.
    """
    check_headers(edit)
    seconds = to_seconds(delay)
    target = to_queue or queue
    await prepare_replay_target(channel, topology, target, delay=seconds, dry_run=dry_run)
    record = await find_one_parked(
        channel, queue=queue, id=id, parking_queue=parking_queue, topology=topology
    )
    diff = checked_diff(record, edit)
    if dry_run:
        return EditResult(id=record.id, to_queue=target, diff=diff, replayed=False)
    action = EditAction(
        topology=topology,
        target=target,
        edit=edit,
        body_sha256=hashlib.sha256(record.body).hexdigest(),
        delay=seconds,
        replayed_by=edited_by,
        publish_timeout=publish_timeout,
    )
    request = MoveRequest(
        queue=queue,
        parking_queue=parking_queue,
        topology=topology,
        where=ParkedFilter(ids=frozenset({record.id})),
        limit=1,
    )
    report = await move(channel, action, request)
    if report.done != 1:
        raise NotFoundError(
            f"parked message {record.id!r} of {queue!r} is no longer parked (replayed or purged "
            "meanwhile): nothing replayed"
        )
    log.info("edited and replayed %s of %r to %r by %s", record.id, queue, target, edited_by)
    return EditResult(id=record.id, to_queue=target, diff=diff, replayed=True)
