"""The Spark commands check their inputs before Spark starts (no JVM for a typo)."""

from __future__ import annotations

from pathlib import Path

import pytest

from delayed_retry.cli.main import main
from harness import free_port


@pytest.fixture(autouse=True)
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if a command gets as far as starting Spark."""

    def refuse(**_: object) -> None:
        raise AssertionError("Spark was started before the inputs were checked")

    monkeypatch.setattr("delayed_retry.spark.session.get_spark", refuse)


def test_analyze_reports_a_missing_archive_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["spark", "analyze", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert "archive" in err and "does not exist" in err and "nope" in err


def test_redrive_reports_a_missing_archive_and_a_dead_broker_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["spark", "redrive", str(tmp_path / "nope"), "--dry-run"]) == 1
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "arch").mkdir()
    url = f"amqp://guest:secret@127.0.0.1:{free_port()}/"  # nothing listens there
    assert main(["--url", url, "spark", "redrive", str(tmp_path / "arch")]) == 1
    err = capsys.readouterr().err
    assert "cannot connect to the broker" in err or "cannot reach the broker" in err
    assert "secret" not in err


def test_schedule_reports_a_missing_input_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["spark", "schedule", str(tmp_path / "rows.parquet"), "--queue", "q"]
    args += ["--due-at", "due", "--body", "body", "--schedule-id", "s", "--ledger", "l"]
    assert main(args) == 1
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.broker
def test_schedule_reports_a_missing_queue_before_spark(
    rabbitmq_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = tmp_path / "rows.json"
    rows.write_text('{"due": "2030-01-01T00:00:00Z", "body": "x"}\n')
    queue = f"no-such-queue-{tmp_path.name}"
    args = ["--url", rabbitmq_url, "spark", "schedule", str(rows), "--format", "json"]
    args += ["--queue", queue, "--due-at", "due", "--body", "body"]
    args += ["--schedule-id", "s", "--ledger", str(tmp_path / "ledger")]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert f"queue {queue!r} does not exist" in err


def test_generate_writes_a_synthetic_archive_of_few_failure_groups(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow.dataset as ds

    from delayed_retry.parking.fingerprint import fingerprint_headers

    target = tmp_path / "arch"
    assert main(["spark", "generate", "--rows", "400", "--to", str(target)]) == 0
    assert "wrote 400 synthetic parked messages" in capsys.readouterr().out
    table = ds.dataset(str(target), format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 400
    assert len(set(table.column("message_id").to_pylist())) == 400
    keys = {
        fingerprint_headers(
            {
                "x-exception-type": row["exception_type"],
                "x-exception-message": row["exception_message"],
                "x-exception-traceback": row["exception_traceback"],
            }
        ).key
        for row in table.to_pylist()
    }
    # 400 different messages, 4 ways of failing.
    assert len(keys) == 4
    assert main(["spark", "generate", "--rows", "0", "--to", str(target)]) == 2
    assert "--rows 0 must be at least 1" in capsys.readouterr().err
