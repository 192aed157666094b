"""The analysis job on a synthetic archive whose counts are known."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.parking.fingerprint import fingerprint
from delayed_retry.spark import ArchiveReadError, analyze_archive, format_table, write_html_report
from delayed_retry.spark.synthetic import parked_row, write_archive

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
                TimeoutError(f"db timed out (order {100 + i})"),
                parked_at=T0 + timedelta(minutes=i),
                retries=3,
                message_id=f"order-{100 + i}",
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
    assert a.by_reason == {"max-retries": 12}
    assert a.by_retries == {0: 2, 1: 1, 3: 6, 5: 3}
    assert a.park_seconds["min"] == 0.0
    assert a.park_seconds["max"] == 600.0
    assert a.first_parked_at == T0
    assert a.last_parked_at == T0 + timedelta(days=1)
    assert a.paths == (str(tmp_path / "arch"),)

    # Six timeouts that differ only in the order number are one group.
    assert a.group_count == 4
    top = a.groups[0]
    assert (top.count, top.kind, top.queues) == (6, "transient", ("orders",))
    assert top.exception_type == "TimeoutError"
    assert top.template == "db timed out (order <num>)"
    assert (
        top.key
        == fingerprint(
            exception_type="TimeoutError", message="db timed out (order 1)", frame=top.frame
        ).key
    )
    assert top.frame is None  # built, never raised: its traceback has no frame
    assert [e.message_id for e in top.examples] == ["order-100", "order-105"]
    assert top.examples[0].message == "db timed out (order 100)"
    assert top.examples[0].body == "o0"
    assert (top.first_seen, top.last_seen) == (T0, T0 + timedelta(minutes=5))
    assert [g.count for g in a.groups] == [6, 3, 2, 1]

    # A real time axis: 1-hour buckets over the day, the empty hours present as zero.
    timeline = a.by_queue_over_time
    assert timeline is not None
    assert timeline.bucket_seconds == 3600
    assert len(timeline.starts) == 25
    assert timeline.starts[0] == T0.replace(minute=0)
    assert timeline.totals[:3] == (6, 5, 0)
    assert timeline.totals[-1] == 1
    assert sum(timeline.totals) == 12
    assert timeline.series["payments"][1] == 3
    by_group = a.by_group_over_time
    assert by_group is not None and by_group.series[top.key][0] == 6

    text = format_table(a)
    assert len(text.splitlines()) < 40
    assert "db timed out (order <num>)" in text and "order-100, order-105" in text
    assert top.redrive_command(a.paths) in text
    assert "per 1 hour:" in text
    report = write_html_report(a, str(tmp_path / "arch.report.html"))
    content = Path(report).read_text()
    assert content.count("data:image/png;base64,") == 4
    assert "field &#x27;sku&#x27; missing" in content or "field &lt;str&gt; missing" in content
    assert "max-retries" in content and str(tmp_path / "arch") in content


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


def test_the_analysis_runs_a_fixed_small_number_of_spark_jobs(spark: Any, tmp_path: Path) -> None:
    """The fixed cost of a small archive is mostly per job: five actions, not one per table."""
    write_archive(tmp_path / "arch", "orders.parking", _rows(DelayTopology()))
    context = spark.sparkContext
    context.setJobGroup("analysis-jobs", "count the analysis's jobs")
    try:
        analysis = analyze_archive(spark, str(tmp_path / "arch"))
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert analysis.distinct == 12
    jobs = context.statusTracker().getJobIdsForGroup("analysis-jobs")
    # Adaptive execution runs each shuffle stage as a job of its own: the five actions
    # came to 12 jobs on a 10-row archive, the twelve actions before to 36.
    assert 5 <= len(jobs) <= 14, len(jobs)
