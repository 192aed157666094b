"""The ``archive`` and ``spark`` commands through the real command line entry point."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from delayed_retry.cli.main import main
from delayed_retry.spark.synthetic import parked_row, write_archive
from delayed_retry.topology import DelayTopology

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
    assert "Parked messages: 4 distinct" in out
    assert (tmp_path / "arch.report.html").exists()

    code = main(
        ["spark", "redrive", archive, "--where", "retries = 3", "--rate", "10/s", "--dry-run"]
    )
    assert code == 0
    assert "would send 4" in capsys.readouterr().out

    assert main(["spark", "redrive", archive, "--where", "retries = = 3", "--dry-run"]) == 2
    errors = _error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and errors[0].startswith("delayed-retry: error: --where")

    assert main(["spark", "analyze", str(tmp_path / "missing")]) == 2
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
    assert code == 2
    errors = _error_lines(capsys.readouterr().err)
    assert len(errors) == 1 and "choose a folder" in errors[0]
