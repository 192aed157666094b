"""The page's mute and lift buttons on a failure group: the web half of ``delayed-retry mute``.

The mutes themselves live on the broker (:mod:`delayed_retry.alerts.mute_store`); the view
follows them to show which groups are muted, and records each change in the audit log.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from multidict import MultiDictProxy

from delayed_retry.alerts.mute_store import MuteFollower, record_mute
from delayed_retry.alerts.mutes import Mute
from delayed_retry.durations import parse_duration, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.web.forms import form_field
from delayed_retry.web.state import WebState

__all__ = ["MUTE_OPS", "follow_mutes", "muted_groups", "mute_from_form"]

log = logging.getLogger(__name__)

MUTE_OPS = ("mute-group", "lift-mute")
"""The form's ``op`` values this module answers."""

DEFAULT_MUTE = "2h"
"""What the page offers to mute a group for."""


async def follow_mutes(state: WebState) -> MuteFollower | None:
    """Follow the mutes stream for the pages; ``None`` (and a warning) when it cannot be read."""
    assert state.connection is not None
    follower = MuteFollower(state.connection, topology=state.settings.topology)
    try:
        await follower.start()
    except Exception as exc:  # the view works without them (a refused stream, a broker away)
        log.warning("muted failure groups are not shown: %s", exc)
        return None
    return follower


def muted_groups(state: WebState) -> dict[str, Mute]:
    """The groups muted now, by group key (empty when the mutes are not followed)."""
    if state.mutes is None:
        return {}
    return {m.fingerprint: m for m in state.mutes.table.active(utcnow())}


async def mute_from_form(state: WebState, form: MultiDictProxy[Any], *, user: str) -> str:
    """Mute or lift the mute of the form's group; what was done, in words."""
    if state.settings.read_only:
        raise ConfigurationError("this view is read-only: muting is refused")
    if state.mutes is None or state.connection is None:
        raise ConfigurationError("mutes cannot be read on this broker; see the view's log")
    state.known(form_field(form, "queue"))
    group = form_field(form, "group")
    topology = state.settings.topology
    now = utcnow()
    if form_field(form, "op") == "lift-mute":
        known = state.mutes.table.get(group, now)
        if known is None:
            return f"group {group} is not muted"
        lift = known.lifted(at=now, by=user)
        await record_mute(state.connection, lift, topology=topology)
        state.mutes.table.apply(lift)
        state.audit.write({"event": "mute-lifted", "user": user, "group": group})
        return f"lifted the mute of group {group}: its arrivals are alerted again"
    seconds = parse_duration(form_field(form, "mute_for") or DEFAULT_MUTE, name="mute for")
    mute = Mute(
        fingerprint=group,
        at=now,
        until=now + timedelta(seconds=seconds),
        reason=form_field(form, "reason"),
        by=user,
    )
    await record_mute(state.connection, mute, topology=topology)
    state.mutes.table.apply(mute)  # shown at once, before the stream brings it back
    state.audit.write(
        {"event": "muted", "user": user, "group": group, "until": mute.until.isoformat()}
    )
    return f"muted group {group} until {mute.until:%Y-%m-%d %H:%M} UTC: counted, not alerted"
