"""The service runner: what every long-running command does around its own work, once.

``front-door``, ``forwarder``, ``router``, ``alerts`` and ``web`` each say how to start (a
function returning a :class:`Running`); :func:`run_service` does the rest for all of them:
logs, the health and metrics ports (open before connecting), a robust connection, the
start-up line, readiness (:mod:`delayed_retry.cli.service_state`) and the stop on SIGTERM.
What a probe answers and how a stop lets hand-overs finish: docs/operations.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aio_pika
from aio_pika.abc import AbstractRobustConnection

from delayed_retry.cli import common, output
from delayed_retry.cli.json_logs import JsonFormatter
from delayed_retry.cli.service_http import Route, serve_routes
from delayed_retry.cli.service_metrics import ServiceMetrics
from delayed_retry.cli.service_state import (
    LIVENESS_PATH,
    READINESS_PATH,
    Running,
    ServiceState,
    count_reconnect,
    probe_routes,
    watch,
    watch_once,
)
from delayed_retry.cli.startup import announce

__all__ = [
    "METRICS_PATH",
    "STOP_TIMEOUT",
    "Start",
    "add_forwarding_args",
    "add_service_args",
    "run_service",
]

METRICS_PATH = "/metrics"
STOP_TIMEOUT = 10.0
"""Default ``--stop-timeout``: seconds a stopping service lets hand-overs in flight finish."""
CLOSE_ALLOWANCE = 5.0
"""Seconds beyond ``--stop-timeout`` for closing channels and the connection; then it exits."""

log = logging.getLogger("delayed_retry.service")


Start = Callable[[AbstractRobustConnection | None], Awaitable[Running]]
"""A service command's start: given the connection (``None`` for ``web``), the started service."""


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = 0
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port; use 1..65535, e.g. 9464")
    return port


def add_service_args(parser: argparse.ArgumentParser) -> None:
    """Add the options every service command shares: ports, logs, the stop bound."""
    group = parser.add_argument_group("running as a service")
    group.add_argument(
        "--health-port",
        type=_port,
        metavar="PORT",
        help=f"serve {LIVENESS_PATH} and {READINESS_PATH} (200 or 503, JSON) on PORT",
    )
    group.add_argument(
        "--metrics-port",
        type=_port,
        metavar="PORT",
        help=f"serve Prometheus metrics on PORT at {METRICS_PATH} (needs the 'service' extra); "
        "may equal --health-port",
    )
    group.add_argument(
        "--service-host",
        default="0.0.0.0",
        metavar="ADDRESS",
        help="address the health and metrics ports listen on (%(default)s)",
    )
    group.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text lines, or one JSON object per line on standard output (%(default)s)",
    )
    group.add_argument(
        "--stop-timeout",
        type=output.duration_type,
        default=STOP_TIMEOUT,
        metavar="DURATION",
        help="on SIGTERM, let messages in flight finish for this long, then give the rest "
        "back and exit (10s)",
    )


def add_forwarding_args(parser: argparse.ArgumentParser) -> None:
    """The options after ``--exchange`` of a command that runs a
    :class:`~delayed_retry.delivery.forwarder.Forwarder` (``forwarder``, ``front-door``):
    ``--prefetch``, the delay topology, the service options."""
    parser.add_argument("--prefetch", type=int, default=1000, help="unacked at once (%(default)s)")
    common.add_topology_args(parser)
    add_service_args(parser)


def _configure_logs(log_format: str) -> Callable[[str], None]:
    """Set up JSON logs when asked; return how the runner writes its own lines."""
    if log_format != "json":
        return lambda line: print(line, flush=True)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    log.setLevel(logging.INFO)
    return lambda line: log.info(line)


async def _listen(
    args: argparse.Namespace, state: ServiceState, metrics: ServiceMetrics | None
) -> list[asyncio.Server]:
    by_port: dict[int, dict[str, Route]] = {}
    options: dict[int, str] = {}
    if args.health_port:
        by_port.setdefault(args.health_port, {}).update(probe_routes(state))
        options[args.health_port] = "--health-port"
    if metrics is not None:
        by_port.setdefault(args.metrics_port, {})[METRICS_PATH] = metrics.page
        options.setdefault(args.metrics_port, "--metrics-port")
    servers: list[asyncio.Server] = []
    try:
        for port, routes in by_port.items():
            servers.append(
                await serve_routes(
                    host=args.service_host, port=port, routes=routes, option=options[port]
                )
            )
    except BaseException:
        for server in servers:
            server.close()
        raise
    return servers


def _summary(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{name.replace('_', ' ')} {n}" for name, n in counts.items())


async def run_service(
    args: argparse.Namespace, *, command: str, start: Start, connect: bool = True
) -> int:
    """Run one service command from start to a clean stop; see the module's docstring.

    ``start`` gets the connection (``None`` when ``connect`` is false, as for
    ``web``, which connects per request) and returns the started service.
    """
    say = _configure_logs(args.log_format)
    state = ServiceState(service=command, connects=connect)
    metrics = None
    if args.metrics_port:
        metrics = ServiceMetrics(
            service=command,
            counts=state.counts,
            held=state.held,
            ready=state.ready,
            reconnects=lambda: state.reconnects,
            restored=state.restored,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    servers: list[asyncio.Server] = []
    try:
        servers = await _listen(args, state, metrics)
        state.connection = await aio_pika.connect_robust(args.url) if connect else None
        if state.connection is not None:
            state.connection.reconnect_callbacks.add(lambda *_: count_reconnect(state))
        watcher: asyncio.Task[None] | None = None
        try:
            running = await start(state.connection)
            if state.connection is not None:
                await watch_once(state, running)  # ready only once the broker was asked
            state.running = running
            if state.connection is not None:
                watcher = asyncio.create_task(watch(state, running), name="readiness-watch")
            json_say = say if args.log_format == "json" else None
            await announce(
                args, state.connection, running.startup, extra=running.extra, say=json_say
            )
            say("running; stop with Ctrl-C or SIGTERM")
            await _until(stop, running.finished)
            state.stopping = True
            began = time.monotonic()
            try:
                await asyncio.wait_for(
                    running.stop(args.stop_timeout), args.stop_timeout + CLOSE_ALLOWANCE
                )
            except TimeoutError:
                log.warning(
                    "%s did not stop within %.0f s; closing the connection (unacked messages "
                    "go back to their queues)",
                    command,
                    args.stop_timeout + CLOSE_ALLOWANCE,
                )
            took = f"stopped in {time.monotonic() - began:.2f} s"
            say("; ".join(filter(None, [_summary(running.counts()), took])))
        finally:
            if watcher is not None:
                watcher.cancel()
                await asyncio.gather(watcher, return_exceptions=True)
            if state.connection is not None:
                await state.connection.close()
    finally:
        for server in servers:
            server.close()
        if metrics is not None:
            metrics.shutdown()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
    return 0


async def _until(stop: asyncio.Event, finished: Awaitable[Any] | None) -> None:
    waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(stop.wait())]
    if finished is not None:
        waiters.append(asyncio.ensure_future(finished))
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
