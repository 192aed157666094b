"""The ``--id`` of the parking commands: a whole record id or its start, never "the first".

``parking show ID`` and ``--id`` of ``list``, ``replay`` and ``purge`` take a
record id as ``parking list`` shows it, or a unique start of one. An id can
select several parked messages (two may share a ``message_id``; a start may
fit several ids): ``show`` then lists them with what tells them apart, and
``replay``/``purge`` say how many they will act on and ask first. The
matching itself is pure (:mod:`delayed_retry.parking.ids`); this module reads
the parking lot once and words the outcome.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli import output
from delayed_retry.parking.ids import IdMatch, IdMatcher, describe_candidate, selected_count
from delayed_retry.parking.lot import ParkedFilter, iter_parked

__all__ = ["ambiguous_id", "match_ids", "no_such_id", "resolve_ids"]

_LISTED = 5
"""Candidates named in one line; the rest are counted."""


async def match_ids(
    channel: Any,
    args: argparse.Namespace,
    given: Sequence[str],
    *,
    where: ParkedFilter,
    topology: DelayTopology,
    keep: int = _LISTED,
) -> tuple[IdMatch, ...]:
    """What each of ``given`` selects among the parked messages ``where`` selects (one read)."""
    matcher = IdMatcher(given, keep=keep)
    async for record in iter_parked(
        channel,
        queue=args.queue,
        parking_queue=args.parking_queue,
        where=replace(where, ids=frozenset()),
        topology=topology,
    ):
        matcher.add(record)
    return matcher.matches()


def no_such_id(match: IdMatch, queue: str) -> output.CommandError:
    """The error for an id that selects nothing (exit 1: the parking lot does not hold it)."""
    return output.CommandError(
        f"no parked message with id {match.given!r} (or an id starting with it) in the parking "
        f"lot of {queue!r}; 'delayed-retry parking list --queue {queue}' shows the ids"
    )


def _candidates(match: IdMatch) -> str:
    shown = "; ".join(describe_candidate(r) for r in match.records[:_LISTED])
    rest = match.count - min(len(match.records), _LISTED)
    return shown + (f"; and {rest} more" if rest > 0 else "")


def ambiguous_id(match: IdMatch, queue: str) -> output.CommandError:
    """The error of ``parking show`` for an id that selects several messages, listing them."""
    if len(match.ids) == 1:
        fix = f"add --all to show each ('parking show {match.given} --queue {queue} --all')"
        what = f"{match.count} parked messages of {queue!r} have the id {match.given!r}"
    else:
        fix = "give more of the id, or add --all to show each"
        what = (
            f"{match.given!r} selects {match.count} parked messages of {queue!r} "
            f"({len(match.ids)} ids start with it)"
        )
    return output.CommandError(f"{what}: {_candidates(match)}; {fix}")


def _selection_line(match: IdMatch) -> str:
    ids = sorted(match.ids)
    shown = ", ".join(
        f"{i} (×{match.counts[i]})" if match.counts[i] > 1 else i for i in ids[:_LISTED]
    )
    more = f", … ({len(ids) - _LISTED} more ids)" if len(ids) > _LISTED else ""
    return f"--id {match.given!r} selects {match.count} parked message(s): {shown}{more}"


async def resolve_ids(
    channel: Any,
    args: argparse.Namespace,
    where: ParkedFilter,
    *,
    topology: DelayTopology,
    quiet: bool = False,
) -> tuple[ParkedFilter, int, bool]:
    """``where`` with the ``--id`` values made whole ids, the messages they select, any ambiguous.

    Prints one line per ``--id`` saying what it selects (on stderr when
    ``quiet``: JSON goes to stdout), so an operator sees the count before
    anything is acted on. An id that selects nothing fails the command
    before anything moves.
    """
    matches = await match_ids(channel, args, args.ids, where=where, topology=topology)
    for match in matches:
        if not match.found:
            raise no_such_id(match, args.queue)
    for match in matches:
        print(_selection_line(match), file=sys.stderr if quiet else sys.stdout)
    ids = frozenset().union(*(m.ids for m in matches))
    return (
        replace(where, ids=ids),
        selected_count(matches),
        any(m.ambiguous for m in matches),
    )
