"""Publish a DataFrame's rows through the delay chain from the Spark executors.

Rows reach the executors as Arrow batches (``mapInArrow``), in the columns
of :data:`PUBLISH_COLUMNS`. Each partition opens one AMQP connection,
publishes with publisher confirms (a bounded window in flight), and records
every confirmed key in the ledger itself, a file per
:attr:`PublishJob.ledger_every` confirms. It never raises: it returns how
many rows it sent, its first error and the ledger files it wrote, so Spark
never retries a half-sent partition because of the broker. If Spark retries
the task anyway (a lost executor), the new attempt skips the keys its
earlier attempts recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

from delayed_retry import encoding
from delayed_retry.declare import declare_topology
from delayed_retry.durations import from_epoch_ms
from delayed_retry.errors import ConfigurationError, DelayedRetryError, DelayOutOfRangeError
from delayed_retry.topology import DelayTopology

if TYPE_CHECKING:
    from delayed_retry.spark.ledger import LedgerWriter

__all__ = [
    "PUBLISH_COLUMNS",
    "PublishJob",
    "PublishOutcome",
    "PublishRunError",
    "declare_destinations",
    "publish_attempt",
    "publish_partition",
    "publishing_partitions",
    "run_publish",
]

log = logging.getLogger(__name__)

PUBLISH_COLUMNS = (
    "message_key",
    "destination",
    "due_at_ms",
    "body",
    "headers_json",
    "content_type",
    "content_encoding",
    "message_id",
    "correlation_id",
)
"""The columns of a DataFrame handed to :func:`run_publish`, in this order."""

RESULT_SCHEMA = "sent long, error string, files array<string>"
"""What each partition returns: rows confirmed, first error (or null), ledger files written."""


class PublishRunError(DelayedRetryError):
    """Some rows were not confirmed; the ledger holds the ones that were. Run again to finish."""


@dataclass(frozen=True, kw_only=True)
class PublishJob:
    """Everything an executor needs to publish; pickled and shipped with the task."""

    url: str
    topology: DelayTopology
    run_id: str
    run_header: str
    ledger: str
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    window: int = 256
    publish_timeout: float = 30.0
    drop_headers: tuple[str, ...] = ()
    ledger_every: int = 20_000
    due_offset_ms: int = 0
    """Added to every row's ``due_at_ms``: a redrive at a rate plans offsets from 0 and sets
    this when publishing starts, so the rate holds from then, not from when the job was
    planned (reading and sorting the archive would otherwise make the first rows late)."""


_LEDGER_FAILED = "the ledger cannot be written"

_SHARE_THE_LEDGER = (
    "put the ledger on storage every executor and the driver reach (HDFS, S3, a shared mount)"
)


@dataclass(frozen=True, kw_only=True)
class PublishOutcome:
    """What a run sent: rows confirmed (all in the ledger), and each partition's first error."""

    sent: int
    errors: tuple[str, ...]
    ledger: str

    def raise_for_errors(self, what: str, *, rerun: str, of: int | None = None) -> None:
        """Raise :class:`PublishRunError` saying what ``what`` sent and how to finish, if it failed.

        ``rerun`` completes "so ... to send the rest", e.g. "run the same command again".
        """
        if not self.errors:
            return
        ledger_errors = [e for e in self.errors if e.startswith(_LEDGER_FAILED)]
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


@lru_cache(maxsize=1024)
def _decoded_headers(text: str | None) -> dict[str, Any]:
    """Headers JSON decoded and sanitized once per distinct text (bulk rows often share it)."""
    from delayed_retry.headers import sanitize_headers
    from delayed_retry.spark.codec import headers_from_json

    return sanitize_headers(headers_from_json(text))


def _properties(row: Sequence[Any], job: PublishJob, due_ms: int) -> Any:
    from pamqp import commands as spec

    from delayed_retry.headers import X_DUE_AT

    headers = dict(_decoded_headers(row[4]))
    for name in job.drop_headers:
        headers.pop(name, None)
    headers[job.run_header] = job.run_id
    headers[X_DUE_AT] = due_ms
    return spec.Basic.Properties(
        content_type=row[5],
        content_encoding=row[6],
        headers=headers,
        delivery_mode=2,
        message_id=row[7],
        correlation_id=row[8],
    )


def _rows(batches: Iterable[Any], skip: set[str]) -> Iterator[tuple[Any, ...]]:
    """The rows of Arrow record batches as tuples, without the keys in ``skip``."""
    for batch in batches:
        columns = [batch.column(name).to_pylist() for name in PUBLISH_COLUMNS]
        for row in zip(*columns, strict=True):
            if row[0] not in skip:
                yield row


async def _publish_partition(
    job: PublishJob, rows: Iterable[Sequence[Any]], ledger: LedgerWriter
) -> str | None:
    """Publish ``rows``, adding each confirmed key to ``ledger``; return the first error."""
    from delayed_retry.batching import connect_batched
    from delayed_retry.publishing import publish_confirmed

    errors: list[str] = []
    try:
        connection = await connect_batched(job.url, timeout=job.publish_timeout)
    except Exception as exc:
        return f"cannot connect to the broker: {exc!r}"
    try:
        channel = await connection.channel(publisher_confirms=True)
        # Rows start in bursts, so that their frames leave in one write (see batching).
        burst = max(1, job.window // 4)
        in_flight = 0
        space = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        topology = job.topology
        unit_ms = topology.unit_ms

        async def one(row: Sequence[Any]) -> None:
            try:
                due_ms = int(row[2]) + job.due_offset_ms
                # Floor of now: the computed delay is never shorter than the true one.
                units = encoding.units_for_ms(max(due_ms - time.time_ns() // 1_000_000, 0), unit_ms)
                if units > topology.max_units:
                    raise DelayOutOfRangeError(
                        f"row {row[0]!r} is due at {from_epoch_ms(due_ms)}, beyond the "
                        f"{topology.max_delay} the topology holds; add levels"
                    )
                route = topology.route(units, row[1])
                await publish_confirmed(
                    channel,
                    exchange=route.exchange,
                    routing_key=route.routing_key,
                    body=bytes(row[3]),
                    properties=_properties(row, job, due_ms),
                    timeout=job.publish_timeout,
                    wait_for_write=False,
                )
                ledger.add(row[0], time.time_ns() // 1_000_000)
            except Exception as exc:
                if not errors:
                    errors.append(str(exc) or repr(exc))
            finally:
                nonlocal in_flight
                in_flight -= 1
                if in_flight <= job.window - burst:
                    space.set()

        async def launch(batch: list[Sequence[Any]]) -> None:
            nonlocal in_flight
            while in_flight + len(batch) > job.window:
                space.clear()
                await space.wait()
            if ledger.due:
                _flush(ledger, errors)
            for row in batch:
                in_flight += 1
                task = asyncio.create_task(one(row))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        try:
            batch: list[Sequence[Any]] = []
            for row in rows:
                if errors:
                    break
                batch.append(row)
                if len(batch) >= burst:
                    await launch(batch)
                    batch = []
            if batch and not errors:
                await launch(batch)
        finally:
            # Publishes in flight finish (confirmed or not) before the ledger's last flush.
            if tasks:
                await asyncio.gather(*tasks)
    except Exception as exc:  # the channel would not open, or reading the rows failed
        errors.append(str(exc) or repr(exc))
    finally:
        _flush(ledger, errors)
        try:
            await connection.close()
        except Exception:  # the broker may be gone; what was confirmed is recorded
            log.debug("closing a publisher connection failed", exc_info=True)
    return errors[0] if errors else None


def _flush(ledger: LedgerWriter, errors: list[str]) -> None:
    pending = ledger.pending
    try:
        ledger.flush()
    except Exception as exc:
        # Confirmed but unrecorded: stop, and say that a re-run sends these again.
        errors.insert(
            0,
            f"{_LEDGER_FAILED} ({exc}); {pending} confirmed messages are not recorded and a "
            "re-run sends them again. Fix the ledger storage first",
        )


def publish_partition(job: PublishJob, batches: Iterator[Any]) -> Iterator[Any]:
    """The ``mapInArrow`` function: publish one partition, yield its :data:`RESULT_SCHEMA` row."""
    from pyspark import TaskContext

    context = TaskContext.get()
    yield publish_attempt(
        job,
        batches,
        partition=context.partitionId() if context is not None else 0,
        retried=context is not None and context.attemptNumber() > 0,
    )


def publish_attempt(
    job: PublishJob, batches: Iterable[Any], *, partition: int, retried: bool
) -> Any:
    """One attempt at one partition; a ``retried`` attempt skips what earlier ones recorded.

    Returns a one-row Arrow batch of :data:`RESULT_SCHEMA`.
    """
    import pyarrow as pa

    from delayed_retry.spark.ledger import LedgerWriter, recorded_keys

    stem = f"part-{job.token}-p{partition:05d}"
    ledger = LedgerWriter(job.ledger, job.run_id, stem=stem, every=job.ledger_every)
    skip = recorded_keys(job.ledger, stem) if retried else set()
    error = asyncio.run(_publish_partition(job, _rows(batches, skip), ledger))
    return pa.RecordBatch.from_pydict(
        {"sent": [ledger.recorded], "error": [error], "files": [ledger.files]},
        schema=pa.schema(
            [("sent", pa.int64()), ("error", pa.string()), ("files", pa.list_(pa.string()))]
        ),
    )


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


def run_publish(frame: Any, job: PublishJob) -> PublishOutcome:
    """Publish every row of ``frame`` (columns :data:`PUBLISH_COLUMNS`) from the executors.

    Raises :class:`PublishRunError`, before sending, when a file an executor
    writes to the ledger is not visible to the driver (the ledger must be on
    storage both reach), and :class:`~delayed_retry.spark.sinks.ArchiveSinkError`
    when the driver cannot write the ledger.
    """
    from delayed_retry.spark.ledger import ledger_files
    from delayed_retry.spark.sinks import sink_for

    sink_for(job.ledger)  # a ledger that cannot be written fails here, before any send
    _check_ledger_shared(frame.sparkSession, job)
    results = (
        frame.select(*PUBLISH_COLUMNS)
        .mapInArrow(partial(publish_partition, job), RESULT_SCHEMA)
        .collect()
    )
    sent = sum(int(r["sent"]) for r in results)
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
    return PublishOutcome(sent=sent, errors=errors, ledger=job.ledger)


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
