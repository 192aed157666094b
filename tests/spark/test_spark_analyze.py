"""The analysis job on a synthetic archive whose counts are known."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_retry.spark import ArchiveReadError, analyze_archive, format_table, write_html_report
from delayed_retry.spark.synthetic import parked_row, write_archive
from delayed_retry.topology import DelayTopology

pytestmark = pytest.mark.spark

T0 = datetime(2024, 3, 1, 10, 15, tzinfo=UTC)


class ValidationError(Exception):
    pass


def _rows(topology: DelayTopology) -> list[dict[str, Any]]:
    rows = []
    # 6 timeouts on "orders" in hour 10, 3 retries, parked 60 s after first failure
    for i in range(6):
        rows.append(
            parked_row(
                topology,
                "orders",
                f"o{i}".encode(),
                TimeoutError("db timed out"),
                parked_at=T0 + timedelta(minutes=i),
                retries=3,
            )
        )
    # 3 connection errors on "payments" in hour 11, 5 retries, parked 600 s after
    for i in range(3):
        rows.append(
            parked_row(
                topology,
                "payments",
                f"p{i}".encode(),
                ConnectionRefusedError("connection refused"),
                parked_at=T0 + timedelta(hours=1, minutes=i),
                retries=5,
                park_after=timedelta(seconds=600),
            )
        )
    # 2 validation failures on "orders" in hour 11, no retries
    for i in range(2):
        rows.append(
            parked_row(
                topology,
                "orders",
                f"v{i}".encode(),
                ValidationError("field 'sku' missing"),
                parked_at=T0 + timedelta(hours=1, minutes=30 + i),
                retries=0,
                park_after=timedelta(seconds=0),
            )
        )
    # 1 unknown error on the next day
    rows.append(
        parked_row(
            topology,
            "orders",
            b"x",
            RuntimeError("boom"),
            parked_at=T0 + timedelta(days=1),
            retries=1,
        )
    )
    return rows


def test_analysis_counts_match_known_input(spark: Any, tmp_path: Path) -> None:
    topology = DelayTopology()
    rows = _rows(topology)
    write_archive(tmp_path / "arch", "orders.parking", rows)
    # A duplicate (a redelivery archived twice) counts once.
    write_archive(tmp_path / "arch", "orders.parking", rows[:1])

    a = analyze_archive(spark, str(tmp_path / "arch"), top=5)

    assert a.total == 13
    assert a.distinct == 12
    assert a.by_queue == {"orders": 9, "payments": 3}
    assert a.by_exception == {
        "TimeoutError": 6,
        "ConnectionRefusedError": 3,
        f"{__name__}.ValidationError": 2,
        "RuntimeError": 1,
    }
    assert a.by_kind == {"transient": 9, "permanent": 2, "unknown": 1}
    hour = T0.replace(minute=0)
    assert a.by_hour == {
        hour: 6,
        hour + timedelta(hours=1): 5,
        hour + timedelta(days=1): 1,
    }
    assert a.by_retries == {0: 2, 1: 1, 3: 6, 5: 3}
    assert a.park_seconds["min"] == 0.0
    assert a.park_seconds["max"] == 600.0
    assert a.top_errors[0].count == 6
    assert a.top_errors[0].exception_type == "TimeoutError"
    assert a.top_errors[0].message == "db timed out"
    assert a.top_errors[0].queues == ("orders",)
    assert a.top_errors[0].example_body.startswith("o")

    text = format_table(a)
    assert "payments" in text and "transient" in text and "db timed out" in text
    report = write_html_report(a, str(tmp_path / "arch.report.html"))
    content = Path(report).read_text()
    assert content.count("data:image/png;base64,") == 4
    assert "field &#x27;sku&#x27; missing" in content


def test_missing_archive_is_a_one_line_error(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ArchiveReadError, match="does not exist") as info:
        analyze_archive(spark, str(tmp_path / "nope"))
    assert "\n" not in str(info.value)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "part-0.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ArchiveReadError) as unreadable:
        analyze_archive(spark, str(junk))
    assert "\n" not in str(unreadable.value)
