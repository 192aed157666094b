"""A real time axis for counts over time: bucket size from the span, empty buckets filled. Pure.

Use :func:`choose_bucket` before counting (the bucket size goes into the
Spark job) and :func:`fill` after (buckets with nothing parked are drawn as
zero, so a gap looks like a gap).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

__all__ = ["BUCKETS", "Timeline", "choose_bucket", "fill", "thin_ticks"]

BUCKETS: tuple[tuple[int, str], ...] = (
    (60, "1 minute"),
    (5 * 60, "5 minutes"),
    (15 * 60, "15 minutes"),
    (3600, "1 hour"),
    (3 * 3600, "3 hours"),
    (6 * 3600, "6 hours"),
    (12 * 3600, "12 hours"),
    (86400, "1 day"),
    (7 * 86400, "1 week"),
)
"""Bucket sizes in seconds with their names, smallest first."""

MAX_BUCKETS = 96
"""At most this many buckets on an axis (a day in 15-minute buckets, four days in hours)."""


def choose_bucket(span: timedelta, *, max_buckets: int = MAX_BUCKETS) -> int:
    """The smallest bucket size (seconds) that covers ``span`` in at most ``max_buckets``."""
    seconds = max(span.total_seconds(), 0.0)
    for size, _ in BUCKETS:
        if seconds / size < max_buckets:
            return size
    return BUCKETS[-1][0]


def bucket_name(size: int) -> str:
    """``"1 hour"`` for 3600; seconds spelled out for a size not in :data:`BUCKETS`."""
    return dict(BUCKETS).get(size, f"{size} s")


def floor_to(moment: datetime, size: int) -> datetime:
    """The start of the bucket of ``size`` seconds holding ``moment`` (UTC epoch aligned)."""
    epoch = int(moment.timestamp())
    return datetime.fromtimestamp(epoch - epoch % size, tz=UTC)


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """Counts per bucket and series (a group or a queue), every bucket present."""

    bucket_seconds: int
    starts: tuple[datetime, ...]
    series: dict[str, tuple[int, ...]]

    @property
    def totals(self) -> tuple[int, ...]:
        """The count of all series per bucket."""
        return tuple(sum(col) for col in zip(*self.series.values(), strict=True)) or tuple(
            0 for _ in self.starts
        )


def fill(
    counts: Mapping[tuple[datetime, str], int],
    *,
    first: datetime,
    last: datetime,
    bucket_seconds: int,
    keep: Sequence[str] | None = None,
    other: str = "other",
) -> Timeline:
    """Every bucket from ``first`` to ``last``; series not in ``keep`` summed into ``other``.

    ``counts`` maps (bucket start, series) to a count; bucket starts must be
    aligned as :func:`floor_to` aligns them.
    """
    start, end = floor_to(first, bucket_seconds), floor_to(last, bucket_seconds)
    starts: list[datetime] = []
    at = start
    while at <= end:
        starts.append(at)
        at += timedelta(seconds=bucket_seconds)
    index = {s: i for i, s in enumerate(starts)}
    names = list(keep) if keep is not None else sorted({name for _, name in counts})
    series = {name: [0] * len(starts) for name in names}
    for (moment, name), n in counts.items():
        target = name if name in series else other
        row = series.setdefault(target, [0] * len(starts))
        i = index.get(moment)
        if i is None:
            raise ValueError(
                f"bucket {moment.isoformat()} is outside {start.isoformat()}..{end.isoformat()} "
                f"or not aligned to {bucket_seconds} s; floor it with floor_to"
            )
        row[i] += n
    return Timeline(
        bucket_seconds=bucket_seconds,
        starts=tuple(starts),
        series={k: tuple(v) for k, v in series.items()},
    )


def thin_ticks(count: int, *, max_ticks: int = 12) -> list[int]:
    """Indexes of at most ``max_ticks`` evenly spaced ticks over ``count`` buckets."""
    if count <= 0:
        return []
    step = max(1, -(-count // max_ticks))
    return list(range(0, count, step))
