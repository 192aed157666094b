"""Entry point: builds the parser from the subcommand modules and runs the chosen one.

Each module in :data:`SUBCOMMAND_MODULES` is named after the command it adds
(``<command>_cmd.py``) and ends with ``COMMAND``, a
:class:`~delayed_retry.cli.command.Command` that declares it: name, help,
description, a function adding its options, and the function that runs it
(taking the parsed arguments, returning the exit code or a coroutine that
does), or its verbs, each a Command of its own. Add a command with one module
and one line there. Shared output, errors and option types live in
:mod:`delayed_retry.cli.output`, connecting in :mod:`delayed_retry.cli.connection`.

Exit codes, one rule (docs/reference/command-line.md states it): 2 when the
command line itself is wrong (argparse's errors, :class:`UsageError`, a
:class:`~delayed_retry.errors.ConfigurationError` about a value given); 1 when
it is right but the broker or the machine is not as the command needs
(:class:`CommandError`, :class:`~delayed_retry.errors.NotFoundError` for a
queue or file named that does not exist, any other library error, a broker
that cannot be reached); 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import logging
import os
import select
import signal
import sys
from collections.abc import Sequence

import aiormq

from delayed_retry.cli import output
from delayed_retry.cli.connection import check_url, explain_connection_error
from delayed_retry.cli.parser import CommandLineParser
from delayed_retry.errors import (
    AccessRefusedError,
    ConfigurationError,
    DelayedRetryError,
    NotFoundError,
    ServiceUnavailableError,
)
from delayed_retry.rabbitmq.urls import redact_url

__all__ = ["SUBCOMMAND_MODULES", "build_parser", "installed_version", "main", "run"]

SUBCOMMAND_MODULES = (
    "delayed_retry.cli.declare_cmd",
    "delayed_retry.cli.status_cmd",
    "delayed_retry.cli.publish_cmd",
    "delayed_retry.cli.parking_cmd",
    "delayed_retry.cli.demo_cmd",
    "delayed_retry.cli.archive_cmd",
    "delayed_retry.cli.spark_cmd",
    "delayed_retry.cli.alerts_cmd",
    "delayed_retry.cli.mute_cmd",
    "delayed_retry.cli.topology_cmd",
    "delayed_retry.cli.router_cmd",
    "delayed_retry.cli.teardown_cmd",
    "delayed_retry.cli.forwarder_cmd",
    "delayed_retry.cli.front_door_cmd",
    "delayed_retry.cli.migrate_plugin_cmd",
    "delayed_retry.cli.web_cmd",
)
"""One module per top-level command, named after it (``front-door`` is ``front_door_cmd``);
a command's verbs may live in a module of their own (``topology_migrate_cmd``)."""


DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672/"


def installed_version() -> str:
    """The version of the installed distribution, as ``delayed_retry.__version__`` says it.

    Read from the package metadata (``pyproject.toml`` is its one source), not
    from the facade, which no module of the package imports.
    """
    try:
        return importlib.metadata.version("delayed-retry")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree never installed
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every subcommand registered."""
    parser = CommandLineParser(
        prog="delayed-retry",
        description="Delayed retries, parking and scheduling in RabbitMQ: operate the chain.",
        epilog="Exit codes: 0 ok; 1 the broker or machine is not as the command needs (e.g. a "
        "queue you named does not exist); 2 the command line is wrong (e.g. a bad value). "
        "Durations: 250ms, 90s, 15m, 1h, 2d.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("RABBITMQ_URL") or DEFAULT_URL,
        help=f"broker URL, amqp:// or amqps:// (default: $RABBITMQ_URL or {DEFAULT_URL})",
    )
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="log at DEBUG level (and Spark's warnings)"
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {installed_version()}",
        help="print the version and exit",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).COMMAND.add_to(sub)
    return parser


def _quiet_logging(verbose: bool) -> None:
    # The command reports failures itself, in one line: libraries' own ERROR lines
    # (aiormq logs every failed connect) only show with --verbose.
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not verbose:
        for name in ("aiormq", "aio_pika", "asyncio"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
"""The exit code when the reader of standard output went away, as a Unix tool killed by SIGPIPE."""


def _stdout_closed() -> bool:
    """Whether standard output is a pipe whose reader is gone; if so, silence it for good.

    Asked of the pipe itself (``poll`` reports an error on a pipe with no reader
    left), not of Python's buffer, which a failed write may have emptied. Later
    writes (and the interpreter's last flush) then go to /dev/null, so the
    command ends without a traceback or an error line, as ``head`` expects of
    the tools it reads.
    """
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by an object without a file
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    if not any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0)):
        return False
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code (0 ok, 1 the world, 2 the words)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) and usage errors (2), already printed
        return int(exc.code or 0)
    _quiet_logging(args.verbose)
    given = list(sys.argv[1:] if argv is None else argv)
    args.url_given = bool(os.environ.get("RABBITMQ_URL")) or any(
        a == "--url" or a.startswith("--url=") for a in given
    )
    try:
        if getattr(args, "needs_broker", True):
            check_url(args.url)
        code: int = args.func(args)
    except output.CommandError as exc:
        output.print_error(str(exc))
        return exc.exit_code
    # A name the user gave names nothing, or the broker refuses the user: the world, not the words.
    except (NotFoundError, AccessRefusedError, ServiceUnavailableError) as exc:
        output.print_error(str(exc))
        return output.EXIT_FAILURE
    except ConfigurationError as exc:  # a value the user gave is wrong: a usage error
        output.print_error(str(exc))
        return output.EXIT_USAGE
    except DelayedRetryError as exc:  # its message names the object and the fix already
        output.print_error(str(exc))
        return output.EXIT_FAILURE
    except BrokenPipeError:
        if _stdout_closed():  # `delayed-retry parking list | head -1`: the reader is done
            return EXIT_BROKEN_PIPE
        raise
    except (aiormq.exceptions.AMQPError, ConnectionError, OSError, TimeoutError) as exc:
        line = explain_connection_error(exc, args.url)
        if line is None:
            line = f"the broker at {redact_url(args.url)!r} failed the command: {exc!r}"
        output.print_error(line)
        return output.EXIT_FAILURE
    except KeyboardInterrupt:
        output.print_error("interrupted; nothing acted on was lost (unacked messages went back)")
        return 130
    return code


def run(coro: object) -> int:
    """Run a subcommand coroutine returning an exit code."""
    result: int = asyncio.run(coro)  # type: ignore[arg-type]
    return result


if __name__ == "__main__":
    sys.exit(main())
