"""What a running service is, and what its probes read and answer.

A service command's start function returns a :class:`Running`; the runner
(:mod:`delayed_retry.cli.service`) keeps a :class:`ServiceState` of it and of
the connection. ``/livez`` and ``/readyz`` (:func:`probe_routes`) read that
state; :func:`watch` asks the broker every :data:`WATCH_EVERY` seconds whether
it counts this process's consumers, so readiness says what the broker sees,
not only what the client believes.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aio_pika.abc import AbstractRobustConnection

from delayed_retry.amqp.channels import declared_queue
from delayed_retry.amqp.consumers import Consumer
from delayed_retry.cli.service_http import Reply, Route
from delayed_retry.cli.startup import Startup
from delayed_retry.delivery.forwarder import Forwarder
from delayed_retry.delivery.front_door import FrontDoor

__all__ = [
    "LIVENESS_PATH",
    "READINESS_PATH",
    "WATCH_EVERY",
    "WATCH_TIMEOUT",
    "Running",
    "ServiceState",
    "count_reconnect",
    "exchanges_exist",
    "forwarding",
    "probe_routes",
    "watch",
    "watch_once",
]

LIVENESS_PATH = "/livez"
READINESS_PATH = "/readyz"
WATCH_EVERY = 2.0
"""Seconds between two rounds of the readiness checks that ask the broker."""
WATCH_TIMEOUT = 5.0
"""Seconds a round of broker checks may take; a broker that does not answer is not ready."""

log = logging.getLogger("delayed_retry.service")


@dataclass(frozen=True, kw_only=True)
class Running:
    """A started service, as the runner needs it: what to print, probe, count and stop."""

    startup: Startup
    stop: Callable[[float], Awaitable[None]]
    """Stop consuming, let what is in flight finish for up to the seconds given, close."""
    checks: Callable[[], Mapping[str, bool]] = dict
    """Readiness checks of its own, read at each probe."""
    consumers: Callable[[], Sequence[Consumer]] = tuple
    """The consumers it runs: readiness needs every one in place, seen by the broker."""
    watch: Callable[[], Awaitable[Mapping[str, bool]]] | None = None
    """Readiness checks that ask the broker, run every :data:`WATCH_EVERY` seconds."""
    counts: Callable[[], Mapping[str, int]] = dict
    held: Callable[[], int] = lambda: 0
    extra: Sequence[str] = ()
    """Clauses added to the start-up line."""
    finished: Awaitable[Any] | None = None
    """Ends the service without a signal (``alerts --once``)."""


@dataclass
class ServiceState:
    """What the probes read: the connection and the service, as they are now."""

    service: str
    connection: AbstractRobustConnection | None = None
    connects: bool = True
    running: Running | None = None
    stopping: bool = False
    reconnects: int = 0
    watched: dict[str, bool] = field(default_factory=dict)
    """The last round of broker checks (see :func:`watch`)."""
    broker_consumers: dict[str, int] = field(default_factory=dict)
    """Consumers the broker reported on each consumed queue, at the last round."""

    def connected(self) -> bool:
        c = self.connection
        return c is not None and c.connected.is_set() and not c.is_closed

    def consumers(self) -> Sequence[Consumer]:
        return self.running.consumers() if self.running is not None else ()

    def checks(self) -> dict[str, bool]:
        found = {"started": self.running is not None, "stopping": self.stopping}
        if self.connects:
            found["connected"] = self.connected()
        if self.running is not None:
            consumers = self.consumers()
            if consumers:
                found["consuming"] = all(c.in_place for c in consumers)
            found.update(self.running.checks())
            found.update(self.watched)
        return found

    def consumer_detail(self) -> dict[str, dict[str, Any]]:
        """Per consumed queue: in place on the live channel, the broker's count, restorations."""
        return {
            c.queue.name: {
                "in_place": c.in_place,
                "broker_consumers": self.broker_consumers.get(c.queue.name),
                "restored": c.restored,
            }
            for c in self.consumers()
        }

    def restored(self) -> int:
        return sum(c.restored for c in self.consumers())

    def ready(self) -> bool:
        checks = self.checks()
        return not checks.pop("stopping") and all(checks.values())

    def counts(self) -> Mapping[str, int]:
        return self.running.counts() if self.running is not None else {}

    def held(self) -> int:
        return self.running.held() if self.running is not None else 0


def _json(status: int, body: Mapping[str, Any]) -> Reply:
    return Reply(status=status, body=(json.dumps(body) + "\n").encode())


def probe_routes(state: ServiceState) -> dict[str, Route]:
    def live() -> Reply:
        return _json(200, {"status": "alive", "service": state.service})

    def ready() -> Reply:
        ok = state.ready()
        body: dict[str, Any] = {
            "status": "ready" if ok else "not ready",
            "service": state.service,
            "checks": state.checks(),
        }
        if state.consumers():
            body["consumers"] = state.consumer_detail()
        if state.connects:
            body["reconnects"] = state.reconnects
        return _json(200 if ok else 503, body)

    return {LIVENESS_PATH: live, READINESS_PATH: ready}


async def exchanges_exist(forwarder: Forwarder) -> dict[str, bool]:
    """The forwarder's readiness check: every exchange it delivers to exists now.

    While one is missing, each message that comes due for it is parked (the
    start-up line names the missing ones).
    """
    return {"exchanges_exist": not await forwarder.missing_exchanges()}


def forwarding(
    service: Forwarder | FrontDoor, *, startup: Startup, counts: Callable[[], Mapping[str, int]]
) -> Running:
    """A started service that delivers through a :class:`Forwarder`: ``forwarder`` itself, or
    ``front-door`` around one. Stopped and asked for its consumers as ``service``; ready while
    the forwarder's exchanges exist; holds what the forwarder holds until due."""
    forwarder = service.forwarder if isinstance(service, FrontDoor) else service
    return Running(
        startup=startup,
        stop=lambda grace: service.close(grace=grace),
        consumers=lambda: service.consumers,
        watch=lambda: exchanges_exist(forwarder),
        counts=counts,
        held=lambda: forwarder.held_until_due,
    )


def count_reconnect(state: ServiceState) -> None:
    state.reconnects += 1
    log.warning("reconnected to the broker (reconnect %d); restoring consumers", state.reconnects)


async def _broker_checks(state: ServiceState, running: Running) -> dict[str, bool]:
    """One round: each consumed queue has a consumer for the broker; the service's own."""
    assert state.connection is not None
    found: dict[str, bool] = {}
    names = list(dict.fromkeys(c.queue.name for c in running.consumers()))
    if names:
        counts = {}
        for name in names:
            declared = await declared_queue(state.connection, name)
            counts[name] = 0 if declared is None else int(declared.consumer_count or 0)
        state.broker_consumers = counts
        found["broker_sees_consumers"] = all(counts.values())
    if running.watch is not None:
        found.update(await running.watch())
    return found


async def watch_once(state: ServiceState, running: Running) -> None:
    try:
        state.watched = await asyncio.wait_for(_broker_checks(state, running), WATCH_TIMEOUT)
    except Exception as exc:  # not reachable now: not ready until it answers again
        log.debug("readiness checks could not ask the broker: %r", exc)
        state.watched = {**dict.fromkeys(state.watched, False), "broker_answers": False}
    else:
        state.watched["broker_answers"] = True


async def watch(state: ServiceState, running: Running) -> None:
    """Ask the broker every :data:`WATCH_EVERY` seconds until cancelled."""
    while True:
        await asyncio.sleep(WATCH_EVERY)
        await watch_once(state, running)
