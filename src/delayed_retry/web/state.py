"""What the web view's handlers share: the state of one application, and the reads and
checks that both the pages and the JSON API make.

Use :func:`state_of` in a handler to reach the parking lot, the jobs, the served queues and
the parked messages a query asks for;
:func:`overview_data` and :func:`level_rows` for the counts both views show;
:func:`start_job` to start a replay or purge after :func:`check_target` accepted it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jinja2
from aio_pika.abc import AbstractConnection
from aiohttp import web

from delayed_retry.admin.management import BEST_EFFORT_TIMEOUT, ManagementClient, ManagementError
from delayed_retry.alerts.mute_store import MuteFollower
from delayed_retry.chain.leaders import leader_spread, lopsided_warning
from delayed_retry.errors import ConfigurationError
from delayed_retry.parking.lot import ParkedFilter, ParkedRecord
from delayed_retry.web.jobs import AuditLog, Job, JobManager, JobRequest
from delayed_retry.web.lot import Page, ParkingLot
from delayed_retry.web.plans import PlanBook
from delayed_retry.web.query import filter_from_query, query_int
from delayed_retry.web.settings import WebSettings

__all__ = [
    "STATE",
    "WebState",
    "check_target",
    "level_rows",
    "overview_data",
    "start_job",
    "state_of",
]


@dataclass
class WebState:
    """Everything the handlers share; one per application."""

    settings: WebSettings
    templates: jinja2.Environment
    connection: AbstractConnection | None = None
    lot: ParkingLot | None = None
    jobs: JobManager | None = None
    audit: AuditLog = field(default_factory=lambda: AuditLog(None))
    plans: PlanBook = field(default_factory=PlanBook)
    queues: list[str] = field(default_factory=list)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    mutes: MuteFollower | None = None

    def parking_queue(self, queue: str) -> str:
        """The parking queue shown for ``queue`` (the unroutable queue is its own)."""
        if queue == self.settings.topology.unroutable_queue:
            return queue
        return self.settings.topology.default_parking_queue(queue)

    def known(self, queue: str | None) -> str:
        """``queue`` if the view serves it, else an HTTP 404 naming the choices."""
        if queue and (queue in self.queues or queue == self.settings.topology.unroutable_queue):
            return queue
        choices = ", ".join(self.queues) or "none"
        raise web.HTTPNotFound(
            text=json.dumps({"error": f"queue {queue!r} is not served here; served: {choices}"}),
            content_type="application/json",
        )

    def parts(self) -> tuple[ParkingLot, JobManager]:
        if self.lot is None or self.jobs is None:
            raise web.HTTPServiceUnavailable(text="not connected to the broker yet\n")
        return self.lot, self.jobs

    async def parked_page(
        self,
        lot: ParkingLot,
        queue: str,
        query: Mapping[str, str],
        *,
        max_limit: int | None = None,
    ) -> tuple[ParkedFilter, Page]:
        """The filter ``query`` describes and the page of ``queue``'s parked messages it selects,
        read from ``lot`` (see :meth:`parts`).

        The page starts at the query's ``offset``; it holds the query's ``limit`` (up to
        ``max_limit``, the page size when absent) when ``max_limit`` is given, else the page
        size. A bad value raises :class:`~delayed_retry.errors.ConfigurationError` naming it.
        """
        where = filter_from_query(query)
        offset = query_int(query, "offset", 0, high=10_000_000)
        limit = self.settings.page_size
        if max_limit is not None:
            limit = query_int(query, "limit", limit, high=max_limit)
        page = await lot.page(self.parking_queue(queue), where=where, offset=offset, limit=limit)
        return where, page

    async def requested_record(
        self, query: Mapping[str, str]
    ) -> tuple[str, str, ParkedRecord | None]:
        """The served queue and key ``query`` names, and that parked message (``None``: gone)."""
        lot, _ = self.parts()
        queue = self.known(query.get("queue"))
        key = query.get("key", "")
        record = await lot.find(self.parking_queue(queue), key) if key else None
        return queue, key, record


STATE = web.AppKey("delayed_retry_web", WebState)


def state_of(request: web.Request) -> WebState:
    """The state of the application serving ``request``."""
    return request.app[STATE]


async def overview_data(state: WebState) -> dict[str, Any]:
    """The served parking queues, the chain's level queues and the depth of each."""
    lot, _ = state.parts()
    topology = state.settings.topology
    parking = {q: state.parking_queue(q) for q in state.queues}
    levels = [topology.level_name(k) for k in range(topology.levels)]
    counts = await lot.counts([*parking.values(), *levels, topology.unroutable_queue])
    return {"parking": parking, "levels": levels, "counts": counts}


def level_rows(state: WebState, counts: Mapping[str, int | None]) -> list[dict[str, Any]]:
    """The chain's non-empty levels, each with how soon its messages come due at most."""
    topology = state.settings.topology
    rows = []
    for k in range(topology.levels):
        name = topology.level_name(k)
        count = counts.get(name)
        if not count:
            continue
        # A message in level k has its level's TTL left at most, plus the lower bits.
        upper = ((1 << (k + 1)) - 1) * topology.unit_ms / 1000
        rows.append({"level": k, "name": name, "count": count, "due_within": upper})
    return rows


async def chain_leaders(state: WebState) -> dict[str, Any] | None:
    """Level leaders per node, each level's leader and a lopsided warning; ``None`` unread.

    Read through the management API (best effort: the page shows the chain without it).
    """
    settings = state.settings
    try:
        queues = await ManagementClient.for_broker(
            settings.url, management_url=settings.management_url, timeout=BEST_EFFORT_TIMEOUT
        ).queues()
    except ManagementError:
        return None
    topology = settings.topology
    spread = leader_spread(topology, {queue.name: queue.leader for queue in queues})
    levels = {topology.level_name(k) for k in range(topology.levels)}
    nodes = {node for queue in queues if queue.name in levels for node in queue.members}
    return {
        "per_node": dict(spread.per_node),
        "levels": dict(spread.levels),
        "warning": lopsided_warning(topology, spread, nodes=nodes),
    }


def check_target(state: WebState, request: JobRequest) -> None:
    """Refuse a replay or purge of a queue not served here, or to a queue not served here."""
    queue = state.known(request.queue)
    if (
        request.action == "replay"
        and queue == state.settings.topology.unroutable_queue
        and not request.to_queue
    ):
        raise ConfigurationError(
            "unroutable messages have no queue of their own: name the queue to replay them to "
            '("to_queue")'
        )
    if request.to_queue and request.to_queue not in state.queues:
        raise ConfigurationError(
            f"to_queue {request.to_queue!r} is not served here; choose one of "
            f"{', '.join(state.queues)}"
        )


async def start_job(state: WebState, jobs: JobManager, request: JobRequest, *, user: str) -> Job:
    """Start ``request`` as a job once :func:`check_target` accepts it."""
    check_target(state, request)
    return await jobs.submit(request, user=user, parking_queue=state.parking_queue(request.queue))
