"""The page's action form, read into the request the JSON API takes, with safe defaults.

The page acts through the same :class:`~delayed_retry.web.jobs.JobRequest`
as a script, but a person's click gets the careful choices unless they make
others: a replay goes with a canary and at a pace (see
:mod:`delayed_retry.web.plans` for the confirmation it needs first).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from multidict import MultiDictProxy

from delayed_retry.durations import parse_duration
from delayed_retry.errors import ConfigurationError
from delayed_retry.web.jobs import Action, JobRequest
from delayed_retry.web.records import FILTER_FIELDS

__all__ = ["PAGE_CANARY", "PAGE_RATE", "form_field", "request_from_form"]


def form_field(form: MultiDictProxy[Any], name: str) -> str:
    """A form field as text, stripped (empty when missing or a file)."""
    value = form.get(name, "")
    return value.strip() if isinstance(value, str) else ""


PAGE_RATE = 50.0
"""The page's pace for a replay unless "all at once" is ticked (messages per second)."""
PAGE_CANARY = 1
"""The page's canary unless another number (0 for none) is typed."""


def request_from_form(form: MultiDictProxy[Any], *, known: Callable[[str], str]) -> JobRequest:
    """The :class:`JobRequest` the page's form asks for; ``known`` checks the queue is served.

    A replay gets the page's safe choices unless the form makes others: a
    canary of :data:`PAGE_CANARY` (``0`` typed for none) and
    :data:`PAGE_RATE` messages per second (``all_at_once`` ticked for none).
    A purge needs the queue's name typed in ``confirm``.
    """
    op, _, scope = form_field(form, "op").partition("-")
    if op not in ("replay", "purge"):
        raise ConfigurationError("choose replay or purge")
    action: Action = "replay" if op == "replay" else "purge"
    queue = known(form_field(form, "queue"))
    body: dict[str, Any] = {"queue": queue}
    if scope in ("one", "selection"):
        ids = [v for v in form.getall("message_ids", []) if isinstance(v, str) and v]
        if not ids:
            raise ConfigurationError("select at least one message first")
        body["message_ids"] = ids
    elif scope == "group":
        body["filter"] = {"group": form_field(form, "group")}
    elif scope == "filter":
        body["filter"] = {k: form_field(form, k) for k in FILTER_FIELDS if form_field(form, k)}
    else:
        raise ConfigurationError(f"unknown scope {scope!r}; one, selection, group or filter")
    if action == "replay":
        # The safe choices unless the operator makes others: a canary, a pace.
        canary = form_field(form, "canary") or str(PAGE_CANARY)
        body["canary"] = int(canary) if canary.isdigit() else canary
        if form_field(form, "all_at_once"):
            body["rate"] = None
        else:
            body["rate"] = form_field(form, "rate") or PAGE_RATE
        for name in ("canary_wait", "to_queue"):
            if form_field(form, name):
                body[name] = form_field(form, name)
        if "canary_wait" in body:
            body["canary_wait"] = parse_duration(body["canary_wait"], name="canary wait")
    elif form_field(form, "confirm") != queue:
        raise ConfigurationError(
            f"purge not started: type the queue name {queue!r} in the confirmation box"
        )
    return JobRequest.from_json(action, body)
