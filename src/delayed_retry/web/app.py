"""The aiohttp application: the web view assembled (routes, templates, the broker
connection and its lifetime).

Use :func:`create_app` to run the view alone (``delayed-retry web``) or to
mount it in an existing aiohttp application::

    parent.add_subapp("/retries/", create_app(WebSettings(queues=("orders",))))

It opens its own robust connection to ``settings.url`` unless given one. The pages are in
:mod:`delayed_retry.web.pages`, the JSON API in :mod:`delayed_retry.web.api`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import jinja2
from aio_pika.abc import AbstractConnection
from aiohttp import web

from delayed_retry.durations import format_duration, utcnow
from delayed_retry.web import api, pages
from delayed_retry.web.discovery import discover_queues
from delayed_retry.web.jobs import AuditLog, JobManager
from delayed_retry.web.lot import ParkingLot
from delayed_retry.web.muting import follow_mutes
from delayed_retry.web.records import group_label
from delayed_retry.web.render import format_age
from delayed_retry.web.security import security_middleware
from delayed_retry.web.settings import WebSettings
from delayed_retry.web.state import STATE, WebState

__all__ = ["STATE", "WebState", "create_app"]

log = logging.getLogger(__name__)

_HERE = Path(__file__).parent


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
    app.add_routes(pages.routes)
    app.add_routes(api.routes)
    app.router.add_static("/static/", _HERE / "static", name="static", append_version=True)
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
    state.mutes = await follow_mutes(state)
    try:
        yield
    finally:
        if state.mutes is not None:
            await state.mutes.stop()
        await state.jobs.wait_all()
        await state.lot.close()
        if own:
            await state.connection.close()


async def _on_shutdown(app: web.Application) -> None:
    app[STATE].stopping.set()
