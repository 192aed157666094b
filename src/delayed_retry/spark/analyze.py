"""After an incident: what was parked, where, why, and whether a retry later would help.

:func:`analyze_archive` runs one PySpark job over one or several archives
and returns small, plain results (:class:`Analysis`); :func:`format_table`
prints them for a terminal and :func:`write_html_report` writes a single
HTML file with the charts embedded as PNG images.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from delayed_retry.durations import from_epoch_ms
from delayed_retry.spark.dataset import read_archive, reading

__all__ = [
    "PERMANENT_PATTERN",
    "TRANSIENT_PATTERN",
    "Analysis",
    "ErrorGroup",
    "analyze_archive",
    "format_table",
    "write_html_report",
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
class ErrorGroup:
    """One distinct error: how often, where, and an example message."""

    exception_type: str
    message: str
    kind: str
    count: int
    queues: tuple[str, ...]
    example_key: str
    example_body: str


@dataclass(frozen=True, kw_only=True)
class Analysis:
    """Everything the report shows, as plain values."""

    total: int
    distinct: int
    by_queue: dict[str, int]
    by_exception: dict[str, int]
    by_kind: dict[str, int]
    by_hour: dict[datetime, int]
    by_retries: dict[int, int]
    park_seconds: dict[str, float]
    park_seconds_sample: tuple[float, ...]
    top_errors: tuple[ErrorGroup, ...]


def _classified(frame: Any) -> Any:
    from pyspark.sql import functions as F

    text = F.concat_ws(
        " ",
        F.coalesce(F.col("exception_type"), F.lit("")),
        F.coalesce(F.col("exception_message"), F.col("last_error"), F.lit("")),
    )
    kind = (
        F.when(text.rlike(TRANSIENT_PATTERN), F.lit("transient"))
        .when(text.rlike(PERMANENT_PATTERN), F.lit("permanent"))
        .otherwise(F.lit("unknown"))
    )
    return frame.select(
        "message_key",
        F.coalesce(F.col("origin_queue"), F.col("queue")).alias("queue"),
        F.coalesce(F.col("exception_type"), F.lit("(none)")).alias("exception_type"),
        F.coalesce(F.col("exception_message"), F.col("last_error"), F.lit("")).alias("message"),
        kind.alias("kind"),
        # Epoch ms, not a timestamp: collected timestamps come back in the local time zone.
        F.unix_millis(
            F.date_trunc("hour", F.coalesce(F.col("parked_at"), F.col("archived_at")))
        ).alias("hour_ms"),
        F.col("retries"),
        (F.unix_millis(F.col("parked_at")) - F.unix_millis(F.col("first_failure_at"))).alias(
            "park_ms"
        ),
        F.col("body"),
    )


def _counts(frame: Any, column: str) -> dict[Any, int]:
    from pyspark.sql import functions as F

    rows = frame.groupBy(column).agg(F.count(F.lit(1)).alias("n")).orderBy(F.desc("n")).collect()
    return {row[column]: int(row["n"]) for row in rows}


def _preview(body: bytes | None, limit: int = 160) -> str:
    from delayed_retry.headers import encode_body_preview

    return encode_body_preview(bytes(body or b""), limit)


def analyze_archive(spark: Any, paths: str | Sequence[str], *, top: int = 10) -> Analysis:
    """Count and classify the parked messages in ``paths`` (duplicates counted once)."""
    raw = read_archive(spark, paths)
    frame = _classified(raw.dropDuplicates(["message_key"])).cache()
    try:
        with reading(paths):
            return _analyze(raw, frame, top)
    finally:
        frame.unpersist()


def _analyze(raw: Any, frame: Any, top: int) -> Analysis:
    from pyspark.sql import functions as F

    total = int(raw.count())
    distinct = int(frame.count())
    by_hour = {
        from_epoch_ms(int(k)): v for k, v in _counts(frame, "hour_ms").items() if k is not None
    }
    retries = {
        int(k): v for k, v in _counts(frame.where(F.col("retries").isNotNull()), "retries").items()
    }
    parked = frame.where(F.col("park_ms").isNotNull())
    stats = parked.agg(
        F.min("park_ms").alias("min"),
        F.percentile_approx("park_ms", 0.5).alias("p50"),
        F.percentile_approx("park_ms", 0.9).alias("p90"),
        F.max("park_ms").alias("max"),
        F.count(F.lit(1)).alias("n"),
    ).collect()[0]
    park_seconds = (
        {k: float(stats[k]) / 1000 for k in ("min", "p50", "p90", "max")} if stats["n"] else {}
    )
    sample = tuple(
        float(r["park_ms"]) / 1000 for r in parked.select("park_ms").limit(20_000).collect()
    )
    groups = (
        frame.groupBy("exception_type", "message", "kind")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.sort_array(F.collect_set("queue")).alias("queues"),
            F.min_by("message_key", "message_key").alias("example_key"),
            F.min_by("body", "message_key").alias("example_body"),
        )
        .orderBy(F.desc("n"), "exception_type", "message")
        .limit(top)
        .collect()
    )
    top_errors = tuple(
        ErrorGroup(
            exception_type=r["exception_type"],
            message=r["message"],
            kind=r["kind"],
            count=int(r["n"]),
            queues=tuple(q for q in r["queues"] if q is not None),
            example_key=r["example_key"],
            example_body=_preview(r["example_body"]),
        )
        for r in groups
    )
    return Analysis(
        total=total,
        distinct=distinct,
        by_queue={str(k): v for k, v in _counts(frame, "queue").items()},
        by_exception=_counts(frame, "exception_type"),
        by_kind=_counts(frame, "kind"),
        by_hour=dict(sorted(by_hour.items())),
        by_retries=dict(sorted(retries.items())),
        park_seconds=park_seconds,
        park_seconds_sample=sample,
        top_errors=top_errors,
    )


def _section(title: str, rows: Sequence[tuple[str, str]]) -> list[str]:
    width = max((len(a) for a, _ in rows), default=0)
    lines = [title, "-" * len(title)]
    lines += [f"  {a.ljust(width)}  {b}" for a, b in rows] or ["  (none)"]
    return [*lines, ""]


def _short(text: str, limit: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def format_table(analysis: Analysis) -> str:
    """The analysis as plain text tables for a terminal."""
    a = analysis
    lines = [f"Parked messages: {a.distinct} distinct ({a.total} archived rows)", ""]
    lines += _section("By queue", [(q, str(n)) for q, n in a.by_queue.items()])
    lines += _section("By exception type", [(t, str(n)) for t, n in a.by_exception.items()])
    lines += _section("Likely transient vs permanent", [(k, str(n)) for k, n in a.by_kind.items()])
    lines += _section(
        "By hour (UTC)", [(h.strftime("%Y-%m-%d %H:00"), str(n)) for h, n in a.by_hour.items()]
    )
    lines += _section(
        "By retries before parking", [(str(r), str(n)) for r, n in a.by_retries.items()]
    )
    lines += _section(
        "First failure to parking (seconds)",
        [(k, f"{v:.1f}") for k, v in a.park_seconds.items()],
    )
    lines += _section(
        "Top errors",
        [
            (f"{e.count:>6}  {e.kind:<9}", f"{_short(e.exception_type + ': ' + e.message)}")
            for e in a.top_errors
        ],
    )
    return "\n".join(lines)


def _png(draw: Any) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 3.2))
    try:
        draw(axes)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=90)
    finally:
        plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _charts(a: Analysis) -> list[tuple[str, str]]:
    charts = []
    if a.by_hour:
        charts.append(
            (
                "Parked per hour (UTC)",
                _png(
                    lambda ax: (
                        ax.bar(
                            [h.strftime("%m-%d %H:00") for h in a.by_hour],
                            list(a.by_hour.values()),
                        ),
                        ax.tick_params(axis="x", labelrotation=45, labelsize=7),
                    )
                ),
            )
        )
    if a.by_exception:
        items = list(a.by_exception.items())[:15][::-1]
        charts.append(
            (
                "By exception type",
                _png(lambda ax: ax.barh([_short(k, 50) for k, _ in items], [n for _, n in items])),
            )
        )
    if a.by_retries:
        charts.append(
            (
                "Retries before parking",
                _png(
                    lambda ax: ax.bar([str(k) for k in a.by_retries], list(a.by_retries.values()))
                ),
            )
        )
    if a.park_seconds_sample:
        charts.append(
            (
                "Seconds from first failure to parking",
                _png(lambda ax: ax.hist(a.park_seconds_sample, bins=30)),
            )
        )
    return charts


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def write_html_report(analysis: Analysis, path: str, *, title: str = "Parked messages") -> str:
    """Write the analysis as one self-contained HTML file (charts inline); return its path."""
    a = analysis
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}</style>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{a.distinct} distinct messages ({a.total} archived rows).</p>",
        "<h2>By queue</h2>",
        _html_table(["queue", "messages"], list(a.by_queue.items())),
        "<h2>Likely transient vs permanent</h2>",
        _html_table(["kind", "messages"], list(a.by_kind.items())),
        "<h2>First failure to parking (seconds)</h2>",
        _html_table(["statistic", "seconds"], [(k, f"{v:.1f}") for k, v in a.park_seconds.items()]),
    ]
    for caption, png in _charts(a):
        parts += [
            f"<h2>{html.escape(caption)}</h2>",
            f"<img alt='{html.escape(caption)}' src='data:image/png;base64,{png}'>",
        ]
    parts += [
        "<h2>Top errors</h2>",
        _html_table(
            ["count", "kind", "exception", "message", "queues", "example key", "example body"],
            [
                (
                    e.count,
                    e.kind,
                    e.exception_type,
                    e.message,
                    ", ".join(e.queues),
                    e.example_key[:16],
                    e.example_body,
                )
                for e in a.top_errors
            ],
        ),
    ]
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(parts))
    return path


def default_report_path(archive: str) -> str:
    """``<archive>.report.html`` beside a local archive folder."""
    return os.path.abspath(archive.rstrip("/")) + ".report.html"
