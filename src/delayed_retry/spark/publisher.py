"""Publish a DataFrame's rows through the delay chain: the driver's side of a run.

:func:`run_publish` checks that the executors and the driver share the
ledger, hands each partition to
:func:`~delayed_retry.spark.partition_publish.publish_partition` on the
executors, and adds up what they return (:class:`PublishOutcome`). The
bulk schedule and the redrive both publish through it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

from delayed_retry.amqp.declarer import declare_topology
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.errors import ConfigurationError, DelayedRetryError
from delayed_retry.spark.partition_publish import (
    LEDGER_FAILED,
    PUBLISH_COLUMNS,
    RESULT_SCHEMA,
    PublishJob,
    publish_partition,
)

__all__ = [
    "PublishOutcome",
    "PublishRunError",
    "barrier_slots",
    "declare_destinations",
    "publishing_partitions",
    "run_publish",
]

log = logging.getLogger(__name__)


class PublishRunError(DelayedRetryError):
    """Some rows were not confirmed; the ledger holds the ones that were. Run again to finish."""


_SHARE_THE_LEDGER = (
    "put the ledger on storage every executor and the driver reach (HDFS, S3, a shared mount)"
)


@dataclass(frozen=True, kw_only=True)
class PublishOutcome:
    """What a run sent: rows confirmed (all in the ledger), and each partition's first error.

    For an anchored run, ``start_ms`` is the agreed start (epoch ms), ``ready_ms`` when the
    last partition was ready, and ``late`` how many rows were published after their due time.
    """

    sent: int
    errors: tuple[str, ...]
    ledger: str
    start_ms: int | None = None
    ready_ms: int | None = None
    late: int = 0

    def raise_for_errors(self, what: str, *, rerun: str, of: int | None = None) -> None:
        """Raise :class:`PublishRunError` saying what ``what`` sent and how to finish, if it failed.

        ``rerun`` completes "so ... to send the rest", e.g. "run the same command again".
        """
        if not self.errors:
            return
        ledger_errors = [e for e in self.errors if e.startswith(LEDGER_FAILED)]
        if ledger_errors:
            raise PublishRunError(
                f"{what} stopped after {self.sent} recorded sends: {ledger_errors[0]}"
            )
        total = f" of {of}" if of is not None else ""
        raise PublishRunError(
            f"{what} sent {self.sent}{total} messages, then failed: {self.errors[0]}; the "
            f"ledger {self.ledger!r} records the {self.sent}, so {rerun} to send the rest"
        )


def publishing_partitions(spark: Any, partitions: int | None) -> int:
    """How many partitions, so connections, publish at once: ``partitions``, else one per core.

    "One per core" is Spark's default parallelism (the executors' cores).
    Publishing uses an explicit count because Spark's adaptive execution would
    otherwise merge small shuffle partitions, leaving cores idle.
    """
    if partitions is not None:
        if partitions < 1:
            raise ConfigurationError(f"partitions={partitions!r} must be 1 or more")
        return partitions
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        return max(1, int(spark.conf.get("spark.sql.shuffle.partitions")))


def _probe_partition(job: PublishJob, batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    from delayed_retry.spark.ledger import write_marker

    for _ in batches:
        pass
    yield pa.RecordBatch.from_pydict({"name": [write_marker(job.ledger, f"probe-{job.token}")]})


def _check_ledger_shared(spark: Any, job: PublishJob) -> None:
    """Fail before sending when a file an executor writes to the ledger is not visible here."""
    from delayed_retry.spark.ledger import ledger_files, remove_files

    probe = spark.range(1, numPartitions=1).mapInArrow(
        partial(_probe_partition, job), "name string"
    )
    names = [row["name"] for row in probe.collect()]
    visible = set(ledger_files(job.ledger, f"probe-{job.token}"))
    if not set(names) <= visible:
        raise PublishRunError(
            f"a file an executor wrote to the ledger {job.ledger!r} is not visible to the driver; "
            f"{_SHARE_THE_LEDGER}. Nothing was sent"
        )
    try:
        remove_files(job.ledger, names)
    except OSError:  # an empty file left in the ledger is harmless
        log.debug("could not remove the ledger probe %s", names, exc_info=True)


@contextmanager
def _job_failure(job: PublishJob) -> Iterator[None]:
    """Turn the publishing job's failure (a lost executor in a barrier stage, which Spark does
    not retry) into a :class:`PublishRunError` counting what the partitions recorded."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    from delayed_retry.spark.dataset import root_cause
    from delayed_retry.spark.ledger import recorded_keys

    try:
        yield
    except (PySparkException, Py4JJavaError) as exc:
        recorded = len(recorded_keys(job.ledger, f"part-{job.token}"))
        raise PublishRunError(
            f"the publishing job failed after {recorded} recorded sends: {root_cause(exc)}; the "
            f"ledger {job.ledger!r} records them, so the same command run again sends only "
            "the rest"
        ) from exc


def run_publish(frame: Any, job: PublishJob) -> PublishOutcome:
    """Publish every row of ``frame`` (columns :data:`PUBLISH_COLUMNS`) from the executors.

    Raises :class:`PublishRunError`, before sending, when a file an executor
    writes to the ledger is not visible to the driver (the ledger must be on
    storage both reach), and :class:`~delayed_retry.spark.sinks.ArchiveSinkError`
    when the driver cannot write the ledger. A publishing job that Spark gives
    up on (a lost executor in a rated, barrier-mode run) raises
    :class:`PublishRunError` too, with the count the ledger recorded.
    """
    from delayed_retry.spark.ledger import ledger_files
    from delayed_retry.spark.sinks import sink_for

    sink_for(job.ledger)  # a ledger that cannot be written fails here, before any send
    _check_ledger_shared(frame.sparkSession, job)
    with _job_failure(job):
        results = (
            frame.select(*PUBLISH_COLUMNS)
            .mapInArrow(partial(publish_partition, job), RESULT_SCHEMA, barrier=job.anchored)
            .collect()
        )
    sent = sum(int(r["sent"]) for r in results)
    starts = {int(r["start_ms"]) for r in results if r["start_ms"] is not None}
    ready = [int(r["ready_ms"]) for r in results if r["ready_ms"] is not None]
    errors = tuple(r["error"] for r in results if r["error"])
    files = tuple(f for r in results for f in r["files"] or ())
    visible = set(ledger_files(job.ledger, f"part-{job.token}")) if files else set()
    unseen = sorted(set(files) - visible)
    if unseen:
        raise PublishRunError(
            f"the executors recorded {sent} sends in ledger files the driver cannot see in "
            f"{job.ledger!r} (such as {unseen[0]!r}); {_SHARE_THE_LEDGER} before running again, "
            "or those messages are sent twice"
        )
    if len(starts) > 1:  # cannot happen: every partition computes it from the same values
        raise PublishRunError(f"the partitions disagreed on the start: {sorted(starts)}")
    return PublishOutcome(
        sent=sent,
        errors=errors,
        ledger=job.ledger,
        start_ms=starts.pop() if starts else None,
        ready_ms=max(ready) if ready else None,
        late=sum(int(r["late"] or 0) for r in results),
    )


def barrier_slots(spark: Any) -> int:
    """How many tasks can run at once: the most partitions a barrier stage may have."""
    from delayed_retry.spark.session import default_parallelism

    try:
        per_task = max(1, int(spark.conf.get("spark.task.cpus", "1")))
    except Exception:
        per_task = 1
    return max(1, default_parallelism(spark) // per_task)


async def declare_destinations(
    url: str, topology: DelayTopology, queues: Sequence[str], *, timeout: float = 60.0
) -> None:
    """Declare the topology and bind ``queues`` to it, once, on the driver, before sending."""
    import aio_pika

    async def declare() -> None:
        connection = await aio_pika.connect(url, timeout=timeout)
        try:
            channel = await connection.channel()
            await declare_topology(channel, topology, queues=queues)
        finally:
            await connection.close()

    try:
        await asyncio.wait_for(declare(), timeout)
    except TimeoutError as exc:
        raise PublishRunError(
            f"the broker did not answer within {timeout:.0f} s while declaring the delay "
            f"topology {topology.prefix!r}; nothing was sent. Check --url and the broker"
        ) from exc
