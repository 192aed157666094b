"""Remind every customer to review an order N days after delivery, scheduled in bulk from Spark.

An orders table is computed in Spark; one reminder per delivered order is
scheduled through the delay chain with ``schedule_dataframe``; a consumer
prints each reminder as it arrives with how late it is. Days are scaled
down to seconds (a reminder "3 days" after delivery arrives 3 s after it).
It finishes by itself once every reminder has arrived.

Run:  .venv/bin/python examples/review_reminders.py
(uses $RABBITMQ_URL, else starts a throwaway broker; needs delayed-retry[spark] and Java 17)
"""

from __future__ import annotations

import asyncio
import json
import secrets
import tempfile
import time
from datetime import UTC, datetime, timedelta

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DelayTopology, declare_topology
from delayed_retry.headers import X_DUE_AT
from delayed_retry.spark import get_spark, schedule_dataframe
from harness import broker_url

REVIEW_AFTER_DAYS = 14
SECONDS_PER_DAY = 1.0  # scaled down so the example runs in seconds


def build_orders(spark, now: datetime):  # type: ignore[no-untyped-def]
    """Orders, some delivered at various moments in the last "days", some not yet delivered."""
    rows = []
    for i in range(12):
        delivered = None if i % 4 == 3 else now - timedelta(seconds=(i % 5) * 0.5)
        rows.append((f"order-{i:03d}", f"customer-{i % 5}", f"item-{i % 3}", delivered))
    return spark.createDataFrame(
        rows, "order_id string, customer_id string, item string, delivered_at timestamp"
    )


def main() -> None:
    from pyspark.sql import functions as F

    with broker_url() as url:
        spark = get_spark(master="local[2]", config={"spark.sql.shuffle.partitions": "2"})
        spark.range(1).count()  # start the executors before taking "now"
        topology = DelayTopology(prefix="review-reminders", levels=24)
        queue_name = f"review-reminders-{secrets.token_hex(3)}"
        now = datetime.now(UTC)
        orders = build_orders(spark, now)
        reminders = orders.where(F.col("delivered_at").isNotNull()).select(
            "order_id",
            (
                F.col("delivered_at")
                + F.make_dt_interval(secs=F.lit(REVIEW_AFTER_DAYS * SECONDS_PER_DAY))
            ).alias("remind_at"),
            F.struct("order_id", "customer_id", "item").alias("reminder"),
        )
        expected = reminders.count()
        print(f"{orders.count()} orders, {expected} delivered: scheduling {expected} reminders")
        received: asyncio.Queue[tuple[AbstractIncomingMessage, float]] = asyncio.Queue()

        async def run() -> None:
            connection = await aio_pika.connect(url)
            channel = await connection.channel()
            queue = await channel.declare_queue(queue_name, durable=True)
            await declare_topology(channel, topology, queues=[queue_name])

            async def on_reminder(message: AbstractIncomingMessage) -> None:
                await received.put((message, time.time()))
                await message.ack()

            tag = await queue.consume(on_reminder)
            with tempfile.TemporaryDirectory() as ledger:
                # Spark publishes from its executors while the consumer keeps running.
                result = await asyncio.to_thread(
                    schedule_dataframe,
                    reminders,
                    queue=queue_name,
                    due_at="remind_at",
                    body="reminder",
                    key="order_id",
                    schedule_id=f"review-reminders-{now:%Y%m%d}",
                    ledger=ledger,
                    url=url,
                    topology=topology,
                )
            print(f"scheduled {result.sent} reminders; waiting for them")
            for _ in range(expected):
                message, arrived = await asyncio.wait_for(received.get(), 60)
                reminder = json.loads(message.body)
                late_ms = arrived * 1000 - message.headers[X_DUE_AT]
                print(
                    f"  {reminder['order_id']} for {reminder['customer_id']}: review "
                    f"{reminder['item']!r} (arrived {late_ms:.0f} ms after its due time)"
                )
            await queue.cancel(tag)
            await queue.delete(if_unused=False, if_empty=False)
            parking = await channel.declare_queue(f"{queue_name}.parking", passive=True)
            await parking.delete(if_unused=False, if_empty=False)
            await connection.close()

        asyncio.run(run())
        spark.stop()
        print("all reminders arrived")


if __name__ == "__main__":
    main()
