"""The executors' publisher: rate spreading across partitions, task retries, ledger storage."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import pyarrow as pa
import pyarrow.dataset as pads
import pytest

from delayed_retry import declare_topology
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.spark import ArchiveSinkError, PublishRunError, schedule_dataframe
from delayed_retry.spark.partition_publish import PUBLISH_COLUMNS, PublishJob, publish_attempt
from delayed_retry.spark.redrive import _spread
from tests.support.queues import drain

pytestmark = pytest.mark.spark

T0 = datetime(2024, 3, 1, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize("rate", [20.0, 3.0, 7000.0])
def test_spread_numbers_rows_oldest_first_across_partitions(spark: Any, rate: float) -> None:
    n = 300
    minutes = list(range(n))
    random.Random(7).shuffle(minutes)
    frame = spark.createDataFrame(
        [(f"k{m:04d}", T0 + timedelta(minutes=m)) for m in minutes],
        "message_key string, parked_at timestamp",
    ).repartition(5)
    ordered, due = _spread(frame, 1_000, rate, 4)
    try:
        assert ordered.rdd.getNumPartitions() == 4  # the offsets are really exercised
        got = sorted(ordered.select("parked_at", due.alias("due")).collect())
    finally:
        ordered.unpersist()
    # The i-th oldest is due at start + ceil(i * 1000 / rate): no gap, no repeat.
    assert [row["due"] for row in got] == [1_000 + math.ceil(i * 1000 / rate) for i in range(n)]


def _batches(
    keys: list[str], queue: str, fail_after: int | None = None
) -> Iterator[pa.RecordBatch]:
    """Rows due now as Arrow batches of 4; raises after ``fail_after`` batches (a lost input)."""
    now = time.time_ns() // 1_000_000
    for start in range(0, len(keys), 4):
        if fail_after is not None and start // 4 == fail_after:
            raise OSError("executor lost its input")
        chunk = keys[start : start + 4]
        columns = {
            "message_key": chunk,
            "destination": [queue] * len(chunk),
            "due_at_ms": [now] * len(chunk),
            "body": [k.encode() for k in chunk],
            "headers_json": ['{"x-tenant": "t1"}'] * len(chunk),
            "content_type": ["text/plain"] * len(chunk),
            "content_encoding": [None] * len(chunk),
            "message_id": [None] * len(chunk),
            "correlation_id": [None] * len(chunk),
        }
        yield pa.RecordBatch.from_pydict({c: columns[c] for c in PUBLISH_COLUMNS})


async def _declare(url: str, topology: DelayTopology, queue: str) -> None:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.declare_queue(queue, durable=True)
    await declare_topology(channel, topology, queues=[queue])
    await connection.close()


def test_a_retried_task_sends_only_what_its_failed_attempt_did_not_record(
    rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    topology = DelayTopology(prefix=unique, levels=8, queue_type="classic")
    asyncio.run(_declare(rabbitmq_url, topology, unique))
    keys = [f"row-{i:02d}" for i in range(20)]
    job = PublishJob(
        url=rabbitmq_url,
        topology=topology,
        run_id="s1",
        run_header="x-schedule-id",
        ledger=str(tmp_path / "ledger"),
        ledger_every=3,
        window=8,  # rows start two at a time, so all 8 read before the failure are sent
    )
    first = publish_attempt(job, _batches(keys, unique, fail_after=2), partition=3, retried=False)
    assert first.column("error")[0].as_py() == "executor lost its input"
    assert first.column("sent")[0].as_py() == 8
    second = publish_attempt(job, _batches(keys, unique), partition=3, retried=True)
    assert second.column("error")[0].as_py() is None
    assert second.column("sent")[0].as_py() == 12

    messages = asyncio.run(drain(rabbitmq_url, unique))
    assert sorted(m.body.decode() for m in messages) == keys  # each once
    assert {m.headers["x-tenant"] for m in messages} == {"t1"}
    ledger = pads.dataset(str(tmp_path / "ledger"), format="parquet").to_table()
    assert sorted(ledger.column("message_key").to_pylist()) == keys
    for attempt in (first, second):
        files = attempt.column("files")[0].as_py()
        assert files and all(f.startswith(f"part-{job.token}-p00003-") for f in files)


def _schedule_six(spark: Any, url: str, queue: str, ledger: str) -> None:
    """Declare ``queue`` behind a chain of its own, then schedule six rows due now into it."""
    from pyspark.sql import functions as F

    topology = DelayTopology(prefix=queue, levels=8, queue_type="classic")
    asyncio.run(_declare(url, topology, queue))
    reminders = spark.range(6).select(
        F.col("id").cast("string").alias("id"),
        F.current_timestamp().alias("due"),
        F.struct("id").alias("payload"),
    )
    schedule_dataframe(
        reminders,
        queue=queue,
        due_at="due",
        body="payload",
        key="id",
        schedule_id="s1",
        ledger=ledger,
        url=url,
        topology=topology,
    )


def test_a_ledger_the_driver_cannot_see_is_an_error(
    spark: Any, rabbitmq_url: str, unique: str
) -> None:
    # pyarrow's mock:// filesystem lives in memory, one per opening: what the executors
    # write there, the driver cannot see, like a local folder on a cluster's executors.
    with pytest.raises(PublishRunError, match="not visible to the driver") as info:
        _schedule_six(spark, rabbitmq_url, unique, "mock:///ledger")
    assert "Nothing was sent" in str(info.value) and "\n" not in str(info.value)
    assert asyncio.run(drain(rabbitmq_url, unique)) == []


def test_an_unwritable_ledger_fails_before_sending(
    spark: Any, rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    (tmp_path / "a-file").write_text("not a folder")
    with pytest.raises(ArchiveSinkError, match="cannot create the folder"):
        _schedule_six(spark, rabbitmq_url, unique, str(tmp_path / "a-file" / "ledger"))
    assert asyncio.run(drain(rabbitmq_url, unique)) == []


def test_a_ledger_that_fails_mid_run_stops_the_partition_and_says_what_is_unrecorded(
    rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    from delayed_retry.spark.publisher import PublishOutcome

    topology = DelayTopology(prefix=unique, levels=8, queue_type="classic")
    asyncio.run(_declare(rabbitmq_url, topology, unique))
    ledger = tmp_path / "ledger"
    job = PublishJob(
        url=rabbitmq_url,
        topology=topology,
        run_id="s1",
        run_header="x-schedule-id",
        ledger=str(ledger),
        ledger_every=2,
        window=4,
    )
    keys = [f"row-{i:02d}" for i in range(40)]

    def batches() -> Iterator[pa.RecordBatch]:
        for i, batch in enumerate(_batches(keys, unique)):
            if i == 2:  # the ledger's storage goes away under the running partition
                for part in ledger.iterdir():
                    part.unlink()
                ledger.rmdir()
                ledger.write_text("not a folder any more")
            yield batch

    result = publish_attempt(job, batches(), partition=0, retried=False)
    error = result.column("error")[0].as_py()
    assert error.startswith("the ledger cannot be written")
    assert "re-run sends them again" in error
    sent = len(asyncio.run(drain(rabbitmq_url, unique)))
    assert 0 < sent < len(keys)  # it stopped early; what it sent is in the queue
    assert result.column("sent")[0].as_py() < sent  # some confirmed sends went unrecorded
    outcome = PublishOutcome(
        sent=result.column("sent")[0].as_py(), errors=(error,), ledger=str(ledger)
    )
    with pytest.raises(PublishRunError, match=r"stopped after \d+ recorded sends: the ledger"):
        outcome.raise_for_errors("schedule 's1'", rerun="call it again")


def test_the_agreed_start_is_after_the_last_ready_partition() -> None:
    from delayed_retry.spark.partition_publish import agreed_start

    assert agreed_start([1_000, 1_750, 1_200], margin_ms=500) == 2_250
    assert agreed_start([42], margin_ms=0) == 42


def _offset_batches(keys: list[str], queue: str, step_ms: int) -> Iterator[pa.RecordBatch]:
    """Rows due ``i * step_ms`` after a start not known yet (an anchored run)."""
    columns = {
        "message_key": keys,
        "destination": [queue] * len(keys),
        "due_at_ms": [i * step_ms for i in range(len(keys))],
        "body": [k.encode() for k in keys],
        "headers_json": [None] * len(keys),
        "content_type": [None] * len(keys),
        "content_encoding": [None] * len(keys),
        "message_id": [None] * len(keys),
        "correlation_id": [None] * len(keys),
    }
    yield pa.RecordBatch.from_pydict({c: columns[c] for c in PUBLISH_COLUMNS})


def test_an_anchored_partition_agrees_once_after_it_is_ready_then_counts_from_the_start(
    rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    from delayed_retry.headers import X_DUE_AT

    topology = DelayTopology(prefix=unique, levels=16, queue_type="classic")
    asyncio.run(_declare(rabbitmq_url, topology, unique))
    job = PublishJob(
        url=rabbitmq_url,
        topology=topology,
        run_id="r1",
        run_header="x-redrive-id",
        ledger=str(tmp_path / "ledger"),
        anchored=True,
    )
    calls: list[int] = []

    def agree(ready_ms: int) -> int:
        calls.append(ready_ms)
        return ready_ms + 2_000  # as if another partition became ready later

    before = time.time_ns() // 1_000_000
    keys = [f"k{i}" for i in range(6)]
    result = publish_attempt(
        job, _offset_batches(keys, unique, 100), partition=0, retried=False, agree=agree
    )
    assert len(calls) == 1 and calls[0] >= before  # ready after the task began
    start = result.column("start_ms")[0].as_py()
    assert start == calls[0] + 2_000
    assert result.column("ready_ms")[0].as_py() == calls[0]
    assert result.column("late")[0].as_py() == 0  # 2 s ahead: nothing was due yet
    messages: list[aio_pika.abc.AbstractIncomingMessage] = []

    async def collect() -> None:
        deadline = time.monotonic() + 30
        while len(messages) < len(keys) and time.monotonic() < deadline:
            messages.extend(await drain(rabbitmq_url, unique))
            await asyncio.sleep(0.1)

    asyncio.run(collect())
    due = {m.body.decode(): m.headers[X_DUE_AT] for m in messages}
    # The plan counts from the agreed start, not from when the rows were planned.
    assert due == {k: start + 100 * i for i, k in enumerate(keys)}


def test_a_partition_that_cannot_connect_still_takes_part_in_the_agreement(
    tmp_path: Path,
) -> None:
    topology = DelayTopology(prefix="unused", levels=4, queue_type="classic")
    job = PublishJob(
        url="amqp://guest:guest@127.0.0.1:1/",  # nothing listens on port 1
        topology=topology,
        run_id="r1",
        run_header="x-redrive-id",
        ledger=str(tmp_path / "ledger"),
        anchored=True,
        publish_timeout=5,
    )
    calls: list[int] = []

    def agree(ready_ms: int) -> int:
        calls.append(ready_ms)
        return ready_ms

    result = publish_attempt(
        job, _offset_batches(["k0"], "q", 10), partition=1, retried=False, agree=agree
    )
    # Otherwise the other partitions of the barrier stage would wait for it forever.
    assert len(calls) == 1
    assert "cannot connect" in result.column("error")[0].as_py()
    assert result.column("sent")[0].as_py() == 0
