"""Publish a DataFrame's rows through the delay chain from the Spark executors.

Each partition opens one aio-pika connection, publishes its rows with
publisher confirms (a bounded window of publishes in flight), and returns
the keys the broker confirmed together with the first error, if any. It
never raises, so Spark never retries a half-sent partition; the driver
records the confirmed keys in the ledger and then reports the error.

Rows reaching :func:`publish_rows` follow :data:`PUBLISH_COLUMNS`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from delayed_retry import encoding
from delayed_retry.durations import from_epoch_ms
from delayed_retry.errors import DelayedRetryError, DelayOutOfRangeError
from delayed_retry.topology import DelayTopology

__all__ = [
    "PUBLISH_COLUMNS",
    "PublishJob",
    "PublishOutcome",
    "PublishRunError",
    "declare_destinations",
    "publish_rows",
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
"""Order of the fields of each row handed to the executors."""


class PublishRunError(DelayedRetryError):
    """Some rows were not confirmed; the ledger holds the ones that were. Run again to finish."""


@dataclass(frozen=True, kw_only=True)
class PublishJob:
    """Everything an executor needs to publish; pickled and shipped with the task."""

    url: str
    topology: DelayTopology
    run_id: str
    run_header: str
    window: int = 256
    publish_timeout: float = 30.0
    drop_headers: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class PublishOutcome:
    """What a run sent: the confirmed (key, time) pairs, and the first error of each partition."""

    sent: tuple[tuple[str, datetime], ...]
    errors: tuple[str, ...]


def _properties(row: Sequence[Any], job: PublishJob, due_ms: int) -> Any:
    from pamqp import commands as spec

    from delayed_retry.headers import scheduled_headers
    from delayed_retry.spark.codec import headers_from_json

    headers = headers_from_json(row[4])
    for name in job.drop_headers:
        headers.pop(name, None)
    headers[job.run_header] = job.run_id
    return spec.Basic.Properties(
        content_type=row[5],
        content_encoding=row[6],
        headers=scheduled_headers(headers, due_at=from_epoch_ms(due_ms)),
        delivery_mode=2,
        message_id=row[7],
        correlation_id=row[8],
    )


async def _publish_partition(
    job: PublishJob, rows: Iterable[Sequence[Any]]
) -> tuple[list[tuple[str, int]], list[str]]:
    import aio_pika

    from delayed_retry.publishing import publish_confirmed

    sent: list[tuple[str, int]] = []
    errors: list[str] = []
    try:
        connection = await aio_pika.connect(job.url, timeout=job.publish_timeout)
    except Exception as exc:
        return sent, [f"cannot connect to the broker: {exc!r}"]
    try:
        channel = await connection.channel(publisher_confirms=True)
        underlay = await channel.get_underlay_channel()
        slots = asyncio.Semaphore(job.window)
        tasks: set[asyncio.Task[None]] = set()
        unit_ms = job.topology.unit_ms

        async def one(row: Sequence[Any]) -> None:
            try:
                due_ms = int(row[2])
                # Floor of now: the computed delay is never shorter than the true one.
                units = encoding.units_for_ms(max(due_ms - time.time_ns() // 1_000_000, 0), unit_ms)
                if units > job.topology.max_units:
                    raise DelayOutOfRangeError(
                        f"row {row[0]!r} is due at {from_epoch_ms(due_ms)}, beyond the "
                        f"{job.topology.max_delay} the topology holds; add levels"
                    )
                route = job.topology.route(units, row[1])
                await publish_confirmed(
                    underlay,
                    exchange=route.exchange,
                    routing_key=route.routing_key,
                    body=bytes(row[3]),
                    properties=_properties(row, job, due_ms),
                    timeout=job.publish_timeout,
                )
                sent.append((row[0], time.time_ns() // 1_000_000))
            except Exception as exc:
                if not errors:
                    errors.append(str(exc) or repr(exc))
            finally:
                slots.release()

        for row in rows:
            if errors:
                break
            await slots.acquire()
            task = asyncio.create_task(one(row))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*tasks)
    finally:
        try:
            await connection.close()
        except Exception:  # the broker may be gone; what was confirmed is known
            log.debug("closing a publisher connection failed", exc_info=True)
    return sent, errors


def publish_rows(
    job: PublishJob, rows: Iterator[Any]
) -> Iterator[tuple[list[tuple[str, int]], list[str]]]:
    """The ``mapPartitions`` function: publish one partition, yield one (sent, errors) pair."""
    yield asyncio.run(_publish_partition(job, (tuple(r) for r in rows)))


def run_publish(rdd: Any, job: PublishJob) -> PublishOutcome:
    """Publish every row of ``rdd`` (rows in :data:`PUBLISH_COLUMNS` order) from the executors."""
    from functools import partial

    results = rdd.mapPartitions(partial(publish_rows, job)).collect()
    sent: list[tuple[str, datetime]] = []
    errors: list[str] = []
    for part_sent, part_errors in results:
        sent.extend((key, from_epoch_ms(ms)) for key, ms in part_sent)
        errors.extend(part_errors)
    return PublishOutcome(sent=tuple(sent), errors=tuple(errors))


async def declare_destinations(
    url: str, topology: DelayTopology, queues: Sequence[str], *, timeout: float = 60.0
) -> None:
    """Declare the topology and bind ``queues`` to it, once, on the driver, before sending."""
    import aio_pika

    async def declare() -> None:
        connection = await aio_pika.connect(url, timeout=timeout)
        try:
            channel = await connection.channel()
            await topology.declare(channel, queues=queues)
        finally:
            await connection.close()

    try:
        await asyncio.wait_for(declare(), timeout)
    except TimeoutError as exc:
        raise PublishRunError(
            f"the broker did not answer within {timeout:.0f} s while declaring the delay "
            f"topology {topology.prefix!r}; nothing was sent. Check --url and the broker"
        ) from exc
