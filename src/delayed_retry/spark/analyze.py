"""After an incident: what was parked, where, why, and whether a retry later would help.

:func:`analyze_archive` runs one PySpark job over one or several archives
and returns small, plain results (:class:`Analysis`): failure groups by
fingerprint (:mod:`delayed_retry.parking.fingerprint`), counts, and counts over a
real time axis. :mod:`delayed_retry.spark.report` renders them for a
terminal and as one HTML file.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from delayed_retry.durations import from_epoch_ms
from delayed_retry.spark.dataset import archive_bytes, read_archive, reading
from delayed_retry.spark.fingerprints import with_fingerprint
from delayed_retry.spark.session import default_parallelism, shuffle_partitions_for
from delayed_retry.spark.timeline import Timeline, choose_bucket, fill

__all__ = [
    "PERMANENT_PATTERN",
    "TRANSIENT_PATTERN",
    "Analysis",
    "ErrorGroup",
    "Example",
    "analyze_archive",
    "default_report_path",
]

log = logging.getLogger(__name__)

TRANSIENT_PATTERN = (
    r"(?i)(timeout|timed out|connection|connect|unavailable|temporar|throttl|too many requests"
    r"|\b429\b|\b502\b|\b503\b|\b504\b|reset by peer|refused|deadlock|try again|broken pipe)"
)
"""Exception types or messages that usually pass with time: retrying later may succeed."""

PERMANENT_PATTERN = (
    r"(?i)(validation|invalid|schema|parse|decode|malformed|keyerror|valueerror|typeerror"
    r"|attributeerror|not found|\b400\b|\b404\b|\b422\b|integrity|constraint|unauthori|forbidden)"
)
"""Ones that will fail again until the message or the code changes."""


@dataclass(frozen=True, kw_only=True)
class Example:
    """One real parked message of a group."""

    message_id: str
    message: str
    body: str


@dataclass(frozen=True, kw_only=True)
class ErrorGroup:
    """One way of failing (one failure fingerprint): how often, where, when, two examples."""

    key: str
    exception_type: str
    template: str
    frame: str | None
    kind: str
    count: int
    queues: tuple[str, ...]
    first_seen: datetime | None
    last_seen: datetime | None
    examples: tuple[Example, ...]

    @property
    def message(self) -> str:
        """The first example's message (the template with its real values)."""
        return self.examples[0].message if self.examples else self.template

    def redrive_command(self, paths: Sequence[str]) -> str:
        """The ``delayed-retry spark redrive`` command that sends exactly this group back."""
        # The key is hex digits only, so double quotes around the predicate are safe to paste.
        where = f"\"fingerprint = '{self.key}'\""
        return f"delayed-retry spark redrive {' '.join(map(shlex.quote, paths))} --where {where}"


@dataclass(frozen=True, kw_only=True)
class Analysis:
    """Everything the report shows, as plain values."""

    paths: tuple[str, ...]
    generated_at: datetime
    total: int
    distinct: int
    first_parked_at: datetime | None
    last_parked_at: datetime | None
    by_queue: dict[str, int]
    by_exception: dict[str, int]
    by_kind: dict[str, int]
    by_reason: dict[str, int]
    by_retries: dict[int, int]
    park_seconds: dict[str, float]
    park_seconds_sample: tuple[float, ...]
    group_count: int
    groups: tuple[ErrorGroup, ...]
    by_group_over_time: Timeline | None
    by_queue_over_time: Timeline | None

    @property
    def top_errors(self) -> tuple[ErrorGroup, ...]:
        """The failure groups, biggest first: :attr:`groups`, under the first report's name."""
        return self.groups


_READ_COLUMNS = (
    "message_key",
    "message_id",
    "origin_queue",
    "queue",
    "exception_type",
    "exception_message",
    "exception_traceback",
    "last_error",
    "parked_reason",
    "parked_at",
    "archived_at",
    "first_failure_at",
    "retries",
    "body",
)
"""The archive columns the analysis reads (Parquet skips the others)."""

_DIMENSIONS = ("queue", "exception_type", "kind", "parked_reason", "retries")
"""The counts the report shows per value, computed together in one aggregation."""


def _deduplicated(raw: Any) -> Any:
    """One row per ``message_key`` and ``_copies``, how many archived rows it had.

    The same shuffle as ``dropDuplicates``, and the archived-row total needs
    no second pass over the Parquet files.
    """
    from pyspark.sql import functions as F

    rest = [c for c in _READ_COLUMNS if c != "message_key"]
    return (
        raw.select(*_READ_COLUMNS)
        .groupBy("message_key")
        .agg(F.count(F.lit(1)).alias("_copies"), F.first(F.struct(*rest)).alias("_row"))
        .select("message_key", "_copies", *[F.col(f"_row.{c}").alias(c) for c in rest])
    )


def _classified(frame: Any) -> Any:
    from pyspark.sql import functions as F

    message = F.coalesce(F.col("exception_message"), F.col("last_error"), F.lit(""))
    text = F.concat_ws(" ", F.coalesce(F.col("exception_type"), F.lit("")), message)
    kind = (
        F.when(text.rlike(TRANSIENT_PATTERN), F.lit("transient"))
        .when(text.rlike(PERMANENT_PATTERN), F.lit("permanent"))
        .otherwise(F.lit("unknown"))
    )
    return with_fingerprint(frame).select(
        "message_key",
        "_copies",
        F.coalesce(
            F.col("message_id"), F.concat(F.lit("key:"), F.substring("message_key", 1, 16))
        ).alias("message_id"),
        F.coalesce(F.col("origin_queue"), F.col("queue")).alias("queue"),
        F.coalesce(F.col("exception_type"), F.lit("(none)")).alias("exception_type"),
        F.coalesce(F.col("parked_reason"), F.lit("(none)")).alias("parked_reason"),
        message.alias("message"),
        kind.alias("kind"),
        "fingerprint",
        "fingerprint_type",
        "fingerprint_template",
        "raising_frame",
        # Epoch ms, not a timestamp: collected timestamps come back in the local time zone.
        F.unix_millis(F.coalesce(F.col("parked_at"), F.col("archived_at"))).alias("at_ms"),
        F.unix_millis(F.col("parked_at")).alias("parked_ms"),
        F.col("retries"),
        (F.unix_millis(F.col("parked_at")) - F.unix_millis(F.col("first_failure_at"))).alias(
            "park_ms"
        ),
        F.col("body"),
    )


def _preview(body: bytes | None, limit: int = 160) -> str:
    from delayed_retry.headers.text import encode_body_preview

    return encode_body_preview(bytes(body or b""), limit)


def _ms(value: Any) -> datetime | None:
    return None if value is None else from_epoch_ms(int(value))


def analyze_archive(
    spark: Any, paths: str | Sequence[str], *, top: int = 10, series: int = 6
) -> Analysis:
    """Count, group and classify the parked messages in ``paths`` (duplicates counted once).

    ``top`` failure groups are listed; the charts stack the ``series``
    biggest groups (and queues) and sum the rest as ``other``.

    Five Spark actions whatever the size: overall figures (which also fills
    the cached, fingerprinted frame), every per-value count at once, the
    biggest groups, both timelines at once, and a sample of parking delays.
    Shuffle partitions start from the archive's size on disk
    (:func:`~delayed_retry.spark.session.shuffle_partitions_for`), and
    adaptive execution merges them further.
    """
    path_list = (paths,) if isinstance(paths, str) else tuple(paths)
    partitions = shuffle_partitions_for(archive_bytes(path_list), cores=default_parallelism(spark))
    before = spark.conf.get("spark.sql.shuffle.partitions")
    # Before cache(): the cached frame's plan, and its shuffle, are fixed when it is cached.
    spark.conf.set("spark.sql.shuffle.partitions", str(partitions))
    raw = read_archive(spark, list(path_list))
    frame = _classified(_deduplicated(raw)).cache()
    try:
        with reading(list(path_list)):
            return _analyze(frame, path_list, top, series)
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before)
        frame.unpersist()


def _example(row: Any) -> Example:
    return Example(
        message_id=str(row["message_id"]), message=str(row["message"]), body=_preview(row["body"])
    )


def _dimension_counts(frame: Any) -> dict[str, dict[Any, int]]:
    """Counts per value of every :data:`_DIMENSIONS` column, biggest first, in one job."""
    from pyspark.sql import functions as F

    pairs = F.array(
        *[
            F.struct(F.lit(name).alias("dimension"), F.col(name).cast("string").alias("value"))
            for name in _DIMENSIONS
        ]
    )
    rows = (
        frame.select(F.explode(pairs).alias("d"))
        .groupBy("d.dimension", "d.value")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    )
    counts: dict[str, dict[Any, int]] = {name: {} for name in _DIMENSIONS}
    for row in sorted(rows, key=lambda r: (-int(r["n"]), str(r["value"]))):
        value = row["value"]
        if row["dimension"] == "retries":
            if value is None:  # no x-retry header: not counted
                continue
            value = int(value)
        counts[row["dimension"]][value] = int(row["n"])
    return counts


def _timelines(
    frame: Any, keep: Mapping[str, Sequence[str]], first: datetime, last: datetime, size: int
) -> dict[str, Timeline]:
    """Counts per time bucket of each ``keep`` column's kept values (the rest as ``other``)."""
    from pyspark.sql import functions as F

    bucket_ms = size * 1000
    names = F.array(
        *[
            F.struct(
                F.lit(column).alias("column"),
                F.when(F.col(column).isin(list(values)), F.col(column))
                .otherwise(F.lit("other"))
                .alias("name"),
            )
            for column, values in keep.items()
        ]
    )
    rows = (
        frame.select(
            (F.floor(F.col("at_ms") / bucket_ms) * bucket_ms).alias("bucket"),
            F.explode(names).alias("d"),
        )
        .groupBy("d.column", "bucket", "d.name")
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    )
    counts: dict[str, dict[tuple[datetime, str], int]] = {column: {} for column in keep}
    for r in rows:
        counts[r["column"]][(from_epoch_ms(int(r["bucket"])), str(r["name"]))] = int(r["n"])
    return {
        column: fill(counts[column], first=first, last=last, bucket_seconds=size, keep=keep[column])
        for column in keep
    }


def _analyze(frame: Any, paths: tuple[str, ...], top: int, series: int) -> Analysis:
    from pyspark.sql import functions as F

    generated_at = datetime.now(UTC)
    overall = frame.agg(
        F.sum("_copies").alias("total"),
        F.count(F.lit(1)).alias("n"),
        F.min("at_ms").alias("first"),
        F.max("at_ms").alias("last"),
        F.min("parked_ms").alias("first_parked"),
        F.max("parked_ms").alias("last_parked"),
        F.countDistinct("fingerprint").alias("groups"),
        F.count("park_ms").alias("parked"),
        F.min("park_ms").alias("min"),
        F.percentile_approx("park_ms", 0.5).alias("p50"),
        F.percentile_approx("park_ms", 0.9).alias("p90"),
        F.max("park_ms").alias("max"),
    ).collect()[0]
    distinct = int(overall["n"])
    park_seconds = (
        {k: float(overall[k]) / 1000 for k in ("min", "p50", "p90", "max")}
        if overall["parked"]
        else {}
    )
    counts = _dimension_counts(frame)
    example = F.struct("message_id", "message", "body")
    rows = (
        frame.groupBy("fingerprint")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.first("fingerprint_type").alias("type"),
            F.first("fingerprint_template").alias("template"),
            F.first("raising_frame").alias("frame"),
            F.mode("kind").alias("kind"),
            F.sort_array(F.collect_set("queue")).alias("queues"),
            F.min("at_ms").alias("first"),
            F.max("at_ms").alias("last"),
            F.min_by(example, F.struct("at_ms", "message_key")).alias("ex1"),
            F.max_by(example, F.struct("at_ms", "message_key")).alias("ex2"),
        )
        .orderBy(F.desc("n"), F.asc("fingerprint"))
        .limit(top)
        .collect()
    )
    groups = tuple(
        ErrorGroup(
            key=r["fingerprint"],
            exception_type=r["type"],
            template=r["template"],
            frame=r["frame"],
            kind=r["kind"],
            count=int(r["n"]),
            queues=tuple(q for q in r["queues"] if q is not None),
            first_seen=_ms(r["first"]),
            last_seen=_ms(r["last"]),
            examples=tuple(
                _example(e)
                for e in (r["ex1"], r["ex2"])[: 1 if r["n"] == 1 else 2]
                if e is not None
            ),
        )
        for r in rows
    )
    by_queue = {str(k): v for k, v in counts["queue"].items()}
    first, last = _ms(overall["first"]), _ms(overall["last"])
    timelines: dict[str, Timeline] = {}
    if first is not None and last is not None:
        keep = {
            "fingerprint": [g.key for g in groups[:series]],
            "queue": list(by_queue)[:series],
        }
        timelines = _timelines(frame, keep, first, last, choose_bucket(last - first))
    sample = tuple(
        float(r["park_ms"]) / 1000
        for r in frame.where(F.col("park_ms").isNotNull()).select("park_ms").limit(20_000).collect()
    )
    return Analysis(
        paths=paths,
        generated_at=generated_at,
        total=int(overall["total"] or 0),
        distinct=distinct,
        first_parked_at=_ms(overall["first_parked"]),
        last_parked_at=_ms(overall["last_parked"]),
        by_queue=by_queue,
        by_exception=counts["exception_type"],
        by_kind=counts["kind"],
        by_reason=counts["parked_reason"],
        by_retries=dict(sorted(counts["retries"].items())),
        park_seconds=park_seconds,
        park_seconds_sample=sample,
        group_count=int(overall["groups"]),
        groups=groups,
        by_group_over_time=timelines.get("fingerprint"),
        by_queue_over_time=timelines.get("queue"),
    )


def default_report_path(archive: str) -> str:
    """``<archive>.report.html`` beside a local archive folder."""
    return os.path.abspath(archive.rstrip("/")) + ".report.html"
