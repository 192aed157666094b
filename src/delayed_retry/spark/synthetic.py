"""Synthetic archives with known content, for tests, demos and benchmarks.

The rows are built by the archiver's own :func:`~delayed_retry.spark.archive.archive_row`
from headers the library's parking writes, so they look exactly like archived
parked messages; only the broker round trip is skipped.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.headers.parking_record import parking_headers
from delayed_retry.headers.retry_state import parse_retry_state
from delayed_retry.spark.archive import archive_row
from delayed_retry.spark.schema import archive_arrow_schema, escape_partition_value
from delayed_retry.spark.sinks import LocalSink

__all__ = ["parked_headers", "parked_row", "write_archive"]


def parked_headers(
    queue: str, exc: BaseException, *, parked_at: datetime, first_failure_at: datetime, retries: int
) -> dict[str, Any]:
    """Headers of a message the library parked after ``retries`` retries, failing with ``exc``."""
    state = parse_retry_state(
        {"x-retry": retries, "x-retry-first-failure-at": int(first_failure_at.timestamp() * 1000)},
        exchange="",
        routing_key=queue,
        queue=queue,
    )
    return parking_headers({}, state, exc, now=parked_at, reason="max-retries")


def parked_row(
    topology: DelayTopology,
    queue: str,
    body: bytes,
    exc: BaseException,
    *,
    parked_at: datetime,
    retries: int = 3,
    park_after: timedelta = timedelta(seconds=60),
    message_id: str | None = None,
) -> dict[str, Any]:
    """An archive row of ``body`` parked from ``queue`` at ``parked_at``, first failing earlier."""
    headers = parked_headers(
        queue, exc, parked_at=parked_at, first_failure_at=parked_at - park_after, retries=retries
    )
    return archive_row(
        body=body,
        headers=headers,
        exchange=topology.parking_exchange,
        routing_key=queue,
        properties={"content_type": "application/json", "message_id": message_id},
        redelivered=False,
        archived_at=parked_at + timedelta(minutes=5),
        topology=topology,
    )


def write_archive(root: str | Path, parking_queue: str, rows: Sequence[dict[str, Any]]) -> None:
    """Write ``rows`` as one part file per day under ``root`` (as the archiver would)."""
    import pyarrow as pa

    sink = LocalSink(str(root))
    by_day: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_day.setdefault(row["parked_at"].strftime("%Y-%m-%d"), []).append(row)
    for day, day_rows in by_day.items():
        table = pa.Table.from_pylist(day_rows, schema=archive_arrow_schema())
        sink.write(table, f"date={day}/queue={escape_partition_value(parking_queue)}")
