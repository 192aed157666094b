"""Turning records into what a page shows: bodies, durations, histograms. Pure.

Nothing here marks anything safe: templates escape every value (Jinja2
autoescape), so a body or header full of markup is shown as text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from delayed_retry.durations import format_duration
from delayed_retry.headers.retry_state import read_epoch_ms
from delayed_retry.headers.values import header_int

__all__ = [
    "BodyView",
    "Histogram",
    "format_age",
    "header_rows",
    "histogram",
    "view_body",
]

TEXT_LIMIT = 16_384
HEX_LIMIT = 2_048


@dataclass(frozen=True)
class BodyView:
    """A body as shown: ``kind`` is ``text``, ``json`` or ``hex``."""

    kind: str
    text: str
    size: int
    shown: int

    @property
    def truncated(self) -> bool:
        return self.shown < self.size


def _printable(text: str) -> bool:
    return all(ch.isprintable() or ch in "\n\r\t" for ch in text)


def view_body(body: bytes, *, size: int | None = None, content_type: str | None = None) -> BodyView:
    """A safe view of ``body``: pretty JSON, text, or a hex dump of binary; large ones cut."""
    total = len(body) if size is None else size
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None and _printable(text):
        if len(body) <= TEXT_LIMIT and (
            (content_type or "").endswith("json") or text.lstrip()[:1] in ("{", "[")
        ):
            try:
                pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
            except ValueError:
                pass
            else:
                return BodyView("json", pretty, total, len(body))
        cut = text[:TEXT_LIMIT]
        return BodyView("text", cut, total, len(cut.encode()))
    chunk = body[:HEX_LIMIT]
    lines = []
    for offset in range(0, len(chunk), 16):
        row = chunk[offset : offset + 16]
        hexes = " ".join(f"{b:02x}" for b in row)
        ascii_ = "".join(chr(b) if 32 <= b < 127 else "." for b in row)
        lines.append(f"{offset:08x}  {hexes:<47}  {ascii_}")
    return BodyView("hex", "\n".join(lines), total, len(chunk))


def format_age(moment: datetime | None, *, now: datetime) -> str:
    """How long ago ``moment`` was, or ``?``."""
    if moment is None:
        return "?"
    return format_duration(max(now - moment, timedelta(0))) + " ago"


def header_rows(headers: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Headers as sorted (name, text) rows; bytes shown as hex, long values cut."""
    rows = []
    for name in sorted(headers):
        value = headers[name]
        if isinstance(value, bytes | bytearray):
            text = "bytes:" + bytes(value[:256]).hex()
        elif isinstance(value, datetime):
            text = value.isoformat()
        elif str(name).endswith("-at") and header_int(value) is not None:
            moment = read_epoch_ms(value)
            text = (
                f"{value} ({moment.isoformat(timespec='milliseconds')})" if moment else str(value)
            )
        else:
            text = str(value)
        if len(text) > 2_000:
            text = text[:2_000] + f"… ({len(text)} characters)"
        rows.append((str(name), text))
    return rows


@dataclass(frozen=True)
class Histogram:
    """Arrivals per time bucket, oldest first, with what an SVG bar chart needs."""

    start: datetime | None
    bucket: timedelta
    counts: list[int]

    @property
    def peak(self) -> int:
        return max(self.counts, default=0)

    @property
    def label(self) -> str:
        """What the chart shows, with its scale: the span, one bar's time, the tallest bar."""
        span = format_duration(self.bucket * len(self.counts))
        bar = format_duration(self.bucket)
        if self.peak == 0:
            return f"none parked in the last {span}"
        return f"last {span}, one bar per {bar}; tallest bar: {self.peak} parked"

    def bars(self, *, width: int = 240, height: int = 40) -> list[tuple[float, float, float, int]]:
        """``(x, y, w, h)`` of each bar in a ``width``×``height`` box (integers rounded)."""
        if not self.counts or self.peak == 0:
            return []
        w = width / len(self.counts)
        out = []
        for i, count in enumerate(self.counts):
            h = round(height * count / self.peak) if count else 0
            out.append((round(i * w, 1), float(height - h), max(round(w - 1, 1), 1.0), h))
        return out


_BUCKETS = (
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=15),
    timedelta(hours=1),
    timedelta(hours=6),
    timedelta(days=1),
    timedelta(days=7),
)


def histogram(moments: Iterable[datetime], *, now: datetime, buckets: int = 24) -> Histogram:
    """Arrivals counted per bucket, the bucket size chosen from the span; empty buckets kept."""
    times = sorted(moments)
    if not times:
        return Histogram(None, timedelta(hours=1), [0] * buckets)
    span = max(now - times[0], timedelta(minutes=1))
    size = next((b for b in _BUCKETS if b * buckets >= span), _BUCKETS[-1])
    start = now - size * buckets
    counts = [0] * buckets
    for moment in times:
        index = int((moment - start) / size)
        counts[min(max(index, 0), buckets - 1)] += 1
    return Histogram(start, size, counts)
