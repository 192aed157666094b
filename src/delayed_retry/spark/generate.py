"""A large synthetic archive, fast: for benchmarks and for trying the report on a big incident.

:func:`generate_archive` writes ``rows`` parked messages with pyarrow in
column batches (no per-row Python objects beyond the strings), shaped like
an incident: a few queues, a dominant transient failure whose messages
differ only in an order number, a permanent one, a rare one, spread over
``hours`` with a quiet gap in the middle. For a handful of rows that look
exactly like what the library parks, use :mod:`delayed_retry.spark.synthetic`.
"""

from __future__ import annotations

import hashlib
import json
import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

from delayed_retry.spark.schema import archive_arrow_schema, escape_partition_value
from delayed_retry.spark.sinks import LocalSink

__all__ = ["generate_archive"]

_FAILURES = (
    # (weight, exception type, message with {n}, queue)
    (51, "shop.GatewayTimeout", "gateway did not answer in 10 s (order {n})", "orders"),
    (30, "shop.ValidationError", "field 'sku' missing in order {n}", "orders"),
    (15, "ConnectionRefusedError", "[Errno 111] connect to 10.0.0.{m}:5432 refused", "payments"),
    (4, "KeyError", "'customer-{n}'", "invoices"),
)


def generate_archive(
    root: str | Path,
    *,
    rows: int,
    hours: int = 72,
    start: datetime = datetime(2026, 1, 1, tzinfo=UTC),
    seed: int = 7,
    batch: int = 200_000,
) -> int:
    """Write ``rows`` synthetic parked messages under ``root``; return the number of part files."""
    import pyarrow as pa

    if rows < 1:
        raise ValueError(f"rows={rows!r} must be at least 1")
    rng = random.Random(seed)
    sink = LocalSink(str(root))
    weights = [f[0] for f in _FAILURES]
    span_ms = hours * 3600 * 1000
    # A quiet gap through the middle 70 % of the span (an incident, then a relapse).
    gap = (int(span_ms * 0.2), int(span_ms * 0.9))
    files = 0
    for offset in range(0, rows, batch):
        n = min(batch, rows - offset)
        picks = rng.choices(range(len(_FAILURES)), weights=weights, k=n)
        data: dict[str, list[object]] = {name: [] for name in archive_arrow_schema().names}
        for i, pick in enumerate(picks):
            number = offset + i
            _, kind, template, queue = _FAILURES[pick]
            at = rng.randrange(span_ms)
            if gap[0] <= at < gap[1]:
                at = at % gap[0]
            parked = start + timedelta(milliseconds=at)
            message = template.format(n=number, m=number % 250)
            body = json.dumps({"order": number}).encode()
            data["message_key"].append(hashlib.sha256(body + kind.encode()).hexdigest())
            data["body"].append(body)
            data["headers_json"].append("{}")
            data["exchange"].append("delays.parking")
            data["routing_key"].append(queue)
            data["origin_queue"].append(queue)
            data["content_type"].append("application/json")
            data["content_encoding"].append(None)
            data["message_id"].append(f"{queue}-{number}")
            data["correlation_id"].append(None)
            data["retries"].append(0 if "Validation" in kind else 5)
            data["parked_reason"].append("rejected" if "Validation" in kind else "max-retries")
            data["exception_type"].append(kind)
            data["exception_message"].append(message)
            data["exception_traceback"].append(
                'Traceback (most recent call last):\n  File "/srv/shop/handlers.py", '
                f"line 42, in handle_{queue}\n{kind}: {message}\n"
            )
            data["last_error"].append(f"{kind}: {message}")
            data["first_failure_at"].append(parked - timedelta(seconds=60))
            data["last_failure_at"].append(parked - timedelta(seconds=5))
            data["parked_at"].append(parked)
            data["archived_at"].append(parked + timedelta(minutes=5))
            data["redelivered"].append(False)
        table = pa.Table.from_pydict(data, schema=archive_arrow_schema())
        sink.write(table, f"date={start:%Y-%m-%d}/queue={escape_partition_value('all.parking')}")
        files += 1
    return files
