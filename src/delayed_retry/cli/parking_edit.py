"""``delayed-retry parking edit ID``: fix one parked message, then replay it.

Shows the change as a diff, asks (unless ``--yes``), replays the edited copy with
:func:`~delayed_retry.parking.edit.edit_and_replay` and prints the audit line: what
changed and who changed it (``user@host``), as the message's ``x-edited-*`` headers say too.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli import common, output, parking_args
from delayed_retry.cli.chain import checked_topology
from delayed_retry.cli.command import Command
from delayed_retry.cli.connection import connect
from delayed_retry.cli.parking_move import who
from delayed_retry.errors import ConfigurationError, NotFoundError
from delayed_retry.parking.edit import EditResult, MessageEdit, edit_and_replay, find_one_parked
from delayed_retry.parking.edit_rules import body_for_editing, checked_diff
from delayed_retry.parking.lot import prepare_replay_target
from delayed_retry.parking.records import ParkedRecord

__all__ = ["EDIT"]


def _edit_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "id", metavar="ID", help="a record id as 'parking list' shows it, or its start"
    )
    parking_args.add_queue_args(parser)
    parser.add_argument("--body-file", metavar="PATH", help="the new body ('-': standard input)")
    parser.add_argument(
        "--editor", action="store_true", help="edit the body in $VISUAL or $EDITOR (JSON indented)"
    )
    output.add_header_option(parser, "--set-header", help="set header NAME to TEXT (repeatable)")
    parser.add_argument(
        "--unset-header",
        action="append",
        default=[],
        metavar="NAME",
        help="remove header NAME (repeatable)",
    )
    parser.add_argument("--to", dest="to_queue", help="send to this queue instead of QUEUE")
    parser.add_argument(
        "--delay", type=output.duration_type, default=0.0, help="come due after, e.g. 90s, 1h (now)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the diff; move nothing")
    parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    output.add_json_option(parser)
    common.add_topology_args(parser)


def _body_from_file(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise output.UsageError(
            f"--body-file {path!r} cannot be read ({exc.strerror}); name a file"
        ) from exc


def _body_from_editor(text: str, suffix: str) -> bytes:
    """``text`` as the operator left it in their editor."""
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR")
    if not editor:
        raise output.UsageError("--editor needs $VISUAL or $EDITOR set; or give --body-file")
    with tempfile.TemporaryDirectory(prefix="delayed-retry-edit-") as folder:
        path = Path(folder) / f"body{suffix}"
        path.write_text(text, encoding="utf-8")
        done = subprocess.run([*shlex.split(editor), str(path)], check=False)
        if done.returncode != 0:
            raise output.CommandError(
                f"the editor {editor!r} exited with {done.returncode}; nothing moved"
            )
        return path.read_bytes()


def _edited_body(args: argparse.Namespace, record: ParkedRecord) -> bytes | None:
    if args.body_file is not None and args.editor:
        raise output.UsageError("give --body-file or --editor, not both")
    if args.body_file is not None:
        return _body_from_file(args.body_file)
    if not args.editor:
        return None
    shown = body_for_editing(record.body, record.content_type)
    suffix = ".json" if shown.startswith(("{", "[")) else ".txt"
    body = _body_from_editor(shown, suffix)
    return None if body == shown.encode() else body


async def _one_parked(
    args: argparse.Namespace, channel: Any, topology: DelayTopology
) -> ParkedRecord:
    """The one parked message the ID selects; several is the lot's state, not a usage error."""
    try:
        return await find_one_parked(
            channel,
            queue=args.queue,
            id=args.id,
            parking_queue=args.parking_queue,
            topology=topology,
        )
    except NotFoundError:
        raise
    except ConfigurationError as exc:
        raise output.CommandError(str(exc)) from exc


def _audit_line(result: EditResult, edit: MessageEdit, queue: str, by: str | None) -> str:
    changed = []
    if edit.body is not None:
        changed.append("body")
    if edit.set_headers:
        changed.append("set " + ", ".join(sorted(edit.set_headers)))
    if edit.unset_headers:
        changed.append("removed " + ", ".join(sorted(edit.unset_headers)))
    return (
        f"edited and replayed {result.id} of {queue!r} to {result.to_queue!r} "
        f"({'; '.join(changed)}) by {by or 'an unknown user'}"
    )


async def _edit(args: argparse.Namespace) -> int:
    connection = await connect(args.url)
    async with connection:
        topology = await checked_topology(connection, args, queue=args.to_queue or args.queue)
        channel = await connection.channel()
        target = args.to_queue or args.queue
        record = await _one_parked(args, channel, topology)
        edit = MessageEdit(
            body=_edited_body(args, record),
            set_headers=dict(args.set_header),
            unset_headers=frozenset(args.unset_header),
        )
        diff = checked_diff(record, edit)
        # Refused now, not after the question: a missing queue, a delay past the chain's reach.
        await prepare_replay_target(channel, topology, target, delay=args.delay, dry_run=True)
        if args.dry_run:
            if args.json:
                output.emit_json(
                    EditResult(id=record.id, to_queue=target, diff=diff, replayed=False)
                )
            else:
                print(diff, end="")
                print(f"dry run: {record.id} stays parked")
            return 0
        print(diff, end="", file=sys.stderr if args.json else sys.stdout)
        question = f"replay {record.id} of {args.queue!r} with this edit?"
        if not output.confirm(question, assume_yes=args.yes):
            print("nothing replayed", file=sys.stderr)
            return 1
        by = who()
        result = await edit_and_replay(
            channel,
            id=record.id,
            edit=edit,
            to_queue=args.to_queue,
            delay=args.delay,
            edited_by=by,
            **parking_args.lot_from_args(args, topology),
        )
    if args.json:
        output.emit_json(result)
    else:
        print(_audit_line(result, edit, args.queue, by))
    return 0


EDIT = Command(
    name="edit",
    help="change one parked message's body or headers, then replay it",
    description="Replay the one parked message ID selects (a record id or its start) with "
    "a new body and/or headers, through the delay chain with a fresh retry budget; the "
    "original leaves the parking queue only after the broker confirmed the edited copy. "
    "The copy records the edit (x-edited-by, x-edited-at, x-edited-headers, and the "
    "old body's digest). Headers the library or the broker owns (x-retry*, x-parked-*, "
    "x-exception-*, x-death, ...) cannot be edited; a JSON body must stay JSON. Shows the "
    "diff and asks first (--yes without a terminal).",
    options=_edit_options,
    run=_edit,
)
