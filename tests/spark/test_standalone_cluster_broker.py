"""The Spark commands on a Spark standalone cluster: the same results as local mode, and a
redrive that loses an executor keeps the ledger's promise.

The cluster is a master and two workers, each a JVM of its own with its own work folder
(``spark_standalone``); every command runs as a user runs it, ``delayed-retry … --master
spark://127.0.0.1:PORT`` in a process of its own, and local mode runs in this process
(the ``spark`` fixture, ``local[2]``). The archive and the ledgers are in the test's folder,
which every process reaches.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from asyncio.subprocess import PIPE
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aio_pika
import pyarrow.parquet as pq
import pytest
from aio_pika.abc import AbstractRobustConnection

from delayed_retry import declare_topology
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.spark import redrive, schedule_dataframe
from delayed_retry.spark.analyze import analyze_archive
from delayed_retry.spark.ledger import recorded_keys
from delayed_retry.spark.report import format_table
from delayed_retry.spark.synthetic import parked_headers
from tests.support.queues import delete_all
from tests.support.spark_standalone import SparkStandalone
from tests.support.waiting import wait_until

# Five applications, each a driver JVM and two executor JVMs: minutes on a loaded 2-core machine.
pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

COMMAND_TIMEOUT = 600.0
"""One command on the cluster: a driver JVM, two executor JVMs and their Python workers."""

BARRIER = "has entered the global sync"
"""What an executor logs as a barrier task (a rated redrive's publishing) reaches the barrier."""

TIMEOUTS, INVALID = 40, 20
"""The parked messages: two kinds of failure on two queues."""


@dataclass(frozen=True)
class Chain:
    topology: DelayTopology
    orders: str
    payments: str

    @property
    def queues(self) -> tuple[str, str]:
        return self.orders, self.payments

    def args(self) -> list[str]:
        return [
            *("--prefix", self.topology.prefix, "--levels", str(self.topology.levels)),
            *("--queue-type", self.topology.queue_type),
        ]


@pytest.fixture
async def chain(connection: AbstractRobustConnection, unique: str) -> AsyncIterator[Chain]:
    topology = DelayTopology(prefix=unique, levels=16, queue_type="classic")
    found = Chain(topology, f"{unique}.orders", f"{unique}.payments")
    channel = await connection.channel()
    for queue in found.queues:
        await channel.declare_queue(queue, durable=True)
    await declare_topology(channel, topology, queues=list(found.queues))
    await channel.close()
    yield found
    await delete_all(connection, topology=topology, queues=found.queues)


def _cli(*args: str, url: str, master: str | None = None) -> list[str]:
    command = [str(Path(sys.executable).with_name("delayed-retry")), "--url", url, *args]
    return command if master is None else [*command, "--master", master]


def _env() -> dict[str, str]:
    # The driver on loopback, where the master and workers listen.
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}


async def _run(command: list[str], cluster: SparkStandalone) -> str:
    """Run a command to its end; its stdout, or a failure with its stderr and the cluster's logs."""
    done = await asyncio.to_thread(
        subprocess.run,
        command,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        env=_env(),
        check=False,
    )
    assert done.returncode == 0, (
        f"{command[3:]} exited with {done.returncode}:\n{done.stderr[-3000:]}\n{cluster.logs()}"
    )
    return done.stdout


async def _park(connection: AbstractRobustConnection, chain: Chain) -> None:
    """Park two kinds of failure on two queues, as the library's parking writes them."""
    channel = await connection.channel()
    exchange = await channel.get_exchange(chain.topology.parking_exchange)
    now = datetime.now(UTC)
    failures: list[tuple[str, BaseException]] = [
        (chain.orders, TimeoutError(f"gateway did not answer in {i} s")) for i in range(TIMEOUTS)
    ] + [(chain.payments, ValueError(f"bad sku {i}")) for i in range(INVALID)]
    for n, (queue, exc) in enumerate(failures):
        headers = parked_headers(queue, exc, parked_at=now, first_failure_at=now, retries=2)
        message = aio_pika.Message(f'{{"n": {n}}}'.encode(), headers=headers, message_id=f"m{n}")
        await exchange.publish(message, routing_key=queue)
    await channel.close()


async def _archived(
    connection: AbstractRobustConnection,
    chain: Chain,
    archive: str,
    *,
    url: str,
    cluster: SparkStandalone,
) -> None:
    """Park the messages and archive both parking queues with ``delayed-retry archive``."""
    await _park(connection, chain)
    for queue in chain.queues:
        command = [
            "archive",
            "--queue",
            f"{queue}.parking",
            "--to",
            archive,
            "--idle-timeout",
            "1s",
        ]
        await _run(_cli(*command, url=url), cluster)


async def _drain(
    connection: AbstractRobustConnection, queues: tuple[str, ...], n: int
) -> Counter[tuple[str, str, bytes]]:
    """Take at least ``n`` messages from ``queues``, then what else arrives until they are quiet:
    (queue, message id, body) with how often each came."""
    got: Counter[tuple[str, str, bytes]] = Counter()
    channel = await connection.channel()

    async def take() -> bool:
        for queue in queues:
            source = await channel.get_queue(queue)
            while (message := await source.get(fail=False, no_ack=True)) is not None:
                got[(queue, str(message.message_id), message.body)] += 1
        return got.total() >= n

    await wait_until(take, timeout=120, what=f"{n} messages in {queues}")
    # Duplicates come with the rest: a last look once every queue is empty.
    await take()
    await channel.close()
    return got


def _without_report_time(text: str) -> list[str]:
    return [line for line in text.splitlines() if "report made" not in line]


async def test_analyze_redrive_and_schedule_on_a_cluster_equal_local_mode(
    spark_standalone: SparkStandalone,
    spark: Any,
    rabbitmq_url: str,
    connection: AbstractRobustConnection,
    chain: Chain,
    tmp_path: Path,
) -> None:
    cluster, archive = spark_standalone.url, str(tmp_path / "archive")
    await _archived(connection, chain, archive, url=rabbitmq_url, cluster=spark_standalone)

    on_cluster = await _run(
        _cli("spark", "analyze", archive, "--no-report", url=rabbitmq_url, master=cluster),
        spark_standalone,
    )
    local = await asyncio.to_thread(analyze_archive, spark, archive)
    assert _without_report_time(on_cluster) == _without_report_time(format_table(local))
    assert f"{TIMEOUTS + INVALID} distinct" in on_cluster
    # Both workers ran executors of the application.
    for worker in ("worker-0", "worker-1"):
        assert list((spark_standalone.folder / worker).glob("app-*")), worker

    redrive_args = ["spark", "redrive", archive, *chain.args(), "--redrive-id", "on-cluster"]
    on_cluster = await _run(_cli(*redrive_args, url=rabbitmq_url, master=cluster), spark_standalone)
    assert f"sent {TIMEOUTS + INVALID}" in on_cluster
    sent_by_cluster = await _drain(connection, chain.queues, TIMEOUTS + INVALID)
    result = await asyncio.to_thread(
        redrive, spark, archive, url=rabbitmq_url, topology=chain.topology, redrive_id="local"
    )
    assert result.sent == TIMEOUTS + INVALID
    assert result.by_queue == {chain.orders: TIMEOUTS, chain.payments: INVALID}
    for queue, n in result.by_queue.items():
        assert f"  {queue}: {n}" in on_cluster
    sent_locally = await _drain(connection, chain.queues, TIMEOUTS + INVALID)
    assert sent_by_cluster == sent_locally
    assert set(sent_by_cluster.values()) == {1}

    rows = tmp_path / "reminders.json"
    due = int(time.time() * 1000) + 500
    rows.write_text(
        "".join(
            json.dumps({"order_id": f"o{i}", "due_ms": due + 20 * i, "payload": {"order": i}})
            + "\n"
            for i in range(30)
        )
    )
    schedule_args = [
        *("spark", "schedule", str(rows), "--format", "json", "--queue", chain.orders),
        *("--due-at", "due_ms", "--body", "payload", "--key", "order_id"),
        *("--schedule-id", "reminders", "--ledger", str(tmp_path / "ledger-cluster")),
        *chain.args(),
    ]
    on_cluster = await _run(
        _cli(*schedule_args, url=rabbitmq_url, master=cluster), spark_standalone
    )
    assert "30 rows, sent 30, skipped 0" in on_cluster
    scheduled_by_cluster = await _drain(connection, (chain.orders,), 30)
    frame = spark.read.json(str(rows))
    local_schedule = await asyncio.to_thread(
        schedule_dataframe,
        frame,
        queue=chain.orders,
        due_at="due_ms",
        body="payload",
        key="order_id",
        schedule_id="reminders",
        ledger=str(tmp_path / "ledger-local"),
        url=rabbitmq_url,
        topology=chain.topology,
    )
    assert (local_schedule.rows, local_schedule.sent) == (30, 30)
    assert await _drain(connection, (chain.orders,), 30) == scheduled_by_cluster
    assert set(scheduled_by_cluster.values()) == {1}


async def test_a_redrive_that_loses_an_executor_keeps_the_ledgers_promise(
    spark_standalone: SparkStandalone,
    rabbitmq_url: str,
    connection: AbstractRobustConnection,
    chain: Chain,
    tmp_path: Path,
) -> None:
    archive, ledger = str(tmp_path / "archive"), str(tmp_path / "ledger")
    total = TIMEOUTS + INVALID
    await _archived(connection, chain, archive, url=rabbitmq_url, cluster=spark_standalone)
    # At a rate the publishing stage runs in barrier mode: its tasks wait for each other,
    # and worker 0's executor is killed as its task is about to publish.
    args = [
        *("spark", "redrive", archive, "--rate", "10/s", "--ledger", ledger),
        *("--redrive-id", "killed", *chain.args()),
    ]
    command = _cli(*args, url=rabbitmq_url, master=spark_standalone.url)
    earlier = set(spark_standalone.executor_logs(0))
    process = await asyncio.create_subprocess_exec(*command, stdout=PIPE, stderr=PIPE, env=_env())
    try:

        async def publishing() -> bool:
            # The executor logs its task entering the barrier that starts the publishing.
            logs = set(spark_standalone.executor_logs(0)) - earlier
            started = any(BARRIER in log.read_text(errors="replace") for log in logs)
            return started or process.returncode is not None

        await wait_until(publishing, timeout=COMMAND_TIMEOUT, what="worker 0 to start publishing")
        assert process.returncode is None, "the redrive ended before an executor was killed"
        victim = spark_standalone.executor_pids()[0]
        assert len(victim) == 1, f"worker 0 runs executors {victim}, not one"
        os.kill(victim[0], signal.SIGKILL)
        output = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT)
        out, err = (text.decode() for text in output)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    # A rated redrive publishes in a barrier stage, which Spark does not run again: the
    # command fails, saying to run it again (unless the kill came after the last task ended).
    # What the ledger holds was confirmed.
    killed = f"the killed run exited with {process.returncode}: {out}\n{err[-2000:]}"
    if process.returncode:
        errors = [line for line in err.splitlines() if line.startswith("delayed-retry: error:")]
        assert len(errors) == 1, killed
        assert "publishing job failed after" in errors[0], killed
        assert "sends only the rest" in errors[0], killed
    recorded = recorded_keys(ledger, "part")
    rerun = await _run(command, spark_standalone)
    counts = re.search(r"already sent (\d+), .*; sent (\d+)", rerun)
    assert counts is not None, rerun
    assert (int(counts[1]), int(counts[2])) == (len(recorded), total - len(recorded)), rerun
    assert len(recorded_keys(ledger, "part")) == total

    received = await _drain(connection, chain.queues, total)
    assert {message_id for (_, message_id, _) in received} == {f"m{n}" for n in range(total)}
    # Sent twice: only what the killed run confirmed after its partition's last ledger file
    # (one every 20,000 confirms and one at its end), never a message the ledger recorded.
    ids = pq.read_table(archive, columns=["message_key", "message_id"]).to_pylist()
    recorded_ids = {row["message_id"] for row in ids if row["message_key"] in recorded}
    twice = {message_id for (_, message_id, _), n in received.items() if n > 1}
    assert not twice & recorded_ids, killed
    assert max(received.values()) <= 2, killed
    print(
        f"killed executor: {total - len(recorded)} left "
        f"for the re-run, {len(twice)} sent twice; {killed}"
    )
