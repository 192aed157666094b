"""Archiving a parking queue: round trip, foreign messages, crash safety, bad targets."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import aio_pika
import pyarrow.dataset as pads
import pytest
from aio_pika.abc import AbstractRobustConnection, FieldValue

from delayed_retry import declare_topology
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.headers import X_PARKED_AT
from delayed_retry.spark import (
    ArchiveError,
    ArchiveSinkError,
    LocalSink,
    archive_queue,
    read_archive,
)
from delayed_retry.spark.codec import headers_from_json
from delayed_retry.spark.synthetic import parked_headers
from tests.support.queues import delete_all, depth, wait_for_depth

pytestmark = pytest.mark.spark


async def _setup(connection: AbstractRobustConnection, unique: str) -> tuple[DelayTopology, str]:
    topology = DelayTopology(prefix=unique, levels=20)
    channel = await connection.channel()
    await channel.declare_queue(unique, durable=True)
    await declare_topology(channel, topology, queues=[unique])
    await channel.close()
    return topology, f"{unique}.parking"


async def _park(
    connection: AbstractRobustConnection, topology: DelayTopology, queue: str, n: int
) -> None:
    channel = await connection.channel()
    exchange = await channel.get_exchange(topology.parking_exchange)
    now = datetime.now(UTC)
    for i in range(n):
        headers = parked_headers(
            queue, TimeoutError(f"db timeout {i}"), parked_at=now, first_failure_at=now, retries=2
        )
        await exchange.publish(
            aio_pika.Message(f'{{"n": {i}}}'.encode(), headers=headers, message_id=f"m{i}"),
            routing_key=queue,
        )
    await channel.close()


async def test_archive_round_trip_keeps_parked_and_foreign_messages(
    connection: AbstractRobustConnection, unique: str, tmp_path: Path, spark: Any
) -> None:
    topology, parking = await _setup(connection, unique)
    try:
        await _park(connection, topology, unique, 3)
        channel = await connection.channel()
        odd: dict[str, FieldValue] = {
            "float": 1.5,
            "bytes": bytearray(b"\x00\x01\xff"),
            "when": datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC),
            "decimal": Decimal("12.34"),
            "list": [1, "two", {"three": True}],
            "big": 2**40,
            "negative": -5,
            X_PARKED_AT: "not a time",
        }
        await channel.default_exchange.publish(aio_pika.Message(b"\x00\xfe\xff binary"), parking)
        await channel.default_exchange.publish(aio_pika.Message(b"odd", headers=odd), parking)
        await channel.close()
        await wait_for_depth(connection, parking, 5, timeout=20)

        result = await archive_queue(
            connection,
            queue=parking,
            to=str(tmp_path / "a"),
            batch_size=2,
            idle_timeout=0.5,
            topology=topology,
        )

        assert result.messages == 5
        assert len(result.files) == 3  # batches of 2, 2, 1
        assert await depth(connection, parking) == 0
        frame = read_archive(spark, str(tmp_path / "a"))
        rows = {r["body"]: r.asDict() for r in frame.collect()}
        assert set(rows) == {b'{"n": 0}', b'{"n": 1}', b'{"n": 2}', b"\x00\xfe\xff binary", b"odd"}
        parked = rows[b'{"n": 1}']
        assert parked["origin_queue"] == unique
        assert parked["queue"] == parking
        assert parked["exception_type"] == "TimeoutError"
        assert parked["exception_message"] == "db timeout 1"
        assert parked["retries"] == 2
        assert parked["parked_reason"] == "max-retries"
        assert parked["parked_at"] is not None
        assert parked["message_id"] == "m1"
        binary = rows[b"\x00\xfe\xff binary"]
        assert binary["headers_json"] == "{}"
        assert binary["origin_queue"] is None
        assert binary["retries"] is None
        assert binary["exception_type"] is None
        foreign = rows[b"odd"]
        assert foreign["parked_at"] is None  # a text x-parked-at is kept in headers only
        headers = headers_from_json(foreign["headers_json"])
        assert headers["bytes"] == b"\x00\x01\xff"
        assert headers["decimal"] == Decimal("12.34")
        assert headers["when"] == datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
        assert headers["list"] == [1, "two", {"three": True}]
        assert headers["big"] == 2**40
        assert headers["negative"] == -5
        assert headers["float"] == 1.5
        assert headers[X_PARKED_AT] == "not a time"
        # The files are plain Parquet: pyarrow reads them without Spark.
        table = pads.dataset(str(tmp_path / "a"), format="parquet", partitioning="hive").to_table()
        assert table.num_rows == 5
    finally:
        await delete_all(connection, queues=[unique, parking])


class FailingSink:
    """A sink that stores ``ok`` batches, then fails like a full disk."""

    def __init__(self, root: Path, ok: int) -> None:
        self.inner = LocalSink(str(root))
        self.ok = ok
        self.calls = 0

    def write(self, table: Any, relative_dir: str, *, stem: str = "part") -> str:
        self.calls += 1
        if self.calls > self.ok:
            raise OSError(28, "No space left on device")
        return self.inner.write(table, relative_dir, stem=stem)


@pytest.mark.parametrize("ok_batches", [0, 1])
async def test_failing_write_acks_nothing_it_did_not_store(
    connection: AbstractRobustConnection, unique: str, tmp_path: Path, ok_batches: int
) -> None:
    topology, parking = await _setup(connection, unique)
    try:
        await _park(connection, topology, unique, 5)
        await wait_for_depth(connection, parking, 5, timeout=20)
        sink = FailingSink(tmp_path / "a", ok=ok_batches)

        with pytest.raises(ArchiveError, match="No space left") as info:
            await archive_queue(
                connection,
                queue=parking,
                to=sink,
                batch_size=2,
                idle_timeout=0.5,
                topology=topology,
            )

        assert "\n" not in str(info.value)
        await wait_for_depth(connection, parking, 5 - 2 * ok_batches, timeout=20)
        stored = list((tmp_path / "a").rglob("*.parquet"))
        assert len(stored) == ok_batches
        assert not list((tmp_path / "a").rglob(".*.tmp"))
    finally:
        await delete_all(connection, queues=[unique, parking])


async def test_missing_queue_and_unwritable_target_are_one_line_errors(
    connection: AbstractRobustConnection, unique: str, tmp_path: Path
) -> None:
    with pytest.raises(ArchiveError, match="does not exist") as missing:
        await archive_queue(connection, queue=f"{unique}.nope", to=str(tmp_path / "a"))
    assert "\n" not in str(missing.value)
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(ArchiveSinkError, match="choose a folder") as unwritable:
        await archive_queue(connection, queue=f"{unique}.nope", to=str(blocker / "archive"))
    assert "\n" not in str(unwritable.value)


async def test_archive_through_a_pyarrow_filesystem_reads_back_with_spark(
    connection: AbstractRobustConnection, unique: str, tmp_path: Path, spark: Any
) -> None:
    # The code path of s3://, gs:// and hdfs:// targets (ArrowFileSystemSink), on a pyarrow
    # filesystem this machine has: the local one, opened as pyarrow opens a URI.
    import pyarrow.fs as pafs

    from delayed_retry.spark import ArrowFileSystemSink

    topology, parking = await _setup(connection, unique)
    try:
        await _park(connection, topology, unique, 3)
        await wait_for_depth(connection, parking, 3, timeout=20)
        uri = (tmp_path / "remote").as_uri()
        filesystem, root = pafs.FileSystem.from_uri(uri)
        sink = ArrowFileSystemSink(filesystem, root, uri)
        result = await archive_queue(
            connection, queue=parking, to=sink, batch_size=2, idle_timeout=0.5, topology=topology
        )
        assert result.messages == 3 and len(result.files) == 2
        assert await depth(connection, parking) == 0
        bodies = sorted(r["body"] for r in read_archive(spark, uri).collect())
        assert bodies == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    finally:
        await delete_all(connection, queues=[unique, parking])
