"""What every command shares: errors and exit codes, JSON, tables, progress, option types.

Use these in every subcommand so the command line behaves one way: :class:`UsageError`
(exit 2) when the command line is wrong, :class:`CommandError` (exit 1) when the broker or
the machine is not as it needs, each one line naming the object, the problem and the fix;
:func:`add_json_option` and :func:`emit_json` on read commands; :func:`print_table`;
:func:`progress_bar`; :func:`duration_type`, :func:`rate_type`, :func:`header_type` as
argparse ``type=``; :func:`confirm` before anything destructive.
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import importlib
import json
import math
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, TextIO

from delayed_retry.durations import format_duration, parse_duration
from delayed_retry.errors import ConfigurationError

__all__ = [
    "EXIT_FAILURE",
    "EXIT_OK",
    "EXIT_USAGE",
    "CommandError",
    "UsageError",
    "add_header_option",
    "add_json_option",
    "confirm",
    "counted",
    "count_type",
    "duration_type",
    "emit_json",
    "format_at_most",
    "header_type",
    "print_error",
    "print_table",
    "progress_bar",
    "rate_type",
    "render_table",
    "require_extra",
    "to_jsonable",
]

EXIT_OK = 0
EXIT_FAILURE = 1
"""The command line was right but the broker or the machine is not as the command needs (a
queue named that does not exist, a broker error, a mismatch, a difference found)."""
EXIT_USAGE = 2
"""The command line itself was wrong, whatever the broker holds (an unknown option, a
malformed value, a destructive command without --yes off a terminal)."""


class CommandError(Exception):
    """The broker or machine is not as the command needs: one line, exit 1; say what to run."""

    exit_code = EXIT_FAILURE


class UsageError(CommandError):
    """The command line itself is wrong, whatever the broker holds: one line, exit 2."""

    exit_code = EXIT_USAGE


def print_error(message: str) -> None:
    """Print ``message`` on stderr as the one line ``delayed-retry: error: ...``."""
    print(f"delayed-retry: error: {message}", file=sys.stderr)


def require_extra(extra: str, modules: Sequence[str], *, what: str) -> None:
    """Import ``modules``, or fail (exit 1) naming the extra of delayed-retry that installs them.

    Call it first in a command built on optional dependencies (``web``, ``spark``,
    ``archive``), so a missing one is named with the fix before anything connects,
    not as Python's "No module named ..." halfway through.
    """
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = (exc.name or name).split(".")[0]
            raise CommandError(
                f"{what} needs the '{extra}' extra ({missing} is not installed); run: "
                f"pip install 'delayed-retry[{extra}]'"
            ) from exc


# -- option types ---------------------------------------------------------------
def duration_type(text: str) -> float:
    """argparse ``type=`` for durations: ``90s``, ``15m``, ``1h``, ``2d``, ``250ms``, seconds."""
    try:
        return parse_duration(text, name="duration")
    except ConfigurationError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def count_type(minimum: int) -> Callable[[str], int]:
    """argparse ``type=`` for a whole number of at least ``minimum`` (limits, offsets, counts).

    Use it instead of ``int`` so ``--limit -1`` is refused on the command line, before
    anything connects.
    """

    def count(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a whole number of at least {minimum}; e.g. {max(minimum, 1) * 10}"
            )
        return value

    count.__name__ = f"count_at_least_{minimum}"
    return count


def rate_type(text: str) -> float:
    """argparse ``type=`` for rates: ``100/s``, ``30/m``, ``500/h`` or a number per second."""
    number, _, per = text.strip().partition("/")
    seconds = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}.get(per.strip().lower())
    try:
        value = float(number)
    except ValueError:
        value = float("nan")
    if seconds is None or not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"rate {text!r} is not a positive rate; write it like 100/s, 30/m or 500/h"
        )
    return value / seconds


def header_type(text: str) -> tuple[str, str]:
    """argparse ``type=`` for ``name=value`` pairs."""
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not name=value, e.g. tenant=acme")
    return name.strip(), value


def add_header_option(
    parser: argparse._ActionsContainer, flag: str, *, help: str, metavar: str = "NAME=TEXT"
) -> None:
    """Add a repeatable ``flag NAME=VALUE`` option, read as a list of (name, value) pairs: for
    any option that sets or matches headers. ``parser`` is a parser or an argument group."""
    parser.add_argument(
        flag, type=header_type, action="append", default=[], metavar=metavar, help=help
    )


def add_json_option(parser: argparse.ArgumentParser) -> None:
    """Add ``--json``: machine-readable output on stdout instead of text."""
    parser.add_argument(
        "--json", action="store_true", help="print JSON instead of text (for scripts)"
    )


# -- JSON -----------------------------------------------------------------------
def to_jsonable(value: Any) -> Any:
    """``value`` in JSON types: datetimes ISO 8601, durations seconds, bytes text or base64."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [to_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def emit_json(value: Any, *, stream: TextIO | None = None) -> None:
    """Print ``value`` as one JSON document on stdout."""
    print(json.dumps(to_jsonable(value), indent=2, ensure_ascii=False), file=stream or sys.stdout)


# -- durations ------------------------------------------------------------------
def format_at_most(seconds: float) -> str:
    """An upper bound for people, rounded *up* to the precision shown: 4194 s is ``1 h 10 m``.

    Use it for "due within" and similar limits, where rounding down would promise too early.
    """
    for size, step in ((86400, 3600), (3600, 60), (60, 1)):
        if seconds >= size:
            return format_duration(math.ceil(seconds / step) * step)
    return format_duration(seconds)


# -- tables -----------------------------------------------------------------------
def _cell(value: object) -> str:
    text = "-" if value is None else str(value)
    return " ".join(text.split())  # one line per row, whatever the value holds


def render_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    width: int | None = None,
    right: Sequence[int] = (),
) -> str:
    """Rows as aligned text no wider than ``width`` (default: the terminal's).

    When the rows do not fit, the widest columns are shortened with ``…``.
    ``right`` lists the columns to align right (counts).
    """
    limit = width or shutil.get_terminal_size((120, 24)).columns
    cells = [[_cell(h) for h in headers]] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    gap = 2
    while sum(widths) + gap * (len(widths) - 1) > limit and max(widths) > 8:
        widest = widths.index(max(widths))
        widths[widest] -= 1
    lines = []
    for row in cells:
        parts = []
        for i, text in enumerate(row):
            if len(text) > widths[i]:
                text = text[: widths[i] - 1] + "…"
            parts.append(text.rjust(widths[i]) if i in right else text.ljust(widths[i]))
        lines.append((" " * gap).join(parts).rstrip())
    return "\n".join(lines)


def print_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, right: Sequence[int] = ()
) -> str:
    """Print :func:`render_table` to stdout; returns what it printed."""
    table = render_table(headers, rows, right=right)
    print(table)
    return table


def counted(count: int, noun: str) -> str:
    """``"1 message"``, ``"3 messages"``: a count with its noun, singular for one."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


# -- progress and confirmation ----------------------------------------------------
@contextmanager
def progress_bar(
    description: str,
    *,
    total: int | None,
    enabled: bool | None = None,
    counts: str = "",
    acted: str = "",
    stream: TextIO | None = None,
) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr while the block runs, only when stderr is a terminal.

    Yields ``update(done, total=None, acted=None)``; call it as work advances. Off a
    terminal (pipes, logs, CI) it does nothing, so output stays clean. ``counts`` says what
    ``done/total`` counts ("looked at"); ``acted`` names a second count shown beside it
    ("replayed"), for work that looks at more messages than it acts on. ``stream``: draw
    there as on a terminal instead (tests, a log that wants the bar).
    """
    show = (stream is not None or sys.stderr.isatty()) if enabled is None else enabled
    if not show:

        def nothing(done: int, new_total: int | None = None, acted: int | None = None) -> None:
            return None

        yield nothing
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    columns: list[Any] = ["[progress.description]{task.description}", BarColumn()]
    columns += [MofNCompleteColumn(), TextColumn(counts)] if counts else [MofNCompleteColumn()]
    if acted:
        columns.append(TextColumn(f"· {{task.fields[acted]}} {acted}"))
    console = Console(file=stream or sys.stderr, force_terminal=True) if stream else None
    with Progress(*columns, TimeRemainingColumn(), transient=True, console=console) as bar:
        task = bar.add_task(description, total=total, acted=0)

        def update(done: int, new_total: int | None = None, acted: int | None = None) -> None:
            if new_total is not None:
                bar.update(task, total=max(new_total, done))
            if acted is not None:
                bar.update(task, acted=acted)
            bar.update(task, completed=done)

        yield update


def confirm(question: str, *, assume_yes: bool) -> bool:
    """Ask ``question`` on the terminal; ``--yes`` answers for scripts.

    Without a terminal and without ``--yes`` it refuses (a usage error), so
    a script never hangs nor acts unasked.
    """
    if assume_yes:
        return True
    if not sys.stdin.isatty():
        raise UsageError(f"{question} needs a confirmation: run it on a terminal or add --yes")
    answer = input(f"{question} [y/N] ")
    return answer.strip().lower() in ("y", "yes")
