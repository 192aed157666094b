"""Muted failure groups: what a mute is, and the table every alerts process builds. Pure.

An operator mutes a failure group (a parking fingerprint's key, as ``parking list``
shows it) for a while: its arrivals are still counted, not alerted. Mutes are records
in a stream on the broker (:mod:`delayed_retry.alerts.mute_store`); each alerts process
reads them all, in order, into a :class:`MuteTable`, so every process honours the same
mutes and a restart loses none. A later record for a group replaces an earlier one; an
unmute is a record whose ``until`` is its own time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from delayed_retry.durations import from_epoch_ms, to_epoch_ms
from delayed_retry.errors import ConfigurationError

__all__ = ["LONGEST_MUTE", "Mute", "MuteTable", "decode_mute", "encode_mute"]

LONGEST_MUTE = timedelta(days=365)
"""The longest a group can be muted for: a mute is a pause, not a filter."""


@dataclass(frozen=True, kw_only=True)
class Mute:
    """Group ``fingerprint`` muted from ``at`` until ``until`` by ``by``, with a ``reason``."""

    fingerprint: str
    at: datetime
    until: datetime
    reason: str = ""
    by: str | None = None

    def __post_init__(self) -> None:
        if not self.fingerprint.strip():
            raise ConfigurationError("a mute needs the failure group's key ('parking list' group)")
        if self.until < self.at:
            raise ConfigurationError(f"mute of group {self.fingerprint!r} ends before it starts")
        if self.until - self.at > LONGEST_MUTE:
            raise ConfigurationError(
                f"mute of group {self.fingerprint!r} is longer than {LONGEST_MUTE.days} days; "
                "fix the failure or purge its messages instead"
            )

    def active(self, now: datetime) -> bool:
        """Whether the group is muted at ``now``."""
        return self.at <= now < self.until

    def lifted(self, *, at: datetime, by: str | None = None) -> Mute:
        """The record that ends this mute at ``at``, never dated before the mute itself: with
        the hosts' clocks apart, an earlier lift would lose to the mute it ends."""
        at = max(at, self.at)
        return replace(self, at=at, until=at, by=by, reason="unmuted")


def encode_mute(mute: Mute) -> bytes:
    """``mute`` as the JSON body of its record in the mutes stream."""
    return json.dumps(
        {
            "fingerprint": mute.fingerprint,
            "at": to_epoch_ms(mute.at),
            "until": to_epoch_ms(mute.until),
            "reason": mute.reason,
            "by": mute.by,
        },
        separators=(",", ":"),
    ).encode()


def decode_mute(body: bytes) -> Mute | None:
    """The mute a record's body holds; ``None`` for a body that is not one (skipped, not fatal)."""
    try:
        data = json.loads(body)
        return Mute(
            fingerprint=str(data["fingerprint"]),
            at=from_epoch_ms(int(data["at"])),
            until=from_epoch_ms(int(data["until"])),
            reason=str(data.get("reason") or ""),
            by=None if data.get("by") is None else str(data["by"]),
        )
    except (ValueError, KeyError, TypeError, ConfigurationError):
        return None


class MuteTable:
    """The latest mute of each group, from the records read so far, and what each muted.

    Use :meth:`apply` for each record in stream order, :meth:`muting` to ask whether an
    arrival is muted (it counts the arrival when it is).
    """

    def __init__(self, mutes: Iterable[Mute] = ()) -> None:
        self._latest: dict[str, Mute] = {}
        self.muted_arrivals: dict[str, int] = {}
        """Arrivals not alerted on, per group, since this table was made."""
        for mute in mutes:
            self.apply(mute)

    def apply(self, mute: Mute) -> None:
        """Take a record: it replaces an older one of its group (by ``at``), never a newer one."""
        known = self._latest.get(mute.fingerprint)
        if known is None or known.at <= mute.at:
            self._latest[mute.fingerprint] = mute

    def active(self, now: datetime) -> list[Mute]:
        """The mutes in force at ``now``, the soonest to end first."""
        return sorted((m for m in self._latest.values() if m.active(now)), key=lambda m: m.until)

    def get(self, fingerprint: str, now: datetime) -> Mute | None:
        """The mute in force for ``fingerprint`` at ``now``, if any."""
        mute = self._latest.get(fingerprint)
        return mute if mute is not None and mute.active(now) else None

    def muting(self, fingerprint: str, now: datetime) -> Mute | None:
        """Like :meth:`get`, and count the arrival as muted when the group is muted."""
        mute = self.get(fingerprint, now)
        if mute is not None:
            self.muted_arrivals[fingerprint] = self.muted_arrivals.get(fingerprint, 0) + 1
        return mute
