"""Schedule one delayed message per DataFrame row, from the executors, exactly once per key.

The use case: remind every customer to review an order N days after it was
delivered. Compute the due time per row in Spark, then hand the DataFrame to
:func:`schedule_dataframe`; the rows wait in the delay chain, not in a
scheduler's database, and arrive at their queue never before their due time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.names import X_SCHEDULE_ID
from delayed_retry.spark.ledger import ledger_keys
from delayed_retry.spark.partition_publish import PublishJob
from delayed_retry.spark.publisher import (
    declare_destinations,
    publishing_partitions,
    run_publish,
)

__all__ = ["ScheduleResult", "schedule_dataframe"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ScheduleResult:
    """How many rows a bulk schedule had, sent now, and skipped (already in the ledger, or
    a duplicate key)."""

    schedule_id: str
    rows: int
    already_sent: int
    sent: int


def _column(frame: Any, value: Any, what: str) -> Any:
    from pyspark.sql import Column
    from pyspark.sql import functions as F

    if isinstance(value, Column):
        return value
    if isinstance(value, str):
        if value not in frame.columns:
            raise ConfigurationError(
                f"{what}={value!r} is not a column of the DataFrame; columns are "
                f"{', '.join(frame.columns)}"
            )
        return F.col(value)
    raise ConfigurationError(f"{what}={value!r} must be a column name or a pyspark Column")


def _due_ms(frame: Any, column: Any) -> Any:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    kind = frame.select(column.alias("_due")).schema["_due"].dataType
    if isinstance(kind, T.TimestampType | T.TimestampNTZType):
        # Round up to the millisecond: a due time never moves earlier.
        return F.floor((F.unix_micros(column) + F.lit(999)) / F.lit(1000)).cast("long")
    if isinstance(kind, T.DateType):
        return (F.unix_date(column).cast("long") * F.lit(86_400_000)).cast("long")
    if isinstance(kind, T.IntegralType):
        return column.cast("long")
    raise ConfigurationError(
        f"due_at has type {kind.simpleString()}; use a timestamp, a date, or epoch milliseconds"
    )


def _body(frame: Any, column: Any) -> tuple[Any, str | None]:
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    kind = frame.select(column.alias("_body")).schema["_body"].dataType
    if isinstance(kind, T.BinaryType):
        return column, None
    if isinstance(kind, T.StringType):
        return F.encode(column, "UTF-8"), "text/plain"
    if isinstance(kind, T.StructType | T.MapType | T.ArrayType):
        return F.encode(F.to_json(column), "UTF-8"), "application/json"
    raise ConfigurationError(
        f"body has type {kind.simpleString()}; use a binary, string or struct column"
    )


def schedule_dataframe(
    df: Any,
    *,
    queue: str,
    due_at: Any,
    body: Any,
    schedule_id: str,
    ledger: str,
    url: str,
    headers: Mapping[str, Any] | None = None,
    key: Any = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    window: int = 256,
    partitions: int | None = None,
) -> ScheduleResult:
    """Publish one message per row of ``df`` to ``queue``, due at the row's ``due_at``.

    ``due_at`` is a timestamp, date or epoch-milliseconds column (name or
    Column); ``body`` a binary, string (sent as UTF-8 text) or struct column
    (sent as JSON). ``headers`` maps header names to columns or names.
    ``key`` identifies a row for idempotency (default: a hash of the body,
    due time and headers) and becomes the message's ``message_id``, the
    deduplication key consumers should use; the ledger at ``ledger`` remembers every key
    confirmed under ``schedule_id``, so calling again with the same id sends
    only what is missing. Due times already past are delivered at once.
    ``partitions`` publishing connections run at once (default: one per
    executor core); ``window`` is each one's publishes awaiting a confirm.
    Raises :class:`~delayed_retry.spark.publisher.PublishRunError` when the
    broker fails part-way, after the ledger recorded the confirmed rows.
    """
    from pyspark.sql import functions as F

    if not schedule_id:
        raise ConfigurationError("schedule_id must name this schedule, e.g. 'reminders-2024-06'")
    topology.check_destination(queue)
    due = _due_ms(df, _column(df, due_at, "due_at"))
    body_col, content_type = _body(df, _column(df, body, "body"))
    header_cols = [
        _column(df, value, f"headers[{name!r}]").alias(name)
        for name, value in (headers or {}).items()
    ]
    headers_json = F.to_json(F.struct(*header_cols)) if header_cols else F.lit("{}")
    rows = df.select(
        due.alias("due_at_ms"), body_col.alias("body"), headers_json.alias("headers_json")
    )
    if key is None:
        key_col = F.sha2(
            F.concat_ws(
                "\x1f", F.col("due_at_ms").cast("string"), F.base64("body"), F.col("headers_json")
            ),
            256,
        )
    else:
        key_col = _column(df, key, "key").cast("string")
        rows = df.select(
            key_col.alias("message_key"),
            due.alias("due_at_ms"),
            body_col.alias("body"),
            headers_json.alias("headers_json"),
        )
        key_col = F.col("message_key")
    rows = rows.select(
        key_col.alias("message_key"),
        F.lit(queue).alias("destination"),
        "due_at_ms",
        "body",
        "headers_json",
        F.lit(content_type).cast("string").alias("content_type"),
        F.lit(None).cast("string").alias("content_encoding"),
        # The key is the message id: a consumer deduplicates on message_id, and a run
        # repeated after a failure sends a row again under the same id.
        F.col("message_key").alias("message_id"),
        F.lit(None).cast("string").alias("correlation_id"),
    )
    # One pass counts the rows and finds null keys or due times.
    counts = rows.agg(
        F.count(F.lit(1)).alias("total"),
        F.count(F.when(F.col("due_at_ms").isNull() | F.col("message_key").isNull(), 1)).alias(
            "null"
        ),
    ).first()
    if counts["null"]:
        raise ConfigurationError(
            f"due_at or key is null in {counts['null']} of {counts['total']} rows; filter them "
            "out or fill them in"
        )
    total = int(counts["total"])
    n = publishing_partitions(df.sparkSession, partitions)
    pending = (
        rows.repartition(n, "message_key")
        .dropDuplicates(["message_key"])
        .join(ledger_keys(df.sparkSession, ledger, schedule_id), on="message_key", how="left_anti")
    )
    asyncio.run(declare_destinations(url, topology, [queue]))
    job = PublishJob(
        url=url,
        topology=topology,
        run_id=schedule_id,
        run_header=X_SCHEDULE_ID,
        ledger=ledger,
        window=window,
    )
    outcome = run_publish(pending, job)
    outcome.raise_for_errors(
        f"schedule {schedule_id!r}", rerun="call it again with the same schedule_id"
    )
    return ScheduleResult(
        schedule_id=schedule_id, rows=total, already_sent=total - outcome.sent, sent=outcome.sent
    )
