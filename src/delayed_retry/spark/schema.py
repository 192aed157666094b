"""The parking-lot archive's schema, in one place: Parquet columns, partitions, paths.

Pure: pyarrow types and small helpers, no I/O. Every writer and reader of
the archive (the pyarrow archiver, the Spark jobs, the ledger) takes its
column names and types from here.

An archive is a folder of Parquet part files laid out Hive-style,
``<root>/date=YYYY-MM-DD/queue=<parking queue>/part-….parquet``. The two
partition columns live in the path only; folders whose names start with
``_`` or ``.`` (the ledger, temporary files) are not part of the data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "ARCHIVE_COLUMNS",
    "LEDGER_COLUMNS",
    "PARTITION_COLUMNS",
    "archive_arrow_schema",
    "archive_spark_schema",
    "escape_partition_value",
    "ledger_arrow_schema",
    "ledger_spark_schema",
]

PARTITION_COLUMNS = ("date", "queue")
"""Path partitions: the UTC day the message was parked (or archived), and its parking queue."""

# (name, arrow type name, nullable, meaning). Kept as data so the pyarrow and
# Spark schemas cannot drift apart.
ARCHIVE_COLUMNS: tuple[tuple[str, str, bool, str], ...] = (
    ("message_key", "string", False, "sha256 of exchange, routing key, headers and body"),
    ("body", "binary", False, "the message body, byte for byte"),
    ("headers_json", "string", False, "every header as JSON (see delayed_retry.spark.codec)"),
    ("exchange", "string", False, "exchange the parked message was delivered through"),
    ("routing_key", "string", False, "its routing key (for parked messages: the failing queue)"),
    ("origin_queue", "string", True, "the queue a redrive sends it back to; null if unknown"),
    ("content_type", "string", True, "AMQP content-type"),
    ("content_encoding", "string", True, "AMQP content-encoding"),
    ("message_id", "string", True, "AMQP message-id"),
    ("correlation_id", "string", True, "AMQP correlation-id"),
    ("retries", "int64", True, "x-retry: delayed retries made before parking"),
    ("parked_reason", "string", True, "x-parked-reason"),
    ("exception_type", "string", True, "x-exception-type"),
    ("exception_message", "string", True, "x-exception-message"),
    ("exception_traceback", "string", True, "x-exception-traceback"),
    ("last_error", "string", True, "x-retry-last-error"),
    ("first_failure_at", "timestamp", True, "x-retry-first-failure-at"),
    ("last_failure_at", "timestamp", True, "x-retry-last-failure-at"),
    ("parked_at", "timestamp", True, "x-parked-at"),
    ("archived_at", "timestamp", False, "when the archiver read it"),
    ("redelivered", "bool", False, "the broker had delivered it before (a possible duplicate)"),
)

LEDGER_COLUMNS: tuple[tuple[str, str, bool, str], ...] = (
    ("run_id", "string", False, "the redrive id or schedule id"),
    ("message_key", "string", False, "the archived message's key, or the row key"),
    ("sent_at", "timestamp", False, "when the broker confirmed the publish"),
)


_TYPES: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "string": (lambda pa: pa.string(), lambda T: T.StringType()),
    "binary": (lambda pa: pa.binary(), lambda T: T.BinaryType()),
    "int64": (lambda pa: pa.int64(), lambda T: T.LongType()),
    "bool": (lambda pa: pa.bool_(), lambda T: T.BooleanType()),
    "timestamp": (lambda pa: pa.timestamp("ms", tz="UTC"), lambda T: T.TimestampType()),
}
"""Each column type as pyarrow's type (given the ``pyarrow`` module) and as Spark's (given
``pyspark.sql.types``): both are imported only when a schema is asked for."""


def _arrow_type(name: str) -> Any:
    import pyarrow as pa

    return _TYPES[name][0](pa)


def _spark_type(name: str) -> Any:
    from pyspark.sql import types as T

    return _TYPES[name][1](T)


def archive_arrow_schema() -> Any:
    """The pyarrow schema of an archive part file (partition columns excluded)."""
    import pyarrow as pa

    return pa.schema([pa.field(n, _arrow_type(t), nullable=nl) for n, t, nl, _ in ARCHIVE_COLUMNS])


def archive_spark_schema() -> Any:
    """The Spark schema of a whole archive, partition columns (strings) included.

    Reading with this schema keeps ``date`` and ``queue`` strings whatever they
    look like (a queue named ``2024`` stays text).
    """
    from pyspark.sql import types as T

    fields = [T.StructField(n, _spark_type(t), nullable=True) for n, t, _, _ in ARCHIVE_COLUMNS]
    fields += [T.StructField(p, T.StringType(), nullable=True) for p in PARTITION_COLUMNS]
    return T.StructType(fields)


def ledger_arrow_schema() -> Any:
    """The pyarrow schema of a ledger part file."""
    import pyarrow as pa

    return pa.schema([pa.field(n, _arrow_type(t), nullable=nl) for n, t, nl, _ in LEDGER_COLUMNS])


def ledger_spark_schema() -> Any:
    """The Spark schema of a ledger."""
    from pyspark.sql import types as T

    return T.StructType(
        [T.StructField(n, _spark_type(t), nullable=True) for n, t, _, _ in LEDGER_COLUMNS]
    )


# Characters Spark escapes in partition values (ExternalCatalogUtils.escapePathName).
_ESCAPED = set("\"#%'*/:=?\\\x7f{[]^") | {chr(c) for c in range(0x20)}


def escape_partition_value(value: str) -> str:
    """``value`` spelled as Spark spells a partition value in a path (``a/b`` → ``a%2Fb``)."""
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED else c for c in value)
