"""The report's pure parts (time axis, terminal summary) and the HTML as Chromium draws it.

No Spark here: the :class:`Analysis` is built by hand, shaped like an
incident (three queues, 72 hours with a 52-hour gap), so these tests are
fast. The screenshots are kept in ``tests/artifacts/`` (not committed).
"""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from delayed_retry.spark.analyze import Analysis, ErrorGroup, Example
from delayed_retry.spark.report import format_table, sparkline, write_html_report
from delayed_retry.spark.timeline import choose_bucket, fill, floor_to, thin_ticks
from tests.support.browser import CHROMIUM_ARGS, chromium

T0 = datetime(2026, 3, 1, 6, 0, tzinfo=UTC)
ARTIFACTS = Path(__file__).parents[1] / "artifacts"
G1, G2 = "1a2b3c4d5e6f", "aa00bb11cc22"


@pytest.mark.parametrize(
    ("span", "bucket"),
    [
        (timedelta(0), 60),
        (timedelta(minutes=30), 60),
        (timedelta(hours=3), 5 * 60),
        (timedelta(hours=20), 15 * 60),
        (timedelta(hours=72), 3600),
        (timedelta(days=10), 3 * 3600),
        (timedelta(days=60), 86400),
        (timedelta(days=5000), 7 * 86400),
    ],
)
def test_bucket_size_follows_the_span(span: timedelta, bucket: int) -> None:
    assert choose_bucket(span) == bucket


def test_fill_keeps_empty_buckets_and_sums_the_rest_into_other() -> None:
    last = T0 + timedelta(hours=5, minutes=10)
    counts = {
        (T0, "a"): 2,
        (T0, "b"): 1,
        (T0 + timedelta(hours=5), "a"): 4,
        (T0 + timedelta(hours=5), "c"): 3,
    }
    timeline = fill(counts, first=T0, last=last, bucket_seconds=3600, keep=["a"])
    assert timeline.starts == tuple(T0 + timedelta(hours=h) for h in range(6))
    assert timeline.series["a"] == (2, 0, 0, 0, 0, 4)
    assert timeline.series["other"] == (1, 0, 0, 0, 0, 3)
    assert timeline.totals == (3, 0, 0, 0, 0, 7)


def test_fill_rejects_a_bucket_that_is_not_aligned() -> None:
    with pytest.raises(ValueError, match="floor_to"):
        fill({(T0 + timedelta(minutes=7), "a"): 1}, first=T0, last=T0, bucket_seconds=3600)


def test_floor_and_ticks() -> None:
    assert floor_to(T0 + timedelta(minutes=59, seconds=59), 3600) == T0
    assert thin_ticks(72, max_ticks=12) == list(range(0, 72, 6))
    assert thin_ticks(5) == [0, 1, 2, 3, 4]
    assert thin_ticks(0) == []


def test_sparkline_shows_every_nonzero_bucket_and_fits_the_width() -> None:
    line = sparkline([0, 1, 0, 500, 0], width=10)
    assert line[0] == " " and line[1] != " " and line[3] == "█"
    assert len(sparkline(list(range(300)), width=72)) <= 72
    assert sparkline([]) == ""


def incident() -> Analysis:
    """Three queues over 72 hours: a burst, a 52-hour gap, a second burst."""
    size = 3600
    counts: dict[tuple[datetime, str], int] = {}
    for hour in list(range(0, 14)) + list(range(66, 72)):
        at = T0 + timedelta(hours=hour)
        counts[(at, G1)] = 40 + hour % 7
        counts[(at, G2)] = 10 + hour % 3
        counts[(at, "99ff88ee77dd")] = 2
    last = T0 + timedelta(hours=71, minutes=50)
    by_group = fill(counts, first=T0, last=last, bucket_seconds=size, keep=[G1, G2])
    queues: dict[tuple[datetime, str], int] = {}
    for (at, key), n in counts.items():
        queue = "orders" if key == G1 else "payments"
        queues[(at, queue)] = queues.get((at, queue), 0) + n
    by_queue = fill(queues, first=T0, last=last, bucket_seconds=size, keep=["orders", "payments"])
    groups = (
        ErrorGroup(
            key=G1,
            exception_type="shop.GatewayTimeout",
            template="gateway did not answer in <num> s (order <num>)",
            frame="shop/gateway.py in call",
            kind="transient",
            count=sum(by_group.series[G1]),
            queues=("orders",),
            first_seen=T0,
            last_seen=last,
            examples=(
                Example(
                    message_id="ord-105",
                    message="gateway did not answer in 10 s (order 105)",
                    body='{"order": 105}',
                ),
                Example(
                    message_id="ord-2290",
                    message="gateway did not answer in 10 s (order 2290)",
                    body='{"order": 2290}',
                ),
            ),
        ),
        ErrorGroup(
            key=G2,
            exception_type="shop.ValidationError",
            template="field <str> missing",
            frame=None,
            kind="permanent",
            count=sum(by_group.series[G2]),
            queues=("payments", "refunds"),
            first_seen=T0,
            last_seen=last,
            examples=(Example(message_id="pay-7", message="field 'iban' missing", body="{}"),),
        ),
    )
    total = sum(by_group.totals)
    return Analysis(
        paths=("/data/parked/orders",),
        generated_at=T0 + timedelta(days=4),
        total=total + 3,
        distinct=total,
        first_parked_at=T0,
        last_parked_at=last,
        by_queue={
            "orders": sum(by_queue.series["orders"]),
            "payments": sum(by_queue.series["payments"]),
        },
        by_exception={
            "shop.GatewayTimeout": groups[0].count,
            "shop.ValidationError": groups[1].count,
        },
        by_kind={"transient": groups[0].count, "permanent": groups[1].count},
        by_reason={"max-retries": total - 5, "rejected": 5},
        by_retries={0: 20, 3: total - 20},
        park_seconds={"min": 0.0, "p50": 60.0, "p90": 300.0, "max": 900.0},
        park_seconds_sample=tuple(float(i % 900) for i in range(500)),
        group_count=3,
        groups=groups,
        by_group_over_time=by_group,
        by_queue_over_time=by_queue,
    )


def test_terminal_summary_is_compact_and_actionable() -> None:
    a = incident()
    text = format_table(a)
    lines = text.splitlines()
    assert len(lines) < 30  # 72 hours in a single timeline line, not 72 lines
    assert "per 1 hour: |" in text
    assert "2026-03-01 06:00 UTC → 2026-03-04 05:50 UTC" in text
    assert "ord-105, ord-2290" in text
    redrive = (
        "delayed-retry spark redrive /data/parked/orders --where \"fingerprint = '1a2b3c4d5e6f'\""
    )
    assert redrive in text
    # A permanent group gets no redrive command: it would fail again.
    assert "aa00bb11cc22" not in text
    assert "reasons:    max-retries" in text


@pytest.mark.browser
def test_html_report_in_headless_chromium(tmp_path: Path) -> None:
    from PIL import Image

    report = write_html_report(incident(), str(tmp_path / "report.html"))
    content = Path(report).read_text()
    assert content.count("data:image/png;base64,") == 4
    assert "/data/parked/orders" in content and "report made 2026-03-05 06:00 UTC" in content
    assert "fingerprint = &#x27;1a2b3c4d5e6f&#x27;" in content
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "spark-report.png"
    shot.unlink(missing_ok=True)
    result = subprocess.run(
        [
            chromium(),
            "--headless",
            *CHROMIUM_ARGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            "--hide-scrollbars",
            "--window-size=1280,1600",
            f"--screenshot={shot}",
            Path(report).as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    image = Image.open(shot).convert("L")
    assert image.size == (1280, 1600)
    width = image.size[0]
    # The first chart spans the page: dark pixels (bars, axes, labels) near both edges.
    band = image.crop((0, 120, width, 520))
    left = band.crop((0, 0, width // 6, band.height))
    right = band.crop((width * 5 // 6, 0, width, band.height))
    for edge in (left, right):
        darkest = edge.getextrema()[0]
        assert isinstance(darkest, int) and darkest < 128
