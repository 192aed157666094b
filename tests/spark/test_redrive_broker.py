"""Redrive archived messages with Spark: dry run, rate spreading, idempotency, bad predicates."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.durations import to_epoch_ms
from delayed_retry.headers import (
    X_DUE_AT,
    X_REDRIVE_ID,
    X_RETRY,
)
from delayed_retry.spark import (
    RedriveError,
    redrive,
)
from delayed_retry.spark.redrive import where_error
from delayed_retry.spark.synthetic import parked_row, write_archive

pytestmark = pytest.mark.spark

T0 = datetime(2024, 3, 1, 10, 0, tzinfo=UTC)


@pytest.fixture
async def target(
    connection: AbstractRobustConnection, unique: str
) -> AsyncIterator[tuple[DelayTopology, str]]:
    topology = DelayTopology(prefix=unique, levels=20)
    channel = await connection.channel()
    await channel.declare_queue(unique, durable=True)
    yield topology, unique
    for name in (unique, f"{unique}.parking"):
        queue = await channel.declare_queue(name, passive=True)
        await queue.delete(if_unused=False, if_empty=False)
    await channel.close()


def _archive(tmp_path: Path, topology: DelayTopology, queue: str) -> str:
    rows = [
        parked_row(
            topology,
            queue,
            f"t{i}".encode(),
            TimeoutError("timeout"),
            parked_at=T0 + timedelta(minutes=i),
        )
        for i in range(5)
    ]
    rows += [
        parked_row(
            topology,
            queue,
            f"v{i}".encode(),
            ValueError("bad sku"),
            parked_at=T0 + timedelta(minutes=10 + i),
        )
        for i in range(3)
    ]
    write_archive(tmp_path / "arch", f"{queue}.parking", rows)
    return str(tmp_path / "arch")


def _due_ms(message: AbstractIncomingMessage) -> int:
    due = message.headers[X_DUE_AT]
    assert isinstance(due, int)
    return due


async def _receive(
    connection: AbstractRobustConnection, queue: str, n: int, timeout: float = 30
) -> list[tuple[AbstractIncomingMessage, int]]:
    """``n`` messages from ``queue`` with their arrival time (ms, rounded up)."""
    channel = await connection.channel()
    got: asyncio.Queue[tuple[AbstractIncomingMessage, int]] = asyncio.Queue()

    async def on_message(message: AbstractIncomingMessage) -> None:
        await got.put((message, -(-time.time_ns() // 1_000_000)))
        await message.ack()

    source = await channel.get_queue(queue)
    tag = await source.consume(on_message)
    try:
        return [await asyncio.wait_for(got.get(), timeout) for _ in range(n)]
    finally:
        await source.cancel(tag)
        await channel.close()


async def test_dry_run_then_spread_redrive_then_rerun_sends_nothing(
    spark: Any,
    rabbitmq_url: str,
    connection: AbstractRobustConnection,
    target: tuple[DelayTopology, str],
    tmp_path: Path,
) -> None:
    topology, queue = target
    archive = _archive(tmp_path, topology, queue)
    where = "exception_type = 'TimeoutError'"

    dry = await asyncio.to_thread(
        redrive, spark, archive, url=None, where=where, rate=20, dry_run=True, topology=topology
    )
    assert (dry.selected, dry.to_send, dry.sent, dry.by_queue) == (5, 5, 0, {queue: 5})
    assert dry.first_due_at is not None and dry.last_due_at is not None
    assert dry.last_due_at - dry.first_due_at == timedelta(milliseconds=200)
    assert not (tmp_path / "arch" / "_ledger").exists()

    real = await asyncio.to_thread(
        redrive, spark, archive, url=rabbitmq_url, where=where, rate=20, topology=topology
    )
    assert real.sent == 5
    assert real.redrive_id == dry.redrive_id
    arrivals = await _receive(connection, queue, 5)
    bodies = sorted(m.body for m, _ in arrivals)
    assert bodies == [f"t{i}".encode() for i in range(5)]
    due = {m.body: _due_ms(m) for m, _ in arrivals}
    # Oldest parked first, each 50 ms after the one before (rate 20/s), across both
    # publishing partitions (rows 0-2 and 3-4).
    ordered = [due[f"t{i}".encode()] for i in range(5)]
    assert [b - a for a, b in itertools.pairwise(ordered)] == [50, 50, 50, 50]
    # The plan counts from a start agreed once every publishing partition was connected
    # and had its rows: the first message was not due while publishers were starting.
    assert real.ready_at is not None and real.first_due_at is not None
    assert real.first_due_at > real.ready_at
    assert ordered[0] == to_epoch_ms(real.first_due_at)
    assert real.last_due_at is not None and ordered[-1] == to_epoch_ms(real.last_due_at)
    assert ordered[0] > to_epoch_ms(dry.first_due_at)  # not the start planned beforehand
    for message, arrived_ms in arrivals:
        assert message.headers[X_REDRIVE_ID] == real.redrive_id
        assert X_RETRY not in message.headers  # a fresh retry budget
        assert arrived_ms >= _due_ms(message)  # never early

    again = await asyncio.to_thread(
        redrive, spark, archive, url=rabbitmq_url, where=where, rate=20, topology=topology
    )
    assert (again.selected, again.already_sent, again.to_send, again.sent) == (5, 5, 0, 0)

    # A wider selection sends only what the ledger does not hold yet, under its own id.
    rest = await asyncio.to_thread(
        redrive, spark, archive, url=rabbitmq_url, redrive_id=real.redrive_id, topology=topology
    )
    assert (rest.selected, rest.already_sent, rest.sent) == (8, 5, 3)
    assert sorted(m.body for m, _ in await _receive(connection, queue, 3)) == [b"v0", b"v1", b"v2"]


@pytest.mark.parametrize("where", ["exception_type = = 'x'", "retries >", "body LIKE"])
def test_malformed_where_is_a_one_line_error(spark: Any, tmp_path: Path, where: str) -> None:
    topology = DelayTopology(prefix="unused", levels=4)
    archive = _archive(tmp_path, topology, "orders")
    with pytest.raises(RedriveError, match="not a valid Spark SQL predicate") as info:
        redrive(spark, archive, url=None, where=where, dry_run=True)
    assert "\n" not in str(info.value) and "SQLSTATE" not in str(info.value)


@pytest.mark.parametrize("where", ["fingerprnt = 'ab'", "no_such_column > 3 AND fingerprint = 'x'"])
def test_an_unknown_column_is_named_with_the_real_ones_fingerprint_included(
    spark: Any, tmp_path: Path, where: str
) -> None:
    archive = _archive(tmp_path, DelayTopology(prefix="unused", levels=4), "orders")
    with pytest.raises(RedriveError) as info:
        redrive(spark, archive, url=None, where=where, dry_run=True)
    text = str(info.value)
    bad = where.split()[0]
    assert text.startswith(f"--where {where!r} names column {bad!r}, which the archive does not")
    columns = text.split("its columns are ")[1].split(", ")
    assert {"exception_type", "retries", "fingerprint", "fingerprint_template"} <= set(columns)
    assert "\n" not in text and "Did you mean" not in text


def test_where_error_names_the_column_or_keeps_sparks_first_line() -> None:
    unknown = where_error(
        "fingerprnt = 'a'",
        condition="UNRESOLVED_COLUMN.WITH_SUGGESTION",
        parameters={"objectName": "`fingerprnt`", "proposal": "`date`, `queue`"},
        message="[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column ... SQLSTATE: 42703; line 1 pos 0;",
        columns=["queue", "fingerprint"],
    )
    assert unknown == (
        "--where \"fingerprnt = 'a'\" names column 'fingerprnt', which the archive does not "
        "have; its columns are queue, fingerprint"
    )
    syntax = where_error(
        "retries >",
        condition="PARSE_SYNTAX_ERROR",
        parameters={},
        message="[PARSE_SYNTAX_ERROR] Syntax error at or near end of input. SQLSTATE: 42601",
        columns=["retries"],
    )
    assert syntax == (
        "--where 'retries >' is not a valid Spark SQL predicate: [PARSE_SYNTAX_ERROR] Syntax "
        "error at or near end of input; columns: retries"
    )


def test_messages_without_a_recorded_queue_are_not_sent(spark: Any, tmp_path: Path) -> None:
    from delayed_retry.spark.archive import archive_row

    row = archive_row(
        body=b"foreign",
        headers=None,
        exchange="",
        routing_key="orders.parking",
        properties={},
        redelivered=False,
        archived_at=T0,
    )
    row["parked_at"] = T0
    write_archive(tmp_path / "arch", "orders.parking", [row])
    result = redrive(spark, str(tmp_path / "arch"), url=None, dry_run=True)
    assert (result.selected, result.without_queue, result.to_send) == (1, 1, 0)


async def test_unknown_destination_queue_fails_before_sending(
    spark: Any, rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    topology = DelayTopology(prefix=unique, levels=20)
    archive = _archive(tmp_path, topology, f"{unique}-gone")
    with pytest.raises(Exception, match="does not exist") as info:
        await asyncio.to_thread(redrive, spark, archive, url=rabbitmq_url, topology=topology)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "arch" / "_ledger").exists()
