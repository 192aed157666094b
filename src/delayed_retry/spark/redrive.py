"""Send archived (parked) messages back to their queues, selected with Spark SQL, at a rate.

Only rows the operator selected are sent, and each only to the queue the
archive recorded for it (``origin_queue``: the parking routing key, or
``x-retry-queue`` for messages the library did not park). Message *i* of a
run is due at ``start + i / rate``: the delay chain spreads the load, so the
executors publish as fast as confirms allow. Each message carries
``x-redrive-id``; the ledger records every confirmed send, so running the
same redrive again sends only what is missing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from delayed_retry.durations import from_epoch_ms, to_epoch_ms, utcnow
from delayed_retry.errors import ConfigurationError, DelayedRetryError
from delayed_retry.headers import X_RETRY
from delayed_retry.spark.dataset import read_archive
from delayed_retry.spark.ledger import append_ledger, ledger_keys
from delayed_retry.spark.publisher import (
    PUBLISH_COLUMNS,
    PublishJob,
    PublishRunError,
    declare_destinations,
    run_publish,
)
from delayed_retry.topology import DEFAULT_TOPOLOGY, DelayTopology

__all__ = ["X_REDRIVE_ID", "RedriveError", "RedriveResult", "default_redrive_id", "redrive"]

log = logging.getLogger(__name__)

X_REDRIVE_ID = "x-redrive-id"
"""Header naming the redrive a message was sent by."""


class RedriveError(DelayedRetryError):
    """A redrive could not start, or stopped part-way (the ledger holds what was sent)."""


@dataclass(frozen=True, kw_only=True)
class RedriveResult:
    """What a redrive selected and sent."""

    redrive_id: str
    selected: int
    already_sent: int
    without_queue: int
    to_send: int
    sent: int
    dry_run: bool
    by_queue: dict[str, int] = field(default_factory=dict)
    first_due_at: datetime | None = None
    last_due_at: datetime | None = None


def default_redrive_id(paths: Sequence[str], where: str | None) -> str:
    """The id of "this selection of these archives": the same command gets the same id."""
    text = "\n".join(sorted(os.path.abspath(p) if "://" not in p else p for p in paths))
    digest = hashlib.sha256(f"{text}\n{where or ''}".encode()).hexdigest()
    return f"redrive-{digest[:16]}"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _select(spark: Any, frame: Any, where: str | None) -> Any:
    from pyspark.errors import PySparkException
    from pyspark.sql import functions as F

    if not where:
        return frame
    try:
        selected = frame.where(F.expr(where))
        selected.schema  # noqa: B018  (forces analysis: a bad column fails here)
    except PySparkException as exc:
        raise RedriveError(
            f"--where {where!r} is not a valid Spark SQL predicate over the archive: "
            f"{_one_line(exc)}; columns are {', '.join(frame.columns)}"
        ) from exc
    return selected


def redrive(
    spark: Any,
    paths: str | Sequence[str],
    *,
    url: str | None,
    where: str | None = None,
    rate: float | None = None,
    dry_run: bool = False,
    redrive_id: str | None = None,
    ledger: str | None = None,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    window: int = 256,
    now: datetime | None = None,
) -> RedriveResult:
    """Redrive the archived messages matching ``where`` to their queues; return what happened.

    Use it after fixing the cause of an incident. ``rate`` (messages per
    second) spreads the sends through the delay chain; without it every
    message is due at once. ``dry_run`` counts and plans without a broker.
    The ledger defaults to ``<first archive>/_ledger``. A redriven message
    gets a fresh retry budget (its ``x-retry`` is removed) and ``x-redrive-id``.
    Raises :class:`RedriveError` for a bad predicate, and
    :class:`~delayed_retry.spark.publisher.PublishRunError` when the broker
    fails part-way (after recording what was confirmed).
    """
    from pyspark.sql import functions as F

    path_list = [paths] if isinstance(paths, str) else list(paths)
    if rate is not None and (not math.isfinite(rate) or rate <= 0):
        raise ConfigurationError(f"rate={rate!r} must be a positive number of messages per second")
    if not dry_run and not url:
        raise ConfigurationError("a broker url is needed unless dry_run=True")
    run_id = redrive_id or default_redrive_id(path_list, where)
    ledger_path = ledger or _default_ledger(path_list[0])
    frame = _select(spark, read_archive(spark, path_list), where)
    frame = frame.dropDuplicates(["message_key"])
    frame = frame.join(ledger_keys(spark, ledger_path, run_id), on="message_key", how="left_anti")
    counts = {
        (r["has_queue"]): r["n"]
        for r in frame.groupBy(F.col("origin_queue").isNotNull().alias("has_queue"))
        .agg(F.count(F.lit(1)).alias("n"))
        .collect()
    }
    sendable = frame.where(F.col("origin_queue").isNotNull())
    by_queue = {
        r["origin_queue"]: r["n"]
        for r in sendable.groupBy("origin_queue").agg(F.count(F.lit(1)).alias("n")).collect()
    }
    to_send = counts.get(True, 0)
    without_queue = counts.get(False, 0)
    selected_total = _count_selected(spark, path_list, where)
    start = now or utcnow()
    start_ms = to_epoch_ms(start)

    def due_ms(index: int) -> int:
        return start_ms + (math.ceil(index * 1000 / rate) if rate else 0)

    result = RedriveResult(
        redrive_id=run_id,
        selected=selected_total,
        already_sent=selected_total - to_send - without_queue,
        without_queue=without_queue,
        to_send=to_send,
        sent=0,
        dry_run=dry_run,
        by_queue=by_queue,
        first_due_at=from_epoch_ms(due_ms(0)) if to_send else None,
        last_due_at=from_epoch_ms(due_ms(to_send - 1)) if to_send else None,
    )
    if without_queue:
        log.warning(
            "%d selected messages record no queue (no parking routing key, no x-retry-queue); "
            "they are not sent",
            without_queue,
        )
    if dry_run or not to_send:
        return result
    assert url is not None
    asyncio.run(declare_destinations(url, topology, sorted(by_queue)))
    ordered = sendable.orderBy(F.col("parked_at").asc_nulls_first(), "message_key").select(
        "message_key",
        F.col("origin_queue").alias("destination"),
        "body",
        "headers_json",
        "content_type",
        "content_encoding",
        "message_id",
        "correlation_id",
    )
    rows = ordered.rdd.zipWithIndex().map(
        lambda pair: (
            pair[0][0],
            pair[0][1],
            due_ms(pair[1]),
            pair[0][2],
            pair[0][3],
            pair[0][4],
            pair[0][5],
            pair[0][6],
            pair[0][7],
        )
    )
    assert len(PUBLISH_COLUMNS) == 9
    job = PublishJob(
        url=url,
        topology=topology,
        run_id=run_id,
        run_header=X_REDRIVE_ID,
        window=window,
        drop_headers=(X_RETRY,),
    )
    outcome = run_publish(rows, job)
    append_ledger(ledger_path, run_id, outcome.sent)
    sent = len(outcome.sent)
    if outcome.errors:
        raise PublishRunError(
            f"redrive {run_id!r} sent {sent} of {to_send} messages, then failed: "
            f"{outcome.errors[0]}; the ledger {ledger_path!r} records the {sent}, so run the "
            "same command again once the broker is back to send the rest"
        )
    return RedriveResult(**{**result.__dict__, "sent": sent})


def _count_selected(spark: Any, paths: list[str], where: str | None) -> int:
    frame = _select(spark, read_archive(spark, paths), where)
    return int(frame.select("message_key").distinct().count())


def _default_ledger(archive: str) -> str:
    return archive.rstrip("/") + "/_ledger"
