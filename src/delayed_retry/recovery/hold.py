"""Leaving the chain before the due time, for a consumer that holds a message until due.

With a :class:`Hold`, the chain lets a message out a little before its due time, with the
fewest TTL hops, and the consumer (a ``@with_delayed_retry`` handler or a forwarder) holds
it in memory for the rest: handled close to its due time, never before it. Pure:
:func:`chain_units` turns a due time into the units to publish with. What a hop costs and
what a hold saves: docs/retries.md, "Held delays", and docs/performance.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.durations import Duration, to_seconds
from delayed_retry.errors import ConfigurationError

__all__ = ["DEFAULT_HOLD", "Hold", "chain_units", "check_hold", "fewest_hops", "redelay_units"]

_US = timedelta(microseconds=1)


def _micros(value: Duration, name: str) -> int:
    seconds = to_seconds(value, name=name)
    return round(seconds * 1_000_000)


@dataclass(frozen=True, kw_only=True)
class Hold:
    """How far ahead of its due time a message leaves the chain, and how its consumer holds it.

    Use the default (:data:`DEFAULT_HOLD`) unless a measurement says otherwise:
    ``@with_delayed_retry`` holds retries with it, and :func:`~delayed_retry.publish_delayed`
    takes ``hold=`` for a queue a ``@with_delayed_retry`` handler consumes; leave it out for a
    queue any other consumer reads. ``lead`` (plus ``lead_per_hop`` per level queue) is the
    least and ``limit`` the most a message leaves early; ``granularity`` is the lowest level
    the chain uses; ``max_messages`` is how many one handler holds at once. Choosing them, and
    the prefetch they need: docs/retries.md, "Held delays".
    """

    lead: Duration = timedelta(milliseconds=10)
    lead_per_hop: Duration = timedelta(milliseconds=10)
    granularity: Duration = timedelta(milliseconds=32)
    limit: Duration = timedelta(seconds=1)
    max_messages: int = 2000
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
        """The longest a message routed with this hold can come out before its due time.

        The limit, for a hold :meth:`check` accepts for ``topology``.
        """
        return max(self.limit_us, self._needed_us(topology))

    def _needed_us(self, topology: DelayTopology) -> int:
        """The shortest limit that leaves every delay a choice: the lead of the longest way
        through the chain, plus one step of the granularity."""
        unit_us = topology.unit_ms * 1000
        # A coarse unit is rounded up (early by the lead at most); a fine one down to a step.
        step_us = 0 if self.granularity_us < unit_us else self._step_units(topology) * unit_us
        return self.lead_for(topology.levels) + step_us

    def check(self, topology: DelayTopology) -> None:
        """Raise :class:`ConfigurationError` if the limit leaves some delay no way to be held.

        The chain must be able to let a message out at least the lead (for
        every hop it may make) and at most ``limit`` before its due time.
        """
        needed = self._needed_us(topology)
        if needed > self.limit_us:
            raise ConfigurationError(
                f"Hold(limit={self.limit!r}) is shorter than the {needed / 1000:.0f} ms a "
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
"""Lead 10 ms + 10 ms per hop, granularity 32 ms, held at most 1 s, 2,000 at a time."""


def check_hold(hold: object, topology: DelayTopology, *, name: str = "hold") -> None:
    """Refuse, when configuring, a ``hold`` that is not a :class:`Hold` or ``None``, or one
    whose limit cannot cover ``topology`` (see :meth:`Hold.check`)."""
    if hold is None:
        return
    if not isinstance(hold, Hold):
        raise ConfigurationError(f"{name}={hold!r} must be a delayed_retry.Hold or None")
    hold.check(topology)


def fewest_hops(low: int, high: int) -> int:
    """The number in ``[low, high]`` with the fewest 1 bits, the largest if several (``low >= 0``).

    Clearing the lowest 1 bit of ``high`` while the result stays at least
    ``low`` ends at the common leading bits of ``low`` and ``high`` plus at
    most one more 1: no number of the range has fewer.
    """
    if not 0 <= low <= high:
        raise ValueError(f"[{low}, {high}] is not a range of non-negative units")
    units = high
    while units:
        lower = units & (units - 1)
        if lower < low:
            break
        units = lower
    return units


def chain_units(
    topology: DelayTopology, due_at: datetime, *, now: datetime, hold: Hold | None
) -> int:
    """The delay in units to publish with, for a message due at ``due_at``.

    Without ``hold``: the gap rounded up, never early. With ``hold``: of the
    delays that leave the chain at least the lead before ``due_at`` and at
    most ``limit`` before it, the one that waits in the fewest level queues
    (in multiples of the granularity's step); the consumer holds the rest. A
    gap shorter than that does not enter the chain: it goes straight to the
    queue and is held there. A unit coarser than the granularity is rounded
    up instead: such a message leaves at most the lead early. Raises
    :class:`~delayed_retry.errors.DelayOutOfRangeError` like
    :meth:`DelayTopology.units_until`.
    """
    exact = topology.units_until(due_at, now=now)
    if hold is None or exact == 0:
        return exact
    gap_us = max((due_at - now) // _US, 0)
    unit_us = topology.unit_ms * 1000
    step = hold._step_units(topology)
    coarse = hold.granularity_us < unit_us
    # In steps: the fewest a message may wait (or it is held longer than the limit).
    low = max(-(-(gap_us - hold.limit_us) // (unit_us * step)), 0)

    def units(lead_us: int) -> int:
        target_us = gap_us - lead_us
        if target_us <= 0:
            return 0
        if coarse:
            return min(-(-target_us // unit_us), exact)
        high = target_us // (unit_us * step)
        if low > high:  # a limit Hold.check refuses; leave the lead early, held longer
            return high * step
        return fewest_hops(low, high) * step

    # The lead depends on the hops, which depend on the units. Raise the hops the lead
    # is computed for until the units it gives make no more hops than that: the lead
    # then covers every hop. The hops only grow and stop at the levels: it ends.
    hops = units(hold.lead_us).bit_count()
    while True:
        result = units(hold.lead_for(hops))
        if result.bit_count() <= hops:
            return result
        hops = result.bit_count()


def redelay_units(
    topology: DelayTopology, due_at: datetime, *, now: datetime, hold: Hold | None
) -> int:
    """The units for a message sent back into the chain because it arrived early.

    Like :func:`chain_units`, except that a message still not due always
    waits in the chain: with a hold, a gap within the limit would otherwise go
    straight back to the queue it came from and be redelivered at once, round
    and round while its consumer holds all it may (``max_messages``). It then
    waits the exact rest, rounded up.
    """
    units = chain_units(topology, due_at, now=now, hold=hold)
    if units == 0:
        return topology.units_until(due_at, now=now)
    return units
