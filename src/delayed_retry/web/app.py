"""The aiohttp application: pages, the JSON API, live counts, actions.

Use :func:`create_app` to run the view alone (``delayed-retry web``) or to
mount it in an existing aiohttp application::

    parent.add_subapp("/retries/", create_app(WebSettings(queues=("orders",))))

It opens its own robust connection to ``settings.url`` unless given one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aio_pika
import jinja2
from aio_pika.abc import AbstractConnection
from aiohttp import web

from delayed_retry.durations import format_duration, utcnow
from delayed_retry.errors import ConfigurationError, DelayedRetryError
from delayed_retry.headers import (
    BROKER_READ_COUNTERS,
    X_DEATH,
    X_LAST_ERROR,
    X_LAST_FAILURE_AT,
    X_REPLAYED_AT,
    X_REPLAYED_BY,
    read_epoch_ms,
    split_read_counters,
)
from delayed_retry.parking.canary_wait import retry_span
from delayed_retry.parking.lot import CanaryWait, ParkedFilter, ParkedRecord
from delayed_retry.web.discovery import discover_queues
from delayed_retry.web.forms import PAGE_CANARY, PAGE_RATE, form_field, request_from_form
from delayed_retry.web.jobs import Action, AuditLog, Job, JobManager, JobRequest
from delayed_retry.web.lot import ParkingLot
from delayed_retry.web.plans import PlanBook, ReplayPlan
from delayed_retry.web.records import (
    FILTER_FIELDS,
    filter_from_mapping,
    filter_to_mapping,
    group_label,
)
from delayed_retry.web.render import format_age, header_rows, histogram, view_body
from delayed_retry.web.security import USER, security_middleware
from delayed_retry.web.settings import WebSettings

__all__ = ["STATE", "WebState", "create_app"]

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent


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


STATE = web.AppKey("delayed_retry_web", WebState)


def _templates() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(_HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        enable_async=False,
    )
    env.filters["age"] = lambda moment: format_age(moment, now=utcnow())
    env.filters["duration"] = format_duration
    env.filters["label"] = group_label
    env.filters["when"] = lambda moment: moment.isoformat(timespec="seconds") if moment else "?"
    return env


def create_app(
    settings: WebSettings, *, connection: AbstractConnection | None = None
) -> web.Application:
    """The web view as an aiohttp application (standalone or as a sub-application)."""
    app = web.Application(
        middlewares=[
            security_middleware(
                settings.credentials,
                read_only=settings.read_only,
                trusted_hosts=settings.trusted_hosts,
            )
        ],
        client_max_size=1024 * 1024,
    )
    state = WebState(settings=settings, templates=_templates(), connection=connection)
    state.audit = AuditLog(settings.audit_log)
    app[STATE] = state
    app.cleanup_ctx.append(_broker_context)
    app.on_shutdown.append(_on_shutdown)
    r = app.router
    r.add_get("/", overview_page, name="overview")
    r.add_get("/parked", queue_page, name="queue")
    r.add_get("/message", message_page, name="message")
    r.add_get("/events", events, name="events")
    r.add_get("/jobs/{id}", job_fragment, name="job")
    r.add_post("/actions", action_form, name="actions")
    r.add_get("/api/queues", api_queues, name="api-queues")
    r.add_get("/api/parked", api_parked, name="api-parked")
    r.add_get("/api/message", api_message, name="api-message")
    r.add_post("/api/parked/replay", api_replay, name="api-replay")
    r.add_post("/api/parked/purge", api_purge, name="api-purge")
    r.add_get("/api/jobs/{id}", api_job, name="api-job")
    r.add_get("/api/audit", api_audit, name="api-audit")
    r.add_static("/static/", _HERE / "static", name="static", append_version=True)
    return app


async def _broker_context(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    if state.settings.queues:
        state.queues = list(state.settings.queues)
    else:
        state.queues = await discover_queues(
            state.settings.url,
            topology=state.settings.topology,
            management_url=state.settings.management_url,
        )
        log.info("found parking queues for: %s", ", ".join(state.queues) or "none")
    own = state.connection is None
    if state.connection is None:
        state.connection = await aio_pika.connect_robust(state.settings.url)
    state.lot = ParkingLot(
        state.connection, topology=state.settings.topology, scan_limit=state.settings.scan_limit
    )
    state.jobs = JobManager(state.lot, state.audit)
    try:
        yield
    finally:
        await state.jobs.wait_all()
        await state.lot.close()
        if own:
            await state.connection.close()


async def _on_shutdown(app: web.Application) -> None:
    app[STATE].stopping.set()


# -- helpers -----------------------------------------------------------------
def _state(request: web.Request) -> WebState:
    return request.app[STATE]


def _url(request: web.Request, name: str, **query: Any) -> str:
    clean = {k: str(v) for k, v in query.items() if v is not None and v != ""}
    if name == "static":
        return str(request.app.router["static"].url_for(filename=clean.pop("filename")))
    if name == "job":
        return str(request.app.router["job"].url_for(id=clean.pop("id")))
    return str(request.app.router[name].url_for().with_query(clean))


def _render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    state = _state(request)
    html = state.templates.get_template(template).render(
        url=lambda name, **q: _url(request, name, **q),
        settings=state.settings,
        queues=state.queues,
        user=request.get(USER),
        **context,
    )
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


def _filter_from(query: Mapping[str, str]) -> ParkedFilter:
    return filter_from_mapping({k: query[k] for k in FILTER_FIELDS if k in query})


def _int(query: Mapping[str, str], name: str, default: int, *, high: int) -> int:
    raw = query.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw[:20]!r} must be a whole number") from None
    if not 0 <= value <= high:
        raise ConfigurationError(f"{name}={value} must be between 0 and {high}")
    return value


def _record_json(record: ParkedRecord, *, body_size: int | None = None) -> dict[str, Any]:
    return {
        "message_id": record.message_id,
        "key": record.id,
        "queue": record.queue,
        "exception_type": record.exception_type,
        "exception_message": record.exception_message,
        "reason": record.reason,
        "attempts": record.attempts,
        "parked_at": record.parked_at.isoformat() if record.parked_at else None,
        "first_failure_at": record.first_failure_at.isoformat()
        if record.first_failure_at
        else None,
        "replays": record.replays,
        "group": record.fingerprint,
        "group_label": group_label(record),
        "body_size": len(record.body) if body_size is None else body_size,
    }


def _bad_request(exc: Exception) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=json.dumps({"error": str(exc)}), content_type="application/json")


async def _overview_data(state: WebState) -> dict[str, Any]:
    lot, _ = state.parts()
    topology = state.settings.topology
    parking = {q: state.parking_queue(q) for q in state.queues}
    levels = [topology.level_name(k) for k in range(topology.levels)]
    counts = await lot.counts([*parking.values(), *levels, topology.unroutable_queue])
    return {"parking": parking, "levels": levels, "counts": counts}


def _level_rows(state: WebState, counts: Mapping[str, int | None]) -> list[dict[str, Any]]:
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


# -- pages -------------------------------------------------------------------
async def overview_page(request: web.Request) -> web.Response:
    state = _state(request)
    lot, _ = state.parts()
    data = await _overview_data(state)
    now = utcnow()
    charts = {}
    for queue, parking in data["parking"].items():
        if data["counts"].get(parking):
            try:
                page = await lot.page(parking, where=ParkedFilter(), limit=0)
            except ConfigurationError:
                continue
            charts[queue] = histogram(page.arrivals, now=now)
        else:
            charts[queue] = histogram([], now=now)
    return _render(
        request,
        "overview.html",
        parking=data["parking"],
        counts=data["counts"],
        charts=charts,
        level_rows=_level_rows(state, data["counts"]),
        unroutable=state.settings.topology.unroutable_queue,
        total_waiting=sum(c or 0 for n, c in data["counts"].items() if n in data["levels"]),
        audit=[e for e in reversed(state.audit.recent) if e.get("event") == "finished"][:10],
    )


async def queue_page(request: web.Request) -> web.Response:
    state = _state(request)
    lot, jobs = state.parts()
    queue = state.known(request.query.get("queue"))
    try:
        where = _filter_from(request.query)
        offset = _int(request.query, "offset", 0, high=10_000_000)
        page = await lot.page(
            state.parking_queue(queue), where=where, offset=offset, limit=state.settings.page_size
        )
    except DelayedRetryError as exc:
        return _render(request, "error.html", status=400, error=str(exc), queue=queue)
    parked = (await lot.counts([state.parking_queue(queue)]))[state.parking_queue(queue)]
    recent = [j for j in jobs.jobs.values() if j.request.queue == queue][-5:]
    return _render(
        request,
        "queue.html",
        queue=queue,
        parking_queue=state.parking_queue(queue),
        page=page,
        parked=parked,
        where=filter_to_mapping(where),
        base={k: v for k, v in filter_to_mapping(where).items() if k != "group"},
        filters=filter_to_mapping(where),
        jobs=list(reversed(recent)),
        now=utcnow(),
        prev_offset=max(offset - page.limit, 0) if offset > 0 else None,
        next_offset=offset + page.limit if offset + page.limit < page.matching else None,
        is_unroutable=queue == state.settings.topology.unroutable_queue,
        page_rate=PAGE_RATE,
        page_canary=PAGE_CANARY,
    )


async def message_page(request: web.Request) -> web.Response:
    state = _state(request)
    lot, _ = state.parts()
    queue = state.known(request.query.get("queue"))
    key = request.query.get("key", "")
    record = await lot.find(state.parking_queue(queue), key) if key else None
    if record is None:
        return _render(
            request,
            "error.html",
            status=404,
            error=f"no parked message {key!r} in {state.parking_queue(queue)!r} (replayed or "
            "purged meanwhile?)",
            queue=queue,
        )
    h = record.headers
    history = [
        ("attempts", str(record.attempts)),
        ("first failure", record.first_failure_at),
        ("last failure", read_epoch_ms(h.get(X_LAST_FAILURE_AT))),
        ("last error", h.get(X_LAST_ERROR)),
        ("replayed before", record.replays),
        ("last replayed", read_epoch_ms(h.get(X_REPLAYED_AT))),
        ("replayed by", h.get(X_REPLAYED_BY)),
        ("original exchange", record.original_exchange),
        ("original routing key", record.original_routing_key),
    ]
    deaths = h.get(X_DEATH)
    own, counters = split_read_counters(h)
    return _render(
        request,
        "message.html",
        queue=queue,
        record=record,
        body=view_body(record.body, content_type=record.content_type),
        headers=header_rows(own),
        read_counts=[(name, value, BROKER_READ_COUNTERS[name]) for name, value in counters.items()],
        history=history,
        deaths=deaths if isinstance(deaths, list) else [],
    )


async def job_fragment(request: web.Request) -> web.Response:
    _, jobs = _state(request).parts()
    job = jobs.jobs.get(request.match_info["id"])
    if job is None:
        raise web.HTTPNotFound(text="no such job\n")
    return _render(request, "_job.html", job=job)


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``counts`` every few seconds until the client goes."""
    state = _state(request)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    await response.prepare(request)
    try:
        while not state.stopping.is_set():
            data = await _overview_data(state)
            payload = json.dumps({"counts": data["counts"], "at": utcnow().isoformat()})
            await response.write(f"event: counts\ndata: {payload}\n\n".encode())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.stopping.wait(), state.settings.live_interval)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return response


async def action_form(request: web.Request) -> web.Response:
    """The page's replay/purge form: builds the same request as the API, then a job.

    A replay button only proposes: the answer is a confirmation naming how
    many messages go where, with the canary and the pace; its own button
    (``op=confirm-replay``) starts the job on exactly that set.
    """
    state = _state(request)
    _, jobs = state.parts()
    form = await request.post()
    user = request[USER]
    op = form_field(form, "op")
    try:
        if op == "confirm-replay":
            plan = state.plans.take(form_field(form, "plan"), user=user)
            state.known(plan.request.queue)
            job = jobs.launch(
                plan.request, list(plan.keys), user=user, parking_queue=plan.parking_queue
            )
            return _render(request, "_job.html", status=202, job=job, clear_confirm=True)
        if op == "cancel-replay":
            state.plans.drop(form_field(form, "plan"), user=user)
            return _confirm_box(request, None)
        job_request = request_from_form(form, known=state.known)
        if job_request.action == "replay":
            return _confirm_box(request, await _plan(state, jobs, job_request, user=user))
        job = await _start(state, jobs, job_request, user=user)
    except DelayedRetryError as exc:
        return _render(request, "_notice.html", status=400, error=str(exc))
    return _render(request, "_job.html", status=202, job=job, clear_confirm=False)


def _confirm_box(request: web.Request, plan: ReplayPlan | None) -> web.Response:
    response = _render(request, "_confirm.html", plan=plan)
    # The page's forms target the job list; a proposal replaces the confirmation box instead.
    response.headers["HX-Retarget"] = "#confirm"
    response.headers["HX-Reswap"] = "outerHTML"
    return response


async def _plan(state: WebState, jobs: JobManager, request: JobRequest, *, user: str) -> ReplayPlan:
    """The replay the confirmation proposes: the selection now and the canary it would have."""
    _check_target(state, request)
    parking = state.parking_queue(request.queue)
    selection = await jobs.select(request, parking_queue=parking)
    first = selection.first[: request.canary]
    wait = (
        CanaryWait.choose([retry_span(r) for r in first], given=request.canary_wait)
        if first
        else None
    )
    plan = ReplayPlan(
        id=PlanBook.new_id(),
        request=request,
        user=user,
        parking_queue=parking,
        target=request.to_queue or request.queue,
        keys=tuple(selection.ids),
        canary_ids=tuple(r.id for r in first),
        canary_wait=wait,
    )
    if plan.keys:
        state.plans.add(plan)
    return plan


def _check_target(state: WebState, request: JobRequest) -> None:
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


async def _start(state: WebState, jobs: JobManager, request: JobRequest, *, user: str) -> Job:
    _check_target(state, request)
    return await jobs.submit(request, user=user, parking_queue=state.parking_queue(request.queue))


# -- JSON API ----------------------------------------------------------------
async def api_queues(request: web.Request) -> web.Response:
    state = _state(request)
    data = await _overview_data(state)
    counts = data["counts"]
    return web.json_response(
        {
            "queues": [
                {"queue": q, "parking_queue": p, "parked": counts.get(p)}
                for q, p in data["parking"].items()
            ],
            "levels": _level_rows(state, counts),
            "unroutable": counts.get(state.settings.topology.unroutable_queue),
        }
    )


async def api_parked(request: web.Request) -> web.Response:
    state = _state(request)
    lot, _ = state.parts()
    queue = state.known(request.query.get("queue"))
    try:
        where = _filter_from(request.query)
        offset = _int(request.query, "offset", 0, high=10_000_000)
        limit = _int(request.query, "limit", state.settings.page_size, high=500)
        page = await lot.page(state.parking_queue(queue), where=where, offset=offset, limit=limit)
    except DelayedRetryError as exc:
        raise _bad_request(exc) from exc
    return web.json_response(
        {
            "queue": queue,
            "items": [
                _record_json(r, body_size=size)
                for r, size in zip(page.items, page.body_sizes, strict=True)
            ],
            "offset": page.offset,
            "limit": page.limit,
            "matching": page.matching,
            "truncated": page.truncated,
            "groups": [
                {
                    "group": g.group,
                    "label": g.label,
                    "shown_label": g.shown()[0],
                    "shown_note": g.shown()[1],
                    "exception_type": g.exception_type,
                    "count": g.count,
                    "first_seen": g.first_seen.isoformat() if g.first_seen else None,
                    "last_seen": g.last_seen.isoformat() if g.last_seen else None,
                }
                for g in page.groups
            ],
        }
    )


async def api_message(request: web.Request) -> web.Response:
    state = _state(request)
    lot, _ = state.parts()
    queue = state.known(request.query.get("queue"))
    key = request.query.get("key", "")
    record = await lot.find(state.parking_queue(queue), key) if key else None
    if record is None:
        raise web.HTTPNotFound(
            text=json.dumps({"error": f"no parked message {key!r} in queue {queue!r}"}),
            content_type="application/json",
        )
    body = view_body(record.body, content_type=record.content_type)
    return web.json_response(
        {
            **_record_json(record),
            "headers": dict(header_rows(split_read_counters(record.headers)[0])),
            "broker_read_counters": split_read_counters(record.headers)[1],
            "body": {"kind": body.kind, "text": body.text, "size": body.size, "shown": body.shown},
            "traceback": record.traceback,
        }
    )


async def _api_action(request: web.Request, action: Action) -> web.Response:
    state = _state(request)
    _, jobs = state.parts()
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad_request(ValueError(f"the body is not JSON: {exc}")) from exc
    try:
        job_request = JobRequest.from_json(action, data)
        job = await _start(state, jobs, job_request, user=request[USER])
    except DelayedRetryError as exc:
        raise _bad_request(exc) from exc
    status_url = str(request.app.router["api-job"].url_for(id=job.id))
    return web.json_response({"job": job.as_json(), "status_url": status_url}, status=202)


async def api_replay(request: web.Request) -> web.Response:
    return await _api_action(request, "replay")


async def api_purge(request: web.Request) -> web.Response:
    return await _api_action(request, "purge")


async def api_job(request: web.Request) -> web.Response:
    _, jobs = _state(request).parts()
    job = jobs.jobs.get(request.match_info["id"])
    if job is None:
        raise web.HTTPNotFound(
            text=json.dumps({"error": "no such job"}), content_type="application/json"
        )
    return web.json_response(job.as_json())


async def api_audit(request: web.Request) -> web.Response:
    return web.json_response({"items": list(reversed(_state(request).audit.recent))}, dumps=_dumps)


def _dumps(value: Any) -> str:
    return json.dumps(value, default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v))
