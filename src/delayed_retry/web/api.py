"""The web view's JSON API (``/api/...``): the same reads and actions as the pages, for
scripts and other tools.

Actions answer 202 with the job and the URL to follow it; bad input answers 400 with
``{"error": ...}`` naming the field.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from aiohttp import web

from delayed_retry.errors import DelayedRetryError
from delayed_retry.headers.names import split_read_counters
from delayed_retry.parking.lot import ParkedRecord
from delayed_retry.web.jobs import Action, JobRequest
from delayed_retry.web.records import group_label
from delayed_retry.web.render import header_rows, view_body
from delayed_retry.web.security import USER
from delayed_retry.web.state import level_rows, overview_data, start_job, state_of

__all__ = [
    "api_audit",
    "api_job",
    "api_message",
    "api_parked",
    "api_purge",
    "api_queues",
    "api_replay",
]

routes = web.RouteTableDef()
"""The JSON API's routes (GET answers HEAD too), added by ``create_app``."""


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


@routes.get("/api/queues", name="api-queues")
async def api_queues(request: web.Request) -> web.Response:
    state = state_of(request)
    data = await overview_data(state)
    counts = data["counts"]
    return web.json_response(
        {
            "queues": [
                {"queue": q, "parking_queue": p, "parked": counts.get(p)}
                for q, p in data["parking"].items()
            ],
            "levels": level_rows(state, counts),
            "unroutable": counts.get(state.settings.topology.unroutable_queue),
        }
    )


@routes.get("/api/parked", name="api-parked")
async def api_parked(request: web.Request) -> web.Response:
    state = state_of(request)
    lot, _ = state.parts()
    queue = state.known(request.query.get("queue"))
    try:
        _, page = await state.parked_page(lot, queue, request.query, max_limit=500)
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


@routes.get("/api/message", name="api-message")
async def api_message(request: web.Request) -> web.Response:
    queue, key, record = await state_of(request).requested_record(request.query)
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
    state = state_of(request)
    _, jobs = state.parts()
    try:
        data = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _bad_request(ValueError(f"the body is not JSON: {exc}")) from exc
    try:
        job_request = JobRequest.from_json(action, data)
        job = await start_job(state, jobs, job_request, user=request[USER])
    except DelayedRetryError as exc:
        raise _bad_request(exc) from exc
    status_url = str(request.app.router["api-job"].url_for(id=job.id))
    return web.json_response({"job": job.as_json(), "status_url": status_url}, status=202)


@routes.post("/api/parked/replay", name="api-replay")
async def api_replay(request: web.Request) -> web.Response:
    return await _api_action(request, "replay")


@routes.post("/api/parked/purge", name="api-purge")
async def api_purge(request: web.Request) -> web.Response:
    return await _api_action(request, "purge")


@routes.get("/api/jobs/{id}", name="api-job")
async def api_job(request: web.Request) -> web.Response:
    _, jobs = state_of(request).parts()
    job = jobs.jobs.get(request.match_info["id"])
    if job is None:
        raise web.HTTPNotFound(
            text=json.dumps({"error": "no such job"}), content_type="application/json"
        )
    return web.json_response(job.as_json())


@routes.get("/api/audit", name="api-audit")
async def api_audit(request: web.Request) -> web.Response:
    return web.json_response(
        {"items": list(reversed(state_of(request).audit.recent))}, dumps=_dumps
    )


def _dumps(value: Any) -> str:
    return json.dumps(value, default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v))
