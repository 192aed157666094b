"""Bulk scheduling from a DataFrame, and a broker that goes away in the middle of a redrive."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.dataset as pads
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import declare_topology
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.headers import (
    X_DUE_AT,
    X_SCHEDULE_ID,
)
from delayed_retry.spark import (
    PublishRunError,
    redrive,
    schedule_dataframe,
)
from delayed_retry.spark.synthetic import parked_row, write_archive
from harness import RabbitMQNode
from tests.support.queues import declare_queue, drain, wait_for_depth

pytestmark = pytest.mark.spark


async def test_schedule_dataframe_delivers_every_row_never_early_and_once(
    spark: Any,
    rabbitmq_url: str,
    connection: AbstractRobustConnection,
    unique: str,
    tmp_path: Path,
) -> None:
    from pyspark.sql import functions as F

    topology = DelayTopology(prefix=unique, levels=20)
    channel = await connection.channel()
    queue = await channel.declare_queue(unique, durable=True)
    got: asyncio.Queue[tuple[AbstractIncomingMessage, int]] = asyncio.Queue()

    async def on_message(message: AbstractIncomingMessage) -> None:
        await got.put((message, -(-time.time_ns() // 1_000_000)))
        await message.ack()

    await declare_topology(channel, topology, queues=[unique])
    await queue.consume(on_message)
    start = datetime.now(UTC)
    orders = spark.createDataFrame(
        [(f"o-{i}", f"c-{i % 3}", start + timedelta(milliseconds=300 * i)) for i in range(8)],
        "order_id string, customer string, delivered_at timestamp",
    )
    reminders = orders.select(
        "order_id",
        (F.col("delivered_at") + F.expr("INTERVAL 1 SECOND")).alias("remind_at"),
        F.struct("order_id", "customer").alias("payload"),
    )
    try:
        result = await asyncio.to_thread(
            schedule_dataframe,
            reminders,
            queue=unique,
            due_at="remind_at",
            body="payload",
            key="order_id",
            headers={"x-order": "order_id"},
            schedule_id="reminders-1",
            ledger=str(tmp_path / "ledger"),
            url=rabbitmq_url,
            topology=topology,
        )
        assert (result.rows, result.sent) == (8, 8)
        arrivals = [await asyncio.wait_for(got.get(), 30) for _ in range(8)]
        seen = set()
        for message, arrived_ms in arrivals:
            payload = json.loads(message.body)
            i = int(payload["order_id"].split("-")[1])
            wanted = start + timedelta(milliseconds=300 * i + 1000)
            due = message.headers[X_DUE_AT]
            assert isinstance(due, int)
            assert arrived_ms >= due >= wanted.timestamp() * 1000
            assert message.headers["x-order"] == payload["order_id"]
            # The key is the message id: what a consumer deduplicates on.
            assert message.message_id == payload["order_id"]
            assert message.headers[X_SCHEDULE_ID] == "reminders-1"
            assert message.content_type == "application/json"
            seen.add(payload["order_id"])
        assert seen == {f"o-{i}" for i in range(8)}

        again = await asyncio.to_thread(
            schedule_dataframe,
            reminders,
            queue=unique,
            due_at="remind_at",
            body="payload",
            key="order_id",
            schedule_id="reminders-1",
            ledger=str(tmp_path / "ledger"),
            url=rabbitmq_url,
            topology=topology,
        )
        assert (again.rows, again.sent) == (8, 0)
        ledger = pads.dataset(str(tmp_path / "ledger"), format="parquet").to_table()
        assert sorted(ledger.column("message_key").to_pylist()) == sorted(seen)
    finally:
        await queue.delete(if_unused=False, if_empty=False)
        parking = await channel.declare_queue(f"{unique}.parking", passive=True)
        await parking.delete(if_unused=False, if_empty=False)
        await channel.close()


@pytest.mark.private_node
def test_broker_gone_mid_redrive_records_only_confirmed_sends(
    spark: Any, tmp_path: Path, unique: str
) -> None:
    topology = DelayTopology(prefix=unique, levels=8, queue_type="classic")
    total = 4_000
    rows = [
        parked_row(
            topology, "work", f"m{i}".encode(), TimeoutError("t"), parked_at=datetime.now(UTC)
        )
        for i in range(total)
    ]
    write_archive(tmp_path / "arch", "work.parking", rows)
    key_of = {row["body"]: row["message_key"] for row in rows}
    with RabbitMQNode() as node:
        asyncio.run(declare_queue(node.url, "work"))
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["result"] = redrive(
                    spark, str(tmp_path / "arch"), url=node.url, topology=topology, window=1
                )
            except Exception as exc:
                outcome["error"] = exc

        worker = threading.Thread(target=run)
        worker.start()
        asyncio.run(wait_for_depth(node.url, "work", total // 10, at_least=True, timeout=120))
        node.kill()
        worker.join(120)
        assert not worker.is_alive()
        error = outcome.get("error")
        assert isinstance(error, PublishRunError), outcome
        assert "\n" not in str(error) and "run the same command again" in str(error)

        node.start()
        ledger = pads.dataset(str(tmp_path / "arch" / "_ledger"), format="parquet").to_table()
        recorded = set(ledger.column("message_key").to_pylist())
        assert 0 < len(recorded) < total
        in_queue = [m.body for m in asyncio.run(drain(node.url, "work"))]
        # Every send the ledger records is really in the queue (confirmed means stored).
        assert recorded <= {key_of[body] for body in in_queue}

        again = redrive(spark, str(tmp_path / "arch"), url=node.url, topology=topology)
        assert again.already_sent == len(recorded)
        assert again.sent == total - len(recorded)
        in_queue += [m.body for m in asyncio.run(drain(node.url, "work"))]
        assert {key_of[body] for body in in_queue} == set(key_of.values())
