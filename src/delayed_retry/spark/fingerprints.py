"""The failure fingerprint as Spark columns, computed by :mod:`delayed_retry.parking.fingerprint`
itself.

The report groups by these columns and ``spark redrive --where`` can filter
on them (``fingerprint = 'cea31e990c07'``), so a group in the report is
exactly the set of rows the printed redrive command sends.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["FINGERPRINT_COLUMNS", "mentions_fingerprint", "with_fingerprint"]

FINGERPRINT_COLUMNS = ("fingerprint", "fingerprint_type", "fingerprint_template", "raising_frame")
"""Columns :func:`with_fingerprint` adds: the key, exception type, message template, frame."""

_MENTION = re.compile(r"\b(" + "|".join(FINGERPRINT_COLUMNS) + r")\b")


def mentions_fingerprint(predicate: str | None) -> bool:
    """True when a ``--where`` predicate uses a fingerprint column."""
    return bool(predicate and _MENTION.search(predicate))


def _fingerprint_row(
    exception_type: str | None,
    message: str | None,
    traceback: str | None,
    last_error: str | None,
) -> tuple[str, str, str, str | None]:
    from delayed_retry.headers.names import (
        X_EXCEPTION_MESSAGE,
        X_EXCEPTION_TRACEBACK,
        X_EXCEPTION_TYPE,
        X_LAST_ERROR,
    )
    from delayed_retry.parking.fingerprint import fingerprint_headers

    fp = fingerprint_headers(
        {
            X_EXCEPTION_TYPE: exception_type,
            X_EXCEPTION_MESSAGE: message,
            X_EXCEPTION_TRACEBACK: traceback,
            X_LAST_ERROR: last_error,
        }
    )
    return fp.key, fp.exception_type, fp.template, fp.frame


def with_fingerprint(frame: Any) -> Any:
    """``frame`` (archive columns) plus the :data:`FINGERPRINT_COLUMNS`.

    A Python UDF (Arrow-batched): the fingerprint's patterns and its
    fixed-point templating are not expressible in Spark's built-in
    functions, and one function for every consumer is the point.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    result = T.StructType(
        [
            T.StructField("key", T.StringType(), False),
            T.StructField("type", T.StringType(), False),
            T.StructField("template", T.StringType(), False),
            T.StructField("frame", T.StringType(), True),
        ]
    )
    compute = F.udf(_fingerprint_row, result, useArrow=True)
    fp = compute(
        F.col("exception_type"),
        F.col("exception_message"),
        F.col("exception_traceback"),
        F.col("last_error"),
    )
    return (
        frame.withColumn("_fp", fp)
        .withColumn("fingerprint", F.col("_fp.key"))
        .withColumn("fingerprint_type", F.col("_fp.type"))
        .withColumn("fingerprint_template", F.col("_fp.template"))
        .withColumn("raising_frame", F.col("_fp.frame"))
        .drop("_fp")
    )
