"""Rows per second: bulk scheduling and redrive with Spark vs one aio-pika publisher.

The suite's ``spark-schedule`` workload: ``benchmarks/run --only spark-schedule
--spark-schedule-rows 100000`` (default 1,000,000 rows; ``--spark-master local[1]
--spark-master local[2]`` to see scaling).

Every path publishes the same kind of message (a small JSON body, the
delayed-retry headers) with publisher confirms into the delay chain, due
now, so messages pass the chain's exchanges straight to the destination; the
destination is a classic queue capped with ``drop-head`` so the broker's
memory stays flat. The baseline is one process publishing with aio-pika and
a window of unconfirmed publishes (the same window the executors use). The
broker is the suite's. Results go to ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import secrets
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
from workloads import Row, Suite

from delayed_retry import declare_topology
from delayed_retry.chain.digest import markers
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.durations import to_epoch_ms
from delayed_retry.spark import redrive, schedule_dataframe
from delayed_retry.spark.schema import archive_spark_schema
from delayed_retry.spark.session import get_spark

RESULTS = Path(__file__).parent / "results"


async def _prepare(url: str, topology: DelayTopology, queue: str) -> None:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    await channel.declare_queue(
        queue, durable=True, arguments={"x-max-length": 20_000, "x-overflow": "drop-head"}
    )
    await declare_topology(channel, topology, queues=[queue])
    await connection.close()


async def _cleanup(url: str, topology: DelayTopology, queue: str) -> None:
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    for name in (queue, f"{queue}.parking", topology.alerts_queue, topology.unroutable_queue):
        with contextlib.suppress(Exception):
            await channel.queue_delete(name)
    for name in [*(spec.name for spec in topology.exchanges()), *markers(topology)]:
        with contextlib.suppress(Exception):
            await channel.exchange_delete(name)
    await connection.close()


async def _baseline(url: str, topology: DelayTopology, queue: str, rows: int, window: int) -> float:
    """One process, aio-pika, confirms, ``window`` publishes in flight; returns seconds."""
    connection = await aio_pika.connect(url)
    channel = await connection.channel(publisher_confirms=True)
    route = topology.route(0, queue)
    exchange = await channel.get_exchange(route.exchange, ensure=False)
    slots = asyncio.Semaphore(window)
    tasks: set[asyncio.Task[Any]] = set()

    async def one(i: int) -> None:
        try:
            message = aio_pika.Message(
                json.dumps({"id": i}).encode(),
                headers={"x-retry-due-at": to_epoch_ms(datetime.now(UTC)), "x-schedule-id": "b"},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                content_type="application/json",
            )
            await exchange.publish(message, routing_key=route.routing_key, mandatory=True)
        finally:
            slots.release()

    start = time.perf_counter()
    for i in range(rows):
        await slots.acquire()
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    await connection.close()
    return elapsed


def _archive(spark: Any, path: str, rows: int, queue: str, topology: DelayTopology) -> None:
    """A synthetic archive of ``rows`` parked messages, written by Spark in the archive layout."""
    from pyspark.sql import functions as F

    frame = spark.range(rows).select(
        F.sha2(F.col("id").cast("string"), 256).alias("message_key"),
        F.encode(F.to_json(F.struct("id")), "UTF-8").alias("body"),
        F.lit('{"x-exception-type": "TimeoutError"}').alias("headers_json"),
        F.lit(topology.parking_exchange).alias("exchange"),
        F.lit(queue).alias("routing_key"),
        F.lit(queue).alias("origin_queue"),
        F.lit("application/json").alias("content_type"),
        F.lit(None).cast("string").alias("content_encoding"),
        F.lit(None).cast("string").alias("message_id"),
        F.lit(None).cast("string").alias("correlation_id"),
        F.lit(3).cast("long").alias("retries"),
        F.lit("max-retries").alias("parked_reason"),
        F.lit("TimeoutError").alias("exception_type"),
        F.lit("timed out").alias("exception_message"),
        F.lit(None).cast("string").alias("exception_traceback"),
        F.lit("TimeoutError: timed out").alias("last_error"),
        F.current_timestamp().alias("first_failure_at"),
        F.current_timestamp().alias("last_failure_at"),
        F.current_timestamp().alias("parked_at"),
        F.current_timestamp().alias("archived_at"),
        F.lit(False).alias("redelivered"),
        F.date_format(F.current_timestamp(), "yyyy-MM-dd").alias("date"),
        F.lit(f"{queue}.parking").alias("queue"),
    )
    assert frame.columns == [f.name for f in archive_spark_schema().fields]
    frame.write.partitionBy("date", "queue").mode("overwrite").parquet(path)


def _spark_runs(
    url: str, master: str, rows: int, window: int, partitions: int, workdir: str
) -> dict[str, float]:
    from pyspark.sql import functions as F

    spark = get_spark(
        master=master,
        config={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": str(partitions)},
    )
    try:
        topology = DelayTopology(
            prefix=f"bench-{secrets.token_hex(3)}", levels=8, queue_type="classic"
        )
        queue = f"bench-{secrets.token_hex(3)}"
        asyncio.run(_prepare(url, topology, queue))
        frame = spark.range(0, rows, numPartitions=partitions).select(
            F.col("id").cast("string").alias("id"),
            F.current_timestamp().alias("due"),
            F.struct("id").alias("payload"),
        )
        start = time.perf_counter()
        result = schedule_dataframe(
            frame,
            queue=queue,
            due_at="due",
            body="payload",
            key="id",
            schedule_id="bench",
            ledger=os.path.join(workdir, f"ledger-{queue}"),
            url=url,
            topology=topology,
            window=window,
        )
        schedule_s = time.perf_counter() - start
        assert result.sent == rows, result

        archive = os.path.join(workdir, f"archive-{queue}")
        _archive(spark, archive, rows, queue, topology)
        start = time.perf_counter()
        redriven = redrive(spark, archive, url=url, topology=topology, window=window)
        redrive_s = time.perf_counter() - start
        assert redriven.sent == rows, redriven
        asyncio.run(_cleanup(url, topology, queue))
        return {"schedule_s": schedule_s, "redrive_s": redrive_s}
    finally:
        spark.stop()


def measure(
    url: str, *, rows: int, window: int, masters: list[str], partitions: int
) -> dict[str, Any]:
    """The baseline, then scheduling and redrive on each master: rows/s and ratios."""
    workdir = tempfile.mkdtemp(prefix="bench-spark-")
    report: dict[str, Any] = {
        "rows": rows,
        "window": window,
        "partitions": partitions,
        "cpus": os.cpu_count(),
        "machine": platform.platform(),
        "started_at": datetime.now(UTC).isoformat(),
        "runs": [],
    }
    try:
        topology = DelayTopology(
            prefix=f"bench-{secrets.token_hex(3)}", levels=8, queue_type="classic"
        )
        queue = f"bench-{secrets.token_hex(3)}"
        asyncio.run(_prepare(url, topology, queue))
        base_s = asyncio.run(_baseline(url, topology, queue, rows, window))
        asyncio.run(_cleanup(url, topology, queue))
        base_rate = rows / base_s
        report["baseline_rows_per_s"] = base_rate
        print(f"baseline  aio-pika, 1 process: {base_rate:10.0f} rows/s ({base_s:.1f} s)")
        for master in masters:
            run = _spark_runs(url, master, rows, window, partitions, workdir)
            schedule_rate = rows / run["schedule_s"]
            redrive_rate = rows / run["redrive_s"]
            entry = {
                "master": master,
                "schedule_rows_per_s": schedule_rate,
                "redrive_rows_per_s": redrive_rate,
                "schedule_ratio": schedule_rate / base_rate,
                "redrive_ratio": redrive_rate / base_rate,
                **run,
            }
            report["runs"].append(entry)
            print(
                f"{master:9} schedule_dataframe:   {schedule_rate:10.0f} rows/s "
                f"({run['schedule_s']:.1f} s), ratio {entry['schedule_ratio']:.2f}"
            )
            print(
                f"{master:9} redrive:              {redrive_rate:10.0f} rows/s "
                f"({run['redrive_s']:.1f} s), ratio {entry['redrive_ratio']:.2f}"
            )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def _write(report: dict[str, Any]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = RESULTS / f"spark_schedule-{report['rows']}-{stamp}.json"
    out.write_text(json.dumps(report, indent=2))
    print(f"results: {out}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("spark-schedule")
    group.add_argument("--spark-schedule-rows", type=int, help="rows (1,000,000; --quick 100,000)")
    group.add_argument(
        "--spark-master", action="append", default=None, help="Spark master(s); default local[*]"
    )


async def spark_schedule(suite: Suite) -> list[Row]:
    """The ``spark-schedule`` workload: rows/s of Spark beside one aio-pika publisher."""
    args = suite.args
    rows = args.spark_schedule_rows or (100_000 if suite.quick else 1_000_000)
    print(f"spark-schedule: {rows} rows ...")
    report = await asyncio.to_thread(
        measure,
        suite.url,
        rows=rows,
        window=256,
        masters=args.spark_master or ["local[*]"],
        partitions=2 * (os.cpu_count() or 2),
    )
    _write(report)
    return [
        {
            "workload": f"spark {path}, {rows} rows",
            "subject": f"Spark {run['master']}",
            "unit": "rows/s",
            "value": round(run[f"{path}_rows_per_s"]),
            "baseline": "aio-pika, 1 process",
            "baseline_value": round(report["baseline_rows_per_s"]),
            "ratio": run[f"{path}_ratio"],
        }
        for run in report["runs"]
        for path in ("schedule", "redrive")
    ]
