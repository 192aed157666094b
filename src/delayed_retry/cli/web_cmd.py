"""``delayed-retry web``: serve the web view of the parking lots and the delay chain."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from aio_pika.abc import AbstractRobustConnection

from delayed_retry.cli import common, output
from delayed_retry.cli.command import Command
from delayed_retry.cli.service import add_service_args, run_service
from delayed_retry.cli.service_state import Running
from delayed_retry.cli.startup import Startup
from delayed_retry.errors import ConfigurationError

__all__ = ["COMMAND"]


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (%(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="port (%(default)s)")
    common.add_queues_option(
        parser,
        help="a work queue whose parking lot to show (repeat); default: find them through "
        "the management API",
    )
    parser.add_argument(
        "--auth",
        metavar="USER:PASSWORD",
        help="require HTTP Basic authentication (a bearer token can come from "
        "$DELAYED_RETRY_WEB_TOKEN)",
    )
    parser.add_argument("--read-only", action="store_true", help="show only; refuse every action")
    parser.add_argument(
        "--audit-log",
        type=Path,
        default=None,
        metavar="PATH",
        help="append every replay and purge to this JSON-lines file (default: "
        "$XDG_STATE_HOME/delayed-retry/audit.jsonl, else "
        "~/.local/state/delayed-retry/audit.jsonl; none with --read-only, which has "
        "nothing to record)",
    )
    common.add_management_option(
        parser, purpose="finding the parking queues when no --queue is given"
    )
    common.add_topology_args(parser)
    add_service_args(parser)


def _writable_audit_log(path: Path) -> Path:
    """``path``, with its folder made; a place that cannot be written fails at start-up."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ConfigurationError(
            f"cannot append the audit log to {str(path)!r}: {exc.strerror or exc}; pass "
            "--audit-log PATH with a file you can write"
        ) from exc
    return path


def _audit_log_for(args: argparse.Namespace, default: Callable[[], Path]) -> Path | None:
    """The audit log ``web`` appends to: the one asked for, else none when read-only.

    A read-only view has no action to record, so it needs no writable place: a
    container user without a home can run it.
    """
    if args.audit_log is not None:
        return _writable_audit_log(args.audit_log)
    if args.read_only:
        return None
    return _writable_audit_log(default())


async def _serve(args: argparse.Namespace) -> int:
    output.require_extra("web", ("aiohttp", "jinja2"), what="the web view")
    from aiohttp import web

    from delayed_retry.web import WebSettings, create_app, parse_credentials
    from delayed_retry.web.security import check_bind
    from delayed_retry.web.settings import TOKEN_ENV, default_audit_log

    if not 0 < args.port < 65536:
        raise ConfigurationError(f"--port {args.port} must be within 1..65535")
    credentials = parse_credentials(args.auth, token=os.environ.get(TOKEN_ENV))
    check_bind(args.host, credentials)
    audit_log = _audit_log_for(args, default_audit_log)
    settings = WebSettings(
        url=args.url,
        queues=tuple(args.queue),
        topology=common.topology_from_args(args),
        credentials=credentials,
        read_only=args.read_only,
        audit_log=audit_log,
        management_url=common.management_url_from(args),
    )
    runner = web.AppRunner(create_app(settings), access_log=None, shutdown_timeout=5)

    async def start(connection: AbstractRobustConnection | None) -> Running:
        del connection  # the web view connects per request
        await runner.setup()
        site = web.TCPSite(runner, args.host, args.port)
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise output.CommandError(
                f"cannot listen on {args.host}:{args.port}: {exc.strerror}; choose another --port"
            ) from exc
        host = f"[{args.host}]" if ":" in args.host else args.host
        topology = settings.topology
        parking = tuple(topology.default_parking_queue(q) for q in settings.queues) or (
            "the parking queues it finds",
        )

        async def stop(grace: float) -> None:
            del grace  # aiohttp's shutdown_timeout bounds the requests in flight
            await runner.cleanup()

        return Running(
            startup=Startup(command="web", topology=topology, consumes=parking, verb="reading"),
            stop=stop,
            checks=lambda: {"serving": bool(runner.sites)},
            extra=(
                f"on http://{host}:{args.port}/ (Ctrl-C to stop)",
                f"audit log: {audit_log or 'none (read-only)'}",
            ),
        )

    return await run_service(args, command="web", start=start, connect=False)


COMMAND = Command(
    name="web",
    help="serve a web view of parked messages and the delay chain",
    description="Serve the web view: parking lots grouped by failure, the chain's levels, "
    "replay and purge as background jobs. Listens on 127.0.0.1 unless --host is given; "
    "any other address needs --auth or $DELAYED_RETRY_WEB_TOKEN.",
    options=_options,
    run=_serve,
)
