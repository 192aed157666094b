"""Leaving the chain just before the due time, for a consumer that holds a message until due.

Each TTL hop of the chain adds a few milliseconds (about 2.5 ms on classic and
4 ms on quorum queues at p50, measured on an idle node), so a message that
waits in ``k`` level queues arrives a few ``k`` milliseconds late, and later
still when the broker is busy. With a :class:`Hold`, the chain lets the message
out a little before its due time (the *lead*: a base plus a share per hop) and
the consumer, a ``@with_delayed_retry`` handler, holds it in memory for the rest:
it is handled within about a millisecond of its due time and never before it.

The chain also skips its lowest levels (the *granularity*): a delay is rounded
down to a multiple of it and the consumer holds the difference. With 1 ms units
and a 32 ms granularity, a delay of 0.5–3 s makes about three hops instead of
six, and arrives within a few milliseconds of its due time at 100 messages a
second. (At 1,000 a second on two cores the chain falls behind either way: the
broker's topic routing through each level exchange, not the hops, is the limit;
see ``docs/performance.md``.)

Pure: :func:`chain_units` turns a due time into the units to publish with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from delayed_retry.durations import Duration, to_seconds
from delayed_retry.errors import ConfigurationError
from delayed_retry.topology import DelayTopology

__all__ = ["DEFAULT_HOLD", "Hold", "chain_units", "check_hold"]

_US = timedelta(microseconds=1)


def _micros(value: Duration, name: str) -> int:
    seconds = to_seconds(value, name=name)
    return round(seconds * 1_000_000)


@dataclass(frozen=True, kw_only=True)
class Hold:
    """How far ahead of its due time a message leaves the chain, and how its consumer holds it.

    Use the default (:data:`DEFAULT_HOLD`) unless a measurement says otherwise:
    ``@with_delayed_retry`` holds retries with it, and
    :func:`~delayed_retry.publish_delayed` takes ``hold=`` for messages whose
    queue a ``@with_delayed_retry`` handler consumes. Leave ``hold`` out for a
    queue any other consumer reads: only a holding consumer keeps the
    never-early promise for a message that leaves the chain early.

    Publisher side (the chain):
      lead: how long before the due time the message leaves the chain, plus
        ``lead_per_hop`` for each level queue it waits in. Raise them on a busy
        or clustered broker, where a hop takes longer.
      granularity: the chain skips the levels below it; the consumer holds the
        rest. Larger means fewer hops and longer holds.
    Consumer side:
      limit: the longest a consumer holds a message; one that came out earlier
        than that goes back into the chain for the rest of its wait.
      max_messages: how many messages one handler holds at once; past it, an
        early message goes back into the chain instead. Held messages are
        unacked deliveries, so they count against the channel's prefetch:
        keep prefetch above rate x (lead + lead_per_hop x hops + granularity).
    """

    lead: Duration = timedelta(milliseconds=10)
    lead_per_hop: Duration = timedelta(milliseconds=10)
    granularity: Duration = timedelta(milliseconds=32)
    limit: Duration = timedelta(milliseconds=500)
    max_messages: int = 1000
    lead_us: int = field(init=False, repr=False, compare=False)
    lead_per_hop_us: int = field(init=False, repr=False, compare=False)
    granularity_us: int = field(init=False, repr=False, compare=False)
    limit_us: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        values = {
            "lead_us": _micros(self.lead, "Hold lead"),
            "lead_per_hop_us": _micros(self.lead_per_hop, "Hold lead_per_hop"),
            "granularity_us": _micros(self.granularity, "Hold granularity"),
            "limit_us": _micros(self.limit, "Hold limit"),
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        if isinstance(self.max_messages, bool) or not isinstance(self.max_messages, int):
            raise ConfigurationError(f"Hold max_messages={self.max_messages!r} must be an int")
        if self.max_messages < 1:
            raise ConfigurationError(
                f"Hold max_messages={self.max_messages} must be at least 1; pass hold=None "
                "to turn holding off"
            )

    def longest_hold_us(self, topology: DelayTopology) -> int:
        """The longest a message routed with this hold can come out before its due time."""
        unit_us = topology.unit_ms * 1000
        # A coarse unit is rounded up (early by the lead at most); a fine one down to a step.
        step_us = 0 if self.granularity_us < unit_us else self._step_units(topology) * unit_us
        return self.lead_for(topology.levels) + step_us

    def check(self, topology: DelayTopology) -> None:
        """Raise :class:`ConfigurationError` if a message could come out earlier than ``limit``.

        Such a message would be sent back into the chain for the rest of its
        wait: extra hops, and late after all.
        """
        longest = self.longest_hold_us(topology)
        if longest > self.limit_us:
            raise ConfigurationError(
                f"Hold(limit={self.limit!r}) is shorter than the {longest / 1000:.0f} ms a "
                f"message can come out of the delay chain {topology.prefix!r} "
                f"({topology.levels} levels) before its due time with lead={self.lead!r}, "
                f"lead_per_hop={self.lead_per_hop!r} and granularity={self.granularity!r}; "
                "raise limit or lower the others"
            )

    def _step_units(self, topology: DelayTopology) -> int:
        """Units per step of the chain's delays: the largest power of two within granularity."""
        unit_us = topology.unit_ms * 1000
        if self.granularity_us < unit_us:
            return 1
        return 1 << ((self.granularity_us // unit_us).bit_length() - 1)

    def lead_for(self, hops: int) -> int:
        """The lead in microseconds for a message that waits in ``hops`` level queues."""
        return self.lead_us + self.lead_per_hop_us * hops


DEFAULT_HOLD = Hold()
"""Lead 10 ms + 10 ms per hop, granularity 32 ms, held at most 500 ms, 1,000 at a time."""


def check_hold(hold: object, topology: DelayTopology, *, name: str = "hold") -> None:
    """Refuse, when configuring, a ``hold`` that is not a :class:`Hold` or ``None``, or one
    whose limit cannot cover ``topology`` (see :meth:`Hold.check`)."""
    if hold is None:
        return
    if not isinstance(hold, Hold):
        raise ConfigurationError(f"{name}={hold!r} must be a delayed_retry.Hold or None")
    hold.check(topology)


def chain_units(
    topology: DelayTopology, due_at: datetime, *, now: datetime, hold: Hold | None
) -> int:
    """The delay in units to publish with, for a message due at ``due_at``.

    Without ``hold``: the gap rounded up, never early. With ``hold``: the gap
    less the lead, rounded down to the granularity's step, so the message
    leaves the chain at most lead + one step before ``due_at`` and the
    consumer holds it for the rest. A unit coarser than the granularity is
    rounded up instead: such a message leaves at most the lead early.
    Raises :class:`~delayed_retry.errors.DelayOutOfRangeError` like
    :meth:`DelayTopology.units_until`.
    """
    exact = topology.units_until(due_at, now=now)
    if hold is None or exact == 0:
        return exact
    gap_us = max((due_at - now) // _US, 0)
    unit_us = topology.unit_ms * 1000
    step = hold._step_units(topology)
    coarse = hold.granularity_us < unit_us

    def units(lead_us: int) -> int:
        target_us = gap_us - lead_us
        if target_us <= 0:
            return 0
        if coarse:
            return min(-(-target_us // unit_us), exact)
        return target_us // (unit_us * step) * step

    # The lead depends on the hops, which depend on the units. Raise the hops the lead
    # is computed for until the units it gives make no more hops than that: the lead
    # then covers every hop. The hops only grow and stop at the levels: it ends.
    hops = units(hold.lead_us).bit_count()
    while True:
        result = units(hold.lead_for(hops))
        if result.bit_count() <= hops:
            return result
        hops = result.bit_count()
