"""Send archived (parked) messages back to their queues, selected with Spark SQL, at a rate.

Only rows the operator selected are sent, and each only to the queue the
archive recorded for it (``origin_queue``: the parking routing key, or
``x-retry-queue`` for messages the library did not park). Message *i* of a
run is due ``i / rate`` seconds after publishing starts: the publishing
partitions connect and read their first rows, then agree on one start just
after the last of them is ready, so neither Spark's planning nor an
executor's start-up makes the first messages late. The delay chain spreads
the load, so the executors publish as fast as confirms allow. Each message carries
``x-redrive-id``; the ledger records every confirmed send, so running the
same redrive again sends only what is missing.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.durations import from_epoch_ms, to_epoch_ms, utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.names import X_REDRIVE_ID, X_RETRY
from delayed_retry.spark.dataset import read_archive, reading
from delayed_retry.spark.fingerprints import (
    FINGERPRINT_COLUMNS,
    mentions_fingerprint,
    with_fingerprint,
)
from delayed_retry.spark.ledger import ledger_keys
from delayed_retry.spark.partition_publish import PUBLISH_COLUMNS, PublishJob
from delayed_retry.spark.publisher import (
    barrier_slots,
    declare_destinations,
    publishing_partitions,
    run_publish,
)

__all__ = ["RedriveError", "RedriveResult", "default_redrive_id", "redrive", "where_error"]

log = logging.getLogger(__name__)


class RedriveError(ConfigurationError):
    """A redrive could not start: its selection (``--where``) is not a valid predicate."""


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
    ready_at: datetime | None = None
    """With a rate: when the last publishing partition was ready (the start is just after)."""
    late: int = 0
    """With a rate: messages published after their due time (the publishers fell behind)."""


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
    columns = frame.columns
    if mentions_fingerprint(where):
        # The report's redrive commands select a failure group by its fingerprint.
        frame = with_fingerprint(frame)
    try:
        selected = frame.where(F.expr(where)).select(*columns)
        selected.schema  # noqa: B018  (forces analysis: a bad column fails here)
    except PySparkException as exc:
        raise RedriveError(
            where_error(
                where,
                condition=exc.getCondition(),
                parameters=exc.getMessageParameters() or {},
                message=_one_line(exc),
                columns=[*columns, *FINGERPRINT_COLUMNS],
            )
        ) from exc
    return selected


def where_error(
    where: str,
    *,
    condition: str | None,
    parameters: Mapping[str, str],
    message: str,
    columns: Sequence[str],
) -> str:
    """One line saying what is wrong with a ``--where`` predicate, and the columns it can use.

    An unknown column is named (Spark's own suggestions leave columns out);
    any other error keeps Spark's first line, without its SQLSTATE.
    """
    known = ", ".join(columns)
    if condition is not None and condition.startswith("UNRESOLVED_COLUMN"):
        name = parameters.get("objectName", "").replace("`", "")
        return (
            f"--where {where!r} names column {name!r}, which the archive does not have; "
            f"its columns are {known}"
        )
    reason = re.sub(r"\s*SQLSTATE: \w+.*$", "", message).rstrip(" .;")
    return f"--where {where!r} is not a valid Spark SQL predicate: {reason}; columns: {known}"


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
    partitions: int | None = None,
    now: datetime | None = None,
) -> RedriveResult:
    """Redrive the archived messages matching ``where`` to their queues; return what happened.

    Use it after fixing the cause of an incident. ``rate`` (messages per
    second) spreads the sends through the delay chain; without it every
    message is due at once. ``dry_run`` counts and plans without a broker.
    ``partitions`` publishing connections run at once (default: one per
    executor core).
    The ledger defaults to ``<first archive>/_ledger``. A redriven message
    gets a fresh retry budget (its ``x-retry`` is removed) and ``x-redrive-id``.
    Raises :class:`RedriveError` for a bad predicate, and
    :class:`~delayed_retry.spark.publisher.PublishRunError` when the broker
    fails part-way (after recording what was confirmed).
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    path_list = [paths] if isinstance(paths, str) else list(paths)
    if rate is not None and (not math.isfinite(rate) or rate <= 0):
        raise ConfigurationError(f"rate={rate!r} must be a positive number of messages per second")
    if not dry_run and not url:
        raise ConfigurationError("a broker url is needed unless dry_run=True")
    run_id = redrive_id or default_redrive_id(path_list, where)
    ledger_path = ledger or _default_ledger(path_list[0])
    frame = _select(spark, read_archive(spark, path_list), where)
    n = publishing_partitions(spark, partitions)
    if rate:
        # Every partition publishes at once to agree on the start (Spark's barrier mode).
        n = min(n, barrier_slots(spark))
    frame = frame.repartition(n, "message_key").dropDuplicates(["message_key"])
    sent_before = ledger_keys(spark, ledger_path, run_id).withColumn("_sent", F.lit(True))
    # Kept for the publish job, so the archive is read, deduplicated and joined once.
    marked = frame.join(sent_before, on="message_key", how="left").persist(
        StorageLevel.MEMORY_AND_DISK
    )
    try:
        return _run(
            spark,
            marked,
            path_list,
            run_id,
            ledger_path,
            url,
            rate,
            dry_run,
            topology,
            window,
            n,
            now,
        )
    finally:
        marked.unpersist()


def _run(
    spark: Any,
    marked: Any,
    path_list: list[str],
    run_id: str,
    ledger_path: str,
    url: str | None,
    rate: float | None,
    dry_run: bool,
    topology: DelayTopology,
    window: int,
    partitions: int,
    now: datetime | None,
) -> RedriveResult:
    from pyspark.sql import functions as F

    # One small aggregation gives every count the result reports.
    with reading(path_list):
        groups = (
            marked.groupBy("origin_queue", F.col("_sent").isNotNull().alias("sent"))
            .agg(F.count(F.lit(1)).alias("n"))
            .collect()
        )
    selected_total = sum(int(g["n"]) for g in groups)
    already = sum(int(g["n"]) for g in groups if g["sent"])
    without_queue = sum(int(g["n"]) for g in groups if not g["sent"] and g["origin_queue"] is None)
    by_queue: dict[str, int] = {}
    for g in groups:
        if not g["sent"] and g["origin_queue"] is not None:
            by_queue[g["origin_queue"]] = by_queue.get(g["origin_queue"], 0) + int(g["n"])
    to_send = sum(by_queue.values())
    sendable = marked.where(F.col("_sent").isNull() & F.col("origin_queue").isNotNull())
    start = now or utcnow()
    start_ms = to_epoch_ms(start)

    def due_ms(index: int) -> int:
        return start_ms + _offset_ms(index, rate)

    result = RedriveResult(
        redrive_id=run_id,
        selected=selected_total,
        already_sent=already,
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
    job = PublishJob(
        url=url,
        topology=topology,
        run_id=run_id,
        run_header=X_REDRIVE_ID,
        ledger=ledger_path,
        window=window,
        drop_headers=(X_RETRY,),
    )
    if rate:
        # Offsets from 0: the partitions agree on the start once all of them are ready.
        sendable, due = _spread(sendable, 0, rate, partitions)
        job = replace(job, anchored=True)
    else:
        due = F.lit(start_ms)
    taken_from = {"destination": F.col("origin_queue"), "due_at_ms": due}
    columns = sendable.select(
        *(taken_from.get(name, F.col(name)).alias(name) for name in PUBLISH_COLUMNS)
    )
    try:
        with reading(path_list):
            outcome = run_publish(columns, job)
    finally:
        if rate:
            sendable.unpersist()
    outcome.raise_for_errors(
        f"redrive {run_id!r}", of=to_send, rerun="run the same command again once it is fixed"
    )
    if outcome.late:
        log.warning(
            "%d of %d messages were published after their due time (the publishers could not "
            "keep up with --rate %s/s, or an executor stalled); they arrived late",
            outcome.late,
            to_send,
            rate,
        )
    if outcome.start_ms is None:
        return replace(result, sent=outcome.sent)
    # The plan as sent: offsets from the start the partitions agreed on.
    return replace(
        result,
        sent=outcome.sent,
        first_due_at=from_epoch_ms(outcome.start_ms + _offset_ms(0, rate)),
        last_due_at=from_epoch_ms(outcome.start_ms + _offset_ms(to_send - 1, rate)),
        ready_at=None if outcome.ready_ms is None else from_epoch_ms(outcome.ready_ms),
        late=outcome.late,
    )


def _offset_ms(index: int, rate: float | None) -> int:
    """When row ``index`` (oldest parked first) is due, in ms after the start."""
    return math.ceil(index * 1000 / rate) if rate else 0


def _spread(frame: Any, start_ms: int, rate: float, partitions: int) -> tuple[Any, Any]:
    """``frame`` oldest parked first (persisted), and a due-time column spreading it at ``rate``.

    Row ``i`` in (``parked_at``, ``message_key``) order is due at
    ``start + ceil(i * 1000 / rate)`` ms. ``i`` is computed as ``zipWithIndex``
    does, without leaving the DataFrame: the ``partitions`` ranges are in order,
    ``monotonically_increasing_id`` holds the partition number above bit 33
    and the position within the partition below, and a partition's offset is
    the row count of the partitions before it. Unpersist the frame when done.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    order = (F.col("parked_at").asc_nulls_first(), F.col("message_key"))
    ordered = (
        frame.repartitionByRange(partitions, *order)
        .sortWithinPartitions(*order)
        .withColumn("_row_id", F.monotonically_increasing_id())
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    partition = F.shiftright(F.col("_row_id"), 33)
    counts = sorted(
        (int(r["p"]), int(r["n"]))
        for r in ordered.groupBy(partition.alias("p")).agg(F.count(F.lit(1)).alias("n")).collect()
    )
    offsets: list[Any] = []
    before = 0
    for number, n in counts:
        offsets += [F.lit(number), F.lit(before)]
        before += n
    index = F.create_map(*offsets)[partition] + F.col("_row_id").bitwiseAND(F.lit((1 << 33) - 1))
    due = F.lit(start_ms) + F.ceil(index * F.lit(1000) / F.lit(float(rate)))
    return ordered, due.cast("long")


def _default_ledger(archive: str) -> str:
    return archive.rstrip("/") + "/_ledger"
