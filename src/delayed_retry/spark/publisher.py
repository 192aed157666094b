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
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any

from delayed_retry import routing_keys
from delayed_retry.amqp.declare import declare_topology
from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
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
    "agreed_start",
    "barrier_slots",
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

RESULT_SCHEMA = (
    "sent long, error string, files array<string>, ready_ms long, start_ms long, late long"
)
"""What each partition returns: rows confirmed, first error (or null), ledger files written,
when it was ready to publish, the start its due times count from, and how many rows it
published after they were due (epoch ms; the last three null or 0 when not anchored)."""


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
    publish_timeout: float = DEFAULT_PUBLISH_TIMEOUT
    drop_headers: tuple[str, ...] = ()
    ledger_every: int = 20_000
    anchored: bool = False
    """``due_at_ms`` are offsets from a start every partition agrees on once all of them are
    ready to publish (connected, first rows read): a redrive at a rate holds its spacing from
    the first publish, whatever Spark's planning and the executors' start-up took. The
    publishing stage then runs in Spark's barrier mode: every partition at once."""
    start_margin_ms: int = 500
    """How far after the last partition is ready the anchored start is set: room for the
    agreement to reach every partition before the first row is due."""


_LEDGER_FAILED = "the ledger cannot be written"

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
    from delayed_retry.headers.values import sanitize_headers
    from delayed_retry.spark.codec import headers_from_json

    return sanitize_headers(headers_from_json(text))


def _properties(row: Sequence[Any], job: PublishJob, due_ms: int) -> Any:
    from pamqp import commands as spec

    from delayed_retry.headers.names import X_DUE_AT

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


@dataclass(kw_only=True)
class _Start:
    """The anchored start of one partition: agreed once, whatever happens (see :func:`agree`)."""

    agree: Callable[[int], int] | None
    ready_ms: int | None = None
    start_ms: int = 0
    agreed: bool = False
    late: int = 0

    async def settle(self) -> None:
        """Agree on the start, once; every partition must call it exactly once (barrier)."""
        if self.agree is None or self.ready_ms is not None:
            return
        self.ready_ms = time.time_ns() // 1_000_000
        self.start_ms = await asyncio.to_thread(self.agree, self.ready_ms)
        self.agreed = True


def agreed_start(ready_ms: Sequence[int], *, margin_ms: int) -> int:
    """The start every partition computes from all their ready times: the last, plus a margin."""
    return max(ready_ms) + margin_ms


async def _publish_partition(
    job: PublishJob, rows: Iterable[Sequence[Any]], ledger: LedgerWriter, start: _Start
) -> str | None:
    """Publish ``rows``, adding each confirmed key to ``ledger``; return the first error.

    An anchored partition connects and reads its first row, then agrees on
    the start (``start.settle``) before publishing anything.
    """
    from delayed_retry.amqp.batching import connect_batched
    from delayed_retry.amqp.publish import publish_confirmed

    errors: list[str] = []
    try:
        connection = await connect_batched(job.url, timeout=job.publish_timeout)
    except Exception as exc:
        return f"cannot connect to the broker: {exc!r}"
    try:
        channel = await connection.channel(publisher_confirms=True)
        pending = iter(rows)
        first = next(pending, None)
        await start.settle()
        rows = pending if first is None else itertools.chain([first], pending)
        # Rows start in bursts, so that their frames leave in one write (see batching).
        burst = max(1, job.window // 4)
        in_flight = 0
        space = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()
        topology = job.topology
        unit_ms = topology.unit_ms

        async def one(row: Sequence[Any]) -> None:
            try:
                due_ms = int(row[2]) + start.start_ms
                # Floor of now: the computed delay is never shorter than the true one.
                wait_ms = due_ms - time.time_ns() // 1_000_000
                if wait_ms < 0 and start.agree is not None:
                    start.late += 1
                units = routing_keys.units_for_ms(max(wait_ms, 0), unit_ms)
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
    from pyspark import BarrierTaskContext, TaskContext

    context = TaskContext.get()
    agree: Callable[[int], int] | None = None
    if job.anchored:
        barrier = BarrierTaskContext.get()

        def agree(ready_ms: int) -> int:
            every = [int(text) for text in barrier.allGather(str(ready_ms))]
            return agreed_start(every, margin_ms=job.start_margin_ms)

    yield publish_attempt(
        job,
        batches,
        partition=context.partitionId() if context is not None else 0,
        retried=context is not None and context.attemptNumber() > 0,
        agree=agree,
    )


def publish_attempt(
    job: PublishJob,
    batches: Iterable[Any],
    *,
    partition: int,
    retried: bool,
    agree: Callable[[int], int] | None = None,
) -> Any:
    """One attempt at one partition; a ``retried`` attempt skips what earlier ones recorded.

    ``agree`` (anchored jobs) takes this partition's ready time and returns
    the start every partition agreed on; it is called exactly once, even
    when the partition fails before publishing, so no partition waits for
    it in vain. Returns a one-row Arrow batch of :data:`RESULT_SCHEMA`.
    """
    import pyarrow as pa

    from delayed_retry.spark.ledger import LedgerWriter, recorded_keys

    stem = f"part-{job.token}-p{partition:05d}"
    ledger = LedgerWriter(job.ledger, job.run_id, stem=stem, every=job.ledger_every)
    start = _Start(agree=agree)

    async def attempt() -> str | None:
        try:
            skip = recorded_keys(job.ledger, stem) if retried else set()
            return await _publish_partition(job, _rows(batches, skip), ledger, start)
        finally:
            await start.settle()

    error = asyncio.run(attempt())
    return pa.RecordBatch.from_pydict(
        {
            "sent": [ledger.recorded],
            "error": [error],
            "files": [ledger.files],
            "ready_ms": [start.ready_ms],
            "start_ms": [start.start_ms if start.agreed else None],
            "late": [start.late],
        },
        schema=pa.schema(
            [
                ("sent", pa.int64()),
                ("error", pa.string()),
                ("files", pa.list_(pa.string())),
                ("ready_ms", pa.int64()),
                ("start_ms", pa.int64()),
                ("late", pa.int64()),
            ]
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
