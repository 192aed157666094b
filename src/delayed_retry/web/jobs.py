"""Replay and purge as background jobs with progress, a canary, and an audit log.

A job acts on the set of messages as it was when it was selected: a filter is
resolved to message keys first, and only those keys are acted on, each at
most once, even if more messages matching the filter park meanwhile. Every
job is written to the audit log twice: when accepted and when finished.

A replay with a canary is ``finished`` only once its canaries were watched to
the end (see :func:`~delayed_retry.parking.lot.replay_matching`): while they
can still park again it is ``confirming``, never green; a canary that parks
again makes it ``stopped`` (before the rest, which stays parked) or
``parked-again`` (after the rest was replayed).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from delayed_retry.durations import format_duration, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.parking.lot import CanaryNews, CanaryWait, MoveProgress, ParkedFilter
from delayed_retry.parking.moving.report import (
    CANARY_CONFIRMED,
    CANARY_PARKED_AFTER_THE_REST,
    CANARY_PARKED_AGAIN,
)
from delayed_retry.web.lot import ParkingLot, Selection
from delayed_retry.web.records import filter_from_mapping, filter_to_mapping

__all__ = ["Action", "AuditLog", "Job", "JobManager", "JobRequest"]

log = logging.getLogger(__name__)
audit_log = logging.getLogger("delayed_retry.web.audit")

Action = Literal["replay", "purge"]
MAX_RATE = 10_000.0
MAX_CANARY = 100
MAX_CANARY_WAIT = 86_400.0


@dataclass(frozen=True, kw_only=True)
class JobRequest:
    """What to do: an action on a queue's parked messages, chosen by keys or by a filter."""

    action: Action
    queue: str
    message_ids: tuple[str, ...] | None = None
    where: ParkedFilter | None = None
    rate: float | None = None
    canary: int = 0
    canary_wait: float | None = None
    """Seconds; ``None``: derived from the canaries' parking records."""
    to_queue: str | None = None

    @classmethod
    def from_json(cls, action: Action, data: Any) -> JobRequest:
        """Parse an API body: ``{"queue": Q, "message_ids": [...]}`` or ``{"queue": Q,
        "filter": {...}}``, with optional ``rate``, ``canary``, ``canary_wait``, ``to_queue``."""
        if not isinstance(data, Mapping):
            raise ConfigurationError('the body must be a JSON object like {"queue": "orders", ...}')
        known = {"queue", "message_ids", "filter", "rate", "canary", "canary_wait", "to_queue"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigurationError(
                f"unknown field {', '.join(unknown)}; use {', '.join(sorted(known))}"
            )
        queue = data.get("queue")
        if not isinstance(queue, str) or not queue:
            raise ConfigurationError('"queue" must name the work queue, for example "orders"')
        ids = data.get("message_ids")
        raw_filter = data.get("filter")
        if (ids is None) == (raw_filter is None):
            raise ConfigurationError(
                'pass exactly one of "message_ids" (a list) or "filter" (an object)'
            )
        if ids is not None and (
            not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids)
        ):
            raise ConfigurationError('"message_ids" must be a non-empty list of message ids')
        if raw_filter is not None and not isinstance(raw_filter, Mapping):
            raise ConfigurationError('"filter" must be an object such as {"exception": "Timeout"}')
        rate = _number(data.get("rate"), "rate", low=0.01, high=MAX_RATE)
        canary = _number(data.get("canary", 0), "canary", low=0, high=MAX_CANARY)
        wait = _number(data.get("canary_wait"), "canary_wait", low=0, high=MAX_CANARY_WAIT)
        to_queue = data.get("to_queue")
        if to_queue is not None and (not isinstance(to_queue, str) or not to_queue):
            raise ConfigurationError('"to_queue" must be a queue name')
        return cls(
            action=action,
            queue=queue,
            message_ids=tuple(ids) if ids is not None else None,
            where=filter_from_mapping(raw_filter) if raw_filter is not None else None,
            rate=rate,
            canary=int(canary or 0),
            canary_wait=wait,
            to_queue=to_queue,
        )

    def describe(self) -> dict[str, Any]:
        """The request as the audit log records it."""
        return {
            "action": self.action,
            "queue": self.queue,
            "message_ids": list(self.message_ids) if self.message_ids is not None else None,
            "filter": filter_to_mapping(self.where) if self.where is not None else None,
            "rate": self.rate,
            "canary": self.canary,
            "canary_wait": self.canary_wait,
            "to_queue": self.to_queue,
        }


def _number(value: Any, name: str, *, low: float, high: float) -> float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigurationError(f'"{name}" must be a number between {low:g} and {high:g}')
    try:
        number = float(value)
    except ValueError:
        raise ConfigurationError(f'"{name}"={value!r} must be a number') from None
    if not low <= number <= high:
        raise ConfigurationError(f'"{name}"={number:g} must be between {low:g} and {high:g}')
    return number


@dataclass
class Job:
    """A running or finished action, as the page and ``GET /api/jobs/ID`` show it."""

    id: str
    request: JobRequest
    user: str
    started_at: datetime
    state: str = "selecting"
    total: int = 0
    done: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    finished_at: datetime | None = None
    note: str = ""
    warning: str = ""
    canary_ids: tuple[str, ...] = ()
    canary_wait: CanaryWait | None = None
    watch_until: datetime | None = None
    """When the canaries' current watch ends (states ``canary`` and ``confirming``)."""

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "action": self.request.action,
            "queue": self.request.queue,
            "user": self.user,
            "state": self.state,
            "total": self.total,
            "done": self.done,
            "failed": self.failed,
            "errors": self.errors[-5:],
            "note": self.note,
            "warning": self.warning,
            "canary_ids": list(self.canary_ids),
            "canary_wait": self.canary_wait.seconds if self.canary_wait else None,
            "canary_wait_derived": self.canary_wait.derived if self.canary_wait else None,
            "watch_until": self.watch_until.isoformat() if self.watch_until else None,
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat() if self.finished_at else None,
        }

    @property
    def finished(self) -> bool:
        """Whether nothing more will change (a ``confirming`` job is not finished)."""
        return self.state in FINAL_STATES

    def hear(self, news: CanaryNews) -> None:
        """Follow the canaries: the state and note say what they are doing now."""
        self.canary_ids = news.ids
        self.canary_wait = news.wait
        ids = ", ".join(news.ids)
        until = _clock(news.until)
        if news.phase == "watching":
            self.state = "canary"
            self.watch_until = news.until
            self.warning = news.wait.warning() or ""
            self.note = (
                f"canary {ids} replayed; the rest waits until {until} "
                f"(due plus {news.wait.describe()})"
            )
        elif news.phase == "passed":
            self.state = "running"
            self.watch_until = None
            self.note = f"canary {ids} did not park again; replaying the rest"
        elif news.phase == "confirming":
            self.state = "confirming"
            self.watch_until = news.until
            self.note = (
                f"all replayed; not confirmed yet: canary {ids} can still park again, "
                f"watched until {until}"
            )
        else:
            self.watch_until = None


FINAL_STATES = frozenset(("finished", "failed", "stopped", "parked-again"))
"""Job states after which nothing changes."""


def _clock(moment: datetime | None) -> str:
    return "?" if moment is None else f"{moment:%H:%M:%S} UTC"


class AuditLog:
    """Appends one JSON line per event to a file (if given) and logs it."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.recent: list[dict[str, Any]] = []

    def write(self, entry: dict[str, Any]) -> None:
        entry = {"at": utcnow().isoformat(), **entry}
        line = json.dumps(entry, sort_keys=True, default=str)
        audit_log.info("%s", line)
        self.recent.append(entry)
        del self.recent[:-200]
        if self.path is not None:
            with self.path.open("a", encoding="utf-8") as out:
                out.write(line + "\n")


class JobManager:
    """Runs jobs in the background and keeps the recent ones for the page."""

    def __init__(self, lot: ParkingLot, audit: AuditLog) -> None:
        self.lot = lot
        self.audit = audit
        self.jobs: dict[str, Job] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._counter = itertools.count(1)

    async def select(self, request: JobRequest, *, parking_queue: str) -> Selection:
        """The messages ``request`` means now, with the records of its would-be canaries."""
        where = request.where
        if request.message_ids is not None:
            where = ParkedFilter(ids=frozenset(request.message_ids))
        assert where is not None
        keep = request.canary if request.action == "replay" else 0
        return await self.lot.select(parking_queue, where=where, keep=keep)

    async def submit(self, request: JobRequest, *, user: str, parking_queue: str) -> Job:
        """Resolve the selection now (the set as it is at the call), then start the job."""
        if request.message_ids is not None:
            keys = list(dict.fromkeys(request.message_ids))
        else:
            keys = (await self.select(request, parking_queue=parking_queue)).ids
        return self.launch(request, keys, user=user, parking_queue=parking_queue)

    def launch(self, request: JobRequest, keys: list[str], *, user: str, parking_queue: str) -> Job:
        """Start the job on exactly ``keys`` (selected earlier) and write the audit line."""
        job = Job(
            id=f"{next(self._counter)}-{secrets.token_hex(3)}",
            request=request,
            user=user,
            started_at=utcnow(),
        )
        job.total = len(keys)
        job.state = "running"
        self.jobs[job.id] = job
        self.audit.write(
            {
                "event": "accepted",
                "job": job.id,
                "user": user,
                "count": job.total,
                **request.describe(),
            }
        )
        task = asyncio.create_task(self._run(job, keys, parking_queue), name=f"web-job-{job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return job

    async def _run(self, job: Job, keys: list[str], parking_queue: str) -> None:
        request = job.request

        def progress(step: MoveProgress) -> None:
            job.done = step.done

        try:
            if not keys:
                job.note = "nothing matched"
            elif request.action == "replay":
                if request.canary:
                    job.state = "canary"
                report = await self.lot.replay(
                    parking_queue,
                    ids=keys,
                    to_queue=request.to_queue or request.queue,
                    rate=request.rate,
                    canary=request.canary,
                    canary_wait=request.canary_wait,
                    canary_news=job.hear,
                    replayed_by=f"{job.user} (web)",
                    progress=progress,
                )
                job.done = report.done
                if _canary_verdict(job, report.canary_verdict):
                    return
            else:
                report = await self.lot.purge(
                    parking_queue, ids=keys, rate=request.rate, progress=progress
                )
                job.done = report.done
            missing = job.total - job.done
            if missing > 0:
                job.note = (job.note + "; " if job.note else "") + (
                    f"{missing} selected message(s) were no longer parked (replayed or "
                    "purged meanwhile)"
                )
            job.state = "finished"
        except Exception as exc:
            log.exception("job %s (%s on %r) failed", job.id, request.action, request.queue)
            job.state = "failed"
            job.errors.append(str(exc))
            job.note = f"stopped after {job.done}; the rest stays parked"
        finally:
            job.finished_at = utcnow()
            job.watch_until = None
            self.audit.write(
                {
                    "event": "finished",
                    "job": job.id,
                    "user": job.user,
                    "action": request.action,
                    "queue": request.queue,
                    "state": job.state,
                    "selected": job.total,
                    "done": job.done,
                    "failed": job.failed,
                    "note": job.note,
                }
            )

    async def wait_all(self) -> None:
        """Wait for every running job to end: at shutdown, before the connection it uses closes."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.wait_all()


def _canary_verdict(job: Job, verdict: str | None) -> bool:
    """Set the state a canary verdict calls for; ``True`` when it ended the job red."""
    ids = ", ".join(job.canary_ids)
    if verdict == CANARY_PARKED_AGAIN:
        job.state = "stopped"
        rest = job.total - job.done
        job.note = (
            f"canary {ids} parked again: the cause is not fixed"
            + (f"; the other {rest} were not touched" if rest > 0 else "")
            + ". Fix the cause, then replay again"
        )
        return True
    if verdict == CANARY_PARKED_AFTER_THE_REST:
        job.state = "parked-again"
        job.note = (
            f"canary {ids} parked again after the other {job.done - len(job.canary_ids)} were "
            "replayed: they are probably failing too; see the parking lot, fix the cause, "
            "then replay again"
        )
        return True
    if verdict == CANARY_CONFIRMED:
        wait = format_duration(job.canary_wait.seconds) if job.canary_wait else "?"
        job.note = (
            f"canary {ids} confirmed: it did not park again within {wait} of being due, nor "
            "while it was watched after the last message"
        )
    elif job.request.canary == 0:
        job.note = "no canary: nothing checked that the replayed messages were handled"
    return False
