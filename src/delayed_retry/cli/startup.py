"""What a long-running command says when it starts, and the mistakes it warns about.

Every service command (``front-door``, ``forwarder``, ``router``, ``alerts``,
``web``) prints one line naming the chain it uses (prefix, levels, unit) and
the queues it consumes, so a log shows at a glance which chain a process
serves. Before consuming, the front door and the forwarder look for what
strands messages silently:

- the exchange they deliver to is missing (what comes due would be parked);
- ``X.delay`` holds messages and nothing consumes it (no front door runs);
- a forward queue of ``X`` under *another* prefix holds messages (a process
  restarted without ``--prefix``/``$DELAYED_RETRY_PREFIX`` serves a second
  chain while the first one's messages wait). Finding those needs the
  management API; without it that check is skipped, and the line says so.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from aio_pika.abc import AbstractConnection

from delayed_retry.admin.chain_probe import declared_queue, exchange_exists
from delayed_retry.admin.live_chain import LiveQueue
from delayed_retry.admin.management import BEST_EFFORT_TIMEOUT, ManagementError
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli import common
from delayed_retry.durations import format_duration

__all__ = ["Startup", "announce", "startup_line", "stranded_forward_queues"]

log = logging.getLogger("delayed_retry.service")


@dataclass(frozen=True, kw_only=True)
class Startup:
    """A service command as it starts: what it is, which chain, what it consumes and feeds."""

    command: str
    topology: DelayTopology
    consumes: tuple[str, ...]
    delivers_to: tuple[str, ...] = ()
    """Exchanges it publishes to (the front door's and the forwarder's ``--exchange``)."""
    verb: str = "consuming"
    """What it does with ``consumes``: the web view is ``reading`` parking queues."""


def startup_line(startup: Startup) -> str:
    """The one line a service prints when it starts (pure)."""
    t = startup.topology
    unit = format_duration(t.unit_ms / 1000)
    line = (
        f"delayed-retry {startup.command}: chain prefix {t.prefix!r} ({t.levels} levels of "
        f"{unit}, {t.queue_type}); {startup.verb} {', '.join(map(repr, startup.consumes))}"
    )
    if startup.delivers_to:
        line += f"; delivering to exchange {', '.join(map(repr, startup.delivers_to))}"
    return line


def stranded_forward_queues(
    *, topology: DelayTopology, exchanges: Iterable[str], queues: Iterable[LiveQueue]
) -> list[str]:
    """Warnings for forward queues of ``exchanges`` under another prefix that hold messages.

    Pure: ``queues`` is what the management API lists. A forward queue is
    ``<prefix>.forward.<exchange>``; one whose prefix is not ``topology.prefix``
    is served by no process started with this prefix.
    """
    listed = list(queues)
    warnings = []
    for exchange in exchanges:
        pattern = re.compile(rf"^(?P<prefix>.+)\.forward\.{re.escape(exchange)}$")
        for queue in listed:
            match = pattern.match(queue.name)
            if match is None or match["prefix"] == topology.prefix or not queue.messages:
                continue
            other = match["prefix"]
            warnings.append(
                f"queue {queue.name!r} holds {queue.messages} message(s) for exchange "
                f"{exchange!r} in the chain of prefix {other!r}, which this process (prefix "
                f"{topology.prefix!r}) does not consume; if that is the chain your producers "
                f"use, restart with --prefix {other} (or DELAYED_RETRY_PREFIX={other})"
            )
    return warnings


async def _checks(
    args: argparse.Namespace, connection: AbstractConnection | None, startup: Startup
) -> tuple[list[str], str | None]:
    """(warnings, a note on a check that could not run) before ``startup`` consumes."""
    warnings: list[str] = []
    if connection is None:  # a service that connects per request (web): nothing to check
        return warnings, None
    for exchange in startup.delivers_to:
        if not await exchange_exists(connection, exchange):
            warnings.append(
                f"exchange {exchange!r} does not exist: every message that comes due for it is "
                f"parked in {startup.topology.forward_queue(exchange) + '.parking'!r} (reason "
                "exchange-missing); declare it, with its bindings"
            )
        inbox = f"{exchange}.delay"
        if startup.command != "front-door" and (state := await declared_queue(connection, inbox)):
            messages = state.message_count or 0
            if messages and not state.consumer_count:
                warnings.append(
                    f"queue {inbox!r} holds {messages} message(s) and nothing consumes it; "
                    f"run `delayed-retry front-door --exchange {exchange}` with the same prefix"
                )
    note = None
    if startup.delivers_to:
        try:
            queues = await common.management_client(args, timeout=BEST_EFFORT_TIMEOUT).queues()
        except ManagementError:
            note = "forward queues of other prefixes not checked (management API not reachable)"
        else:
            warnings += stranded_forward_queues(
                topology=startup.topology, exchanges=startup.delivers_to, queues=queues
            )
    return warnings, note


async def announce(
    args: argparse.Namespace,
    connection: AbstractConnection | None,
    startup: Startup,
    *,
    extra: Sequence[str] = (),
    say: Callable[[str], None] | None = None,
) -> list[str]:
    """Print the start-up line (with ``extra`` clauses) and the warnings; return the warnings.

    ``say`` writes the line instead of ``print`` (the service runner's JSON logs);
    warnings then go through it too, prefixed ``warning:``.
    """
    warnings, note = await _checks(args, connection, startup)
    line = "; ".join([startup_line(startup), *extra, *([note] if note else [])])
    if say is None:
        print(line, flush=True)
        for warning in warnings:
            print(f"delayed-retry: warning: {warning}", file=sys.stderr, flush=True)
    else:
        say(line)
        for warning in warnings:
            log.warning("%s", warning)
    return warnings
