"""The web view's HTML pages: overview, a queue's parked messages, one message (with its
edit form), the live counts (server-sent events) and the replay/purge form with its
confirmation.

The JSON API in :mod:`delayed_retry.web.api` serves the same reads to scripts; both go
through :mod:`delayed_retry.web.state`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from aiohttp import web

from delayed_retry.durations import utcnow
from delayed_retry.errors import ConfigurationError, DelayedRetryError
from delayed_retry.headers.names import (
    BROKER_READ_COUNTERS,
    X_DEATH,
    X_LAST_ERROR,
    X_LAST_FAILURE_AT,
    X_REPLAYED_AT,
    X_REPLAYED_BY,
    split_read_counters,
)
from delayed_retry.headers.retry_state import read_epoch_ms
from delayed_retry.parking.lot import CanaryWait, ParkedFilter
from delayed_retry.parking.moving.canary_rules import retry_span
from delayed_retry.web.editing import EDIT_OPS, edit_fields, edit_from_form
from delayed_retry.web.expediting import EXPEDITE_OPS, expedite_from_form
from delayed_retry.web.forms import PAGE_CANARY, PAGE_RATE, form_field, request_from_form
from delayed_retry.web.jobs import JobManager, JobRequest
from delayed_retry.web.muting import MUTE_OPS, mute_from_form, muted_groups
from delayed_retry.web.plans import PlanBook, ReplayPlan
from delayed_retry.web.records import filter_to_mapping
from delayed_retry.web.render import header_rows, histogram, view_body
from delayed_retry.web.security import USER
from delayed_retry.web.state import (
    WebState,
    chain_leaders,
    check_target,
    level_rows,
    overview_data,
    start_job,
    state_of,
)

__all__ = [
    "action_form",
    "events",
    "job_fragment",
    "message_page",
    "overview_page",
    "queue_page",
]

routes = web.RouteTableDef()
"""The pages' routes (GET answers HEAD too), added by ``create_app``."""


def _url(request: web.Request, name: str, **query: Any) -> str:
    clean = {k: str(v) for k, v in query.items() if v is not None and v != ""}
    if name == "static":
        return str(request.app.router["static"].url_for(filename=clean.pop("filename")))
    if name == "job":
        return str(request.app.router["job"].url_for(id=clean.pop("id")))
    return str(request.app.router[name].url_for().with_query(clean))


def _render(request: web.Request, template: str, status: int = 200, **context: Any) -> web.Response:
    state = state_of(request)
    html = state.templates.get_template(template).render(
        url=lambda name, **q: _url(request, name, **q),
        settings=state.settings,
        queues=state.queues,
        user=request.get(USER),
        **context,
    )
    return web.Response(text=html, status=status, content_type="text/html", charset="utf-8")


@routes.get("/", name="overview")
async def overview_page(request: web.Request) -> web.Response:
    state = state_of(request)
    lot, _ = state.parts()
    data = await overview_data(state)
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
        level_rows=level_rows(state, data["counts"]),
        leaders=await chain_leaders(state),
        unroutable=state.settings.topology.unroutable_queue,
        total_waiting=sum(c or 0 for n, c in data["counts"].items() if n in data["levels"]),
        audit=[e for e in reversed(state.audit.recent) if e.get("event") == "finished"][:10],
    )


@routes.get("/parked", name="queue")
async def queue_page(request: web.Request) -> web.Response:
    state = state_of(request)
    lot, jobs = state.parts()
    queue = state.known(request.query.get("queue"))
    try:
        where, page = await state.parked_page(lot, queue, request.query)
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
        prev_offset=max(page.offset - page.limit, 0) if page.offset > 0 else None,
        next_offset=page.offset + page.limit if page.offset + page.limit < page.matching else None,
        is_unroutable=queue == state.settings.topology.unroutable_queue,
        page_rate=PAGE_RATE,
        page_canary=PAGE_CANARY,
        muted=muted_groups(state),
    )


@routes.get("/message", name="message")
async def message_page(request: web.Request) -> web.Response:
    state = state_of(request)
    queue, key, record = await state.requested_record(request.query)
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
        edit=edit_fields(record),
    )


@routes.get("/jobs/{id}", name="job")
async def job_fragment(request: web.Request) -> web.Response:
    _, jobs = state_of(request).parts()
    job = jobs.jobs.get(request.match_info["id"])
    if job is None:
        raise web.HTTPNotFound(text="no such job\n")
    return _render(request, "_job.html", job=job)


@routes.get("/events", name="events")
async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: ``counts`` every few seconds until the client goes."""
    state = state_of(request)
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    await response.prepare(request)
    try:
        while not state.stopping.is_set():
            data = await overview_data(state)
            payload = json.dumps({"counts": data["counts"], "at": utcnow().isoformat()})
            await response.write(f"event: counts\ndata: {payload}\n\n".encode())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(state.stopping.wait(), state.settings.live_interval)
    except (ConnectionResetError, asyncio.CancelledError):
        pass
    return response


@routes.post("/actions", name="actions")
async def action_form(request: web.Request) -> web.Response:
    """The page's replay/purge form: builds the same request as the API, then a job.

    A replay button only proposes: the answer is a confirmation naming how
    many messages go where, with the canary and the pace; its own button
    (``op=confirm-replay``) starts the job on exactly that set.
    """
    state = state_of(request)
    _, jobs = state.parts()
    form = await request.post()
    user = request[USER]
    op = form_field(form, "op")
    try:
        if op in EXPEDITE_OPS:
            report, confirmed = await expedite_from_form(state, form, user=user)
            queue = form_field(form, "queue")
            response = _render(
                request, "_expedite.html", report=report, confirmed=confirmed, queue=queue
            )
            response.headers["HX-Retarget"] = "#confirm"
            response.headers["HX-Reswap"] = "outerHTML"
            return response
        if op in MUTE_OPS:
            done = await mute_from_form(state, form, user=user)
            response = _render(request, "_notice.html", notice=done, error=None)
            response.headers["HX-Refresh"] = "true"  # the group rows show the change
            return response
        if op in EDIT_OPS:
            outcome = await edit_from_form(state, form, user=user)
            queue = form_field(form, "queue")
            return _render(request, "_edit.html", outcome=outcome, error=None, queue=queue)
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
        job = await start_job(state, jobs, job_request, user=user)
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
    check_target(state, request)
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
