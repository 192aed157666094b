"""The idempotency ledger: which messages a redrive or a bulk schedule already sent.

A ledger is a Parquet dataset of ``(run_id, message_key, sent_at)`` rows
(:data:`~delayed_retry.spark.schema.LEDGER_COLUMNS`), one row per publish the
broker confirmed. Before sending, rows whose key the ledger already holds
for the same run id are anti-joined away, so running the same redrive or
schedule again sends only what is missing. The driver appends to it once
per run, with the same durable write as the archive.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from delayed_retry.spark.schema import ledger_arrow_schema, ledger_spark_schema
from delayed_retry.spark.sinks import sink_for

__all__ = ["append_ledger", "ledger_keys", "path_exists"]


def path_exists(path: str) -> bool:
    """Whether a local folder or a pyarrow-reachable URI exists."""
    scheme = urlsplit(path).scheme
    if scheme in ("", "file"):
        return os.path.exists(urlsplit(path).path if scheme == "file" else path)
    import pyarrow.fs as pafs

    filesystem, root = pafs.FileSystem.from_uri(path)
    return bool(filesystem.get_file_info(root).type != pafs.FileType.NotFound)


def ledger_keys(spark: Any, ledger: str, run_id: str) -> Any:
    """A DataFrame of the ``message_key`` values already sent under ``run_id``."""
    from pyspark.sql import functions as F

    if not path_exists(ledger):
        return spark.createDataFrame([], "message_key string")
    frame = spark.read.schema(ledger_spark_schema()).parquet(ledger)
    return frame.where(F.col("run_id") == F.lit(run_id)).select("message_key").distinct()


def append_ledger(ledger: str, run_id: str, sent: Sequence[tuple[str, datetime]]) -> str | None:
    """Record ``sent`` (message key, confirm time) under ``run_id``; returns the new file."""
    if not sent:
        return None
    import pyarrow as pa

    table = pa.Table.from_pydict(
        {
            "run_id": [run_id] * len(sent),
            "message_key": [key for key, _ in sent],
            "sent_at": [when for _, when in sent],
        },
        schema=ledger_arrow_schema(),
    )
    return sink_for(ledger).write(table, "")
