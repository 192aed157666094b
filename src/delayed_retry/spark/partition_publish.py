"""One partition's publishing, on a Spark executor: the rows of a DataFrame into the chain.

Rows reach the executors as Arrow batches (``mapInArrow``), in the columns
of :data:`PUBLISH_COLUMNS`. Each partition opens one AMQP connection,
publishes with publisher confirms (a bounded window in flight), and records
every confirmed key in the ledger itself, a file per
:attr:`PublishJob.ledger_every` confirms. It never raises: it returns how
many rows it sent, its first error and the ledger files it wrote, so Spark
never retries a half-sent partition because of the broker. If Spark retries
the task anyway (a lost executor), the new attempt skips the keys its
earlier attempts recorded. The driver's side, which starts the run and
reads what the partitions return, is :mod:`delayed_retry.spark.publisher`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain import routing_keys
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.durations import from_epoch_ms
from delayed_retry.errors import DelayOutOfRangeError

if TYPE_CHECKING:
    from delayed_retry.spark.ledger import LedgerWriter

__all__ = [
    "LEDGER_FAILED",
    "PUBLISH_COLUMNS",
    "RESULT_SCHEMA",
    "PublishJob",
    "agreed_start",
    "publish_attempt",
    "publish_partition",
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


LEDGER_FAILED = "the ledger cannot be written"
"""How the error of a partition whose ledger could not be written begins."""


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
            f"{LEDGER_FAILED} ({exc}); {pending} confirmed messages are not recorded and a "
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
