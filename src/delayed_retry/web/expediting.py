"""The queue page's "retry now": what waits in the chain for a queue, delivered at once.

The web half of ``delayed-retry topology expedite --queue Q``
(:func:`~delayed_retry.admin.chain_discard.expedite_waiting`): the first click counts what
waits (a dry run) and asks; the second delivers at most that count, and the audit log
records who did it.
"""

from __future__ import annotations

from typing import Any

from multidict import MultiDictProxy

from delayed_retry.admin.chain_discard import DiscardReport, expedite_waiting
from delayed_retry.errors import ConfigurationError
from delayed_retry.web.forms import form_field
from delayed_retry.web.state import WebState

__all__ = ["EXPEDITE_OPS", "expedite_from_form"]

EXPEDITE_OPS = ("expedite-queue", "confirm-expedite")
"""The form's ``op`` values this module answers."""


async def expedite_from_form(
    state: WebState, form: MultiDictProxy[Any], *, user: str
) -> tuple[DiscardReport, bool]:
    """Count (first click) or deliver (confirmation) what waits for the form's queue.

    Returns the report and whether it was the confirmation (something was delivered).
    """
    if state.settings.read_only:
        raise ConfigurationError("this view is read-only: delivering waiting messages is refused")
    if state.connection is None:
        raise ConfigurationError("not connected to the broker yet")
    queue = state.known(form_field(form, "queue"))
    confirmed = form_field(form, "op") == "confirm-expedite"
    limit = form_field(form, "limit")
    if confirmed and not limit.isdigit():
        raise ConfigurationError("confirm a count first: press 'Deliver now' again")
    channel = await state.connection.channel()
    try:
        report = await expedite_waiting(
            channel,
            queue=queue,
            dry_run=not confirmed,
            limit=int(limit) if confirmed else None,
            topology=state.settings.topology,
        )
    finally:
        await channel.close()
    if confirmed:
        state.audit.write({"event": "expedited", "user": user, "queue": queue, "done": report.done})
    return report, confirmed
