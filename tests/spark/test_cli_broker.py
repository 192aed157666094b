"""The ``archive`` and ``spark`` commands through the real command line entry point."""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli.main import main
from delayed_retry.spark.class_cache import CACHE_ENV
from delayed_retry.spark.synthetic import parked_row, write_archive

pytestmark = pytest.mark.spark


def _error_lines(stderr: str) -> list[str]:
    """The error lines of a command's stderr (progress lines and logging aside)."""
    lines = stderr.replace("\r", "\n").splitlines()
    errors = [line for line in lines if "error" in line.lower()]
    assert all(line.startswith("delayed-retry: error:") for line in errors), errors
    return errors


def test_analyze_and_dry_run_redrive_commands(
    spark: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = DelayTopology()
    now = datetime(2024, 3, 1, 10, tzinfo=UTC)
    rows = [
        parked_row(topology, "orders", f"b{i}".encode(), TimeoutError("slow"), parked_at=now)
        for i in range(4)
    ]
    write_archive(tmp_path / "arch", "orders.parking", rows)
    archive = str(tmp_path / "arch")

    assert main(["spark", "analyze", archive]) == 0
    out = capsys.readouterr().out
    assert "4 distinct (4 archived rows)" in out
    assert (tmp_path / "arch.report.html").exists()
    # The printed redrive command of the group selects exactly that group.
    where = next(line for line in out.splitlines() if "redrive:" in line).split("--where ")[1]
    key = where.strip('"').split("'")[1]
    code = main(["spark", "redrive", archive, "--where", f"fingerprint = '{key}'", "--dry-run"])
    assert code == 0
    assert "would send 4" in capsys.readouterr().out
    code = main(
        ["spark", "redrive", archive, "--where", "fingerprint = 'ffffffffffff'", "--dry-run"]
    )
    assert code == 0
    assert "would send 0" in capsys.readouterr().out

    code = main(
        ["spark", "redrive", archive, "--where", "retries = 3", "--rate", "10/s", "--dry-run"]
    )
    assert code == 0
    assert "would send 4" in capsys.readouterr().out

    assert main(["spark", "redrive", archive, "--where", "retries = = 3", "--dry-run"]) == 2
    errors = _error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and errors[0].startswith("delayed-retry: error: --where")

    assert main(["spark", "analyze", str(tmp_path / "missing")]) == 1
    errors = _error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and "does not exist" in errors[0]


def test_archive_command_reports_an_unwritable_target(
    rabbitmq_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(
        ["--url", rabbitmq_url, "archive", "--queue", "q.parking", "--to", str(blocker / "a")]
    )
    assert code == 1  # a failure, not a usage error
    errors = _error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and "choose a folder" in errors[0]


def test_schedule_command_sends_each_row_with_its_headers(
    spark: Any, rabbitmq_url: str, unique: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import asyncio
    import json

    import aio_pika

    due = int(datetime.now(UTC).timestamp() * 1000)
    orders = tmp_path / "orders.json"
    orders.write_text(
        "".join(
            json.dumps({"order_id": f"o{i}", "due_ms": due, "payload": {"order": f"o{i}"}}) + "\n"
            for i in range(5)
        )
    )
    common = ["--url", rabbitmq_url, "spark", "schedule", str(orders), "--format", "json"]
    args = [
        *("--queue", unique, "--due-at", "due_ms", "--body", "payload", "--key", "order_id"),
        *("--schedule-id", "s1", "--ledger", str(tmp_path / "ledger"), "--partitions", "2"),
        *("--header", "x-order=order_id", "--prefix", unique, "--levels", "8"),
        *("--queue-type", "classic"),
    ]

    async def declare() -> None:
        connection = await aio_pika.connect(rabbitmq_url)
        channel = await connection.channel()
        await channel.declare_queue(unique, durable=True)
        await connection.close()

    async def drain() -> list[aio_pika.abc.AbstractIncomingMessage]:
        connection = await aio_pika.connect(rabbitmq_url)
        channel = await connection.channel()
        queue = await channel.declare_queue(unique, passive=True)
        got = []
        for _ in range(200):
            message = await queue.get(fail=False, no_ack=True)
            if message is not None:
                got.append(message)
            elif len(got) >= 5:
                break
            else:
                await asyncio.sleep(0.05)
        await connection.close()
        return got

    asyncio.run(declare())
    assert main([*common, *args]) == 0
    assert "5 rows, sent 5" in capsys.readouterr().out
    messages = asyncio.run(drain())
    assert sorted((m.headers["x-order"], json.loads(m.body)["order"]) for m in messages) == [
        (f"o{i}", f"o{i}") for i in range(5)
    ]
    assert main([*common, *args]) == 0  # the ledger remembers: nothing twice
    assert "sent 0, skipped 5" in capsys.readouterr().out

    # A usage error, before any Spark.
    assert main([*common, *args, "--header", "x-bad"]) == 2
    assert "header 'x-bad' must be NAME=COLUMN" in capsys.readouterr().err


def test_analyze_in_a_real_process_prints_no_jvm_start_up_warnings(tmp_path: Path) -> None:
    import subprocess
    import sys

    now = datetime(2024, 3, 1, 10, tzinfo=UTC)
    rows = [parked_row(DelayTopology(), "orders", b"b", TimeoutError("slow"), parked_at=now)]
    write_archive(tmp_path / "arch", "orders.parking", rows)
    command = [str(Path(sys.executable).with_name("delayed-retry")), "spark", "analyze"]
    cache = tmp_path / "cache" / "delayed-retry"
    # The first run writes the class cache as its JVM exits, the second starts from it:
    # neither says a word on stderr, and both tell the same.
    outputs = []
    for _ in range(2):
        done = subprocess.run(
            [*command, str(tmp_path / "arch"), "--no-report", "--master", "local[1]"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")},
        )
        assert done.returncode == 0, done.stderr
        assert "1 distinct" in done.stdout
        lines = [line for line in done.stderr.replace("\r", "\n").splitlines() if line.strip()]
        # Before: "WARNING: Using incubator modules", "Using Spark's default log4j profile",
        # "WARN Utils: Your hostname ... resolves to a loopback address", "WARN NativeCodeLoader".
        noise = [line for line in lines if "WARN" in line or "log4j" in line or "LogLevel" in line]
        assert noise == []
        # Not a terminal: no progress lines either.
        assert lines == [] and "\r" not in done.stderr
        outputs.append(done.stdout)
        archives = sorted(p.name for p in cache.iterdir())
        assert len(archives) == 1 and archives[0].endswith(".jsa"), archives  # no .tmp left
    generated = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC")  # when each report was made
    assert generated.sub("", outputs[0]) == generated.sub("", outputs[1])


def test_a_bad_where_in_a_real_process_is_one_line_on_stderr(tmp_path: Path) -> None:
    import subprocess
    import sys

    now = datetime(2024, 3, 1, 10, tzinfo=UTC)
    rows = [parked_row(DelayTopology(), "orders", b"b", TimeoutError("slow"), parked_at=now)]
    write_archive(tmp_path / "arch", "orders.parking", rows)
    command = [str(Path(sys.executable).with_name("delayed-retry")), "spark", "redrive"]
    done = subprocess.run(
        [*command, str(tmp_path / "arch"), "--where", "fingerprnt = 'x'", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={**os.environ, CACHE_ENV: "off"},
    )
    assert done.returncode == 2, done.stderr
    # Before: 8.9 KB of PySpark's JSON log with a Java stack trace, then the error.
    assert done.stderr.splitlines() == [
        "delayed-retry: error: --where \"fingerprnt = 'x'\" names column 'fingerprnt', which "
        "the archive does not have; its columns are "
        + done.stderr.split("its columns are ")[1].strip()
    ]
    assert ", fingerprint, " in done.stderr


@pytest.mark.parametrize(
    ("line", "noise"),
    [
        ("WARNING: Using incubator modules: jdk.incubator.vector", True),
        ("Using Spark's default log4j profile: org/apache/spark/log4j2-defaults.properties", True),
        ('Setting default log level to "WARN".', True),
        ("To adjust logging level use sc.setLogLevel(newLevel). For SparkR, use …", True),
        ("26/11/23 18:00:47 WARN Utils: Your hostname, vm, resolves to a loopback address", True),
        ("26/11/23 18:01:02 WARN NativeCodeLoader: Unable to load native-hadoop library", True),
        ("26/11/23 18:01:02 ERROR Executor: Exception in task 0.0 in stage 1.0", False),
        ("java.lang.OutOfMemoryError: Java heap space", False),
        ("Traceback (most recent call last):", False),
    ],
)
def test_only_start_up_chatter_is_filtered_from_the_jvm_stderr(line: str, noise: bool) -> None:
    from delayed_retry.spark.jvm_output import is_startup_noise

    assert is_startup_noise(line) is noise
