"""The analysis for a person: a compact terminal summary and one self-contained HTML file.

:func:`format_table` is what ``delayed-retry spark analyze`` prints (a
screenful whatever the archive's size); :func:`write_html_report` writes the
report an on-call engineer opens: failure groups with the command to
redrive each, and charts on a real time axis.
"""

from __future__ import annotations

import base64
import html
import io
import logging
import os
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from delayed_retry.spark.analyze import Analysis, ErrorGroup
from delayed_retry.spark.timeline import Timeline, bucket_name

__all__ = ["format_table", "sparkline", "write_html_report"]

log = logging.getLogger(__name__)

_BARS = " ▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[int], *, width: int = 72) -> str:
    """Counts as one line of block characters, at most ``width`` wide (buckets merged)."""
    if not values:
        return ""
    per = max(1, -(-len(values) // width))
    merged = [sum(values[i : i + per]) for i in range(0, len(values), per)]
    peak = max(merged)
    if peak == 0:
        return _BARS[0] * len(merged)
    # Any non-zero bucket gets at least the lowest bar, so a single message is visible.
    return "".join(
        _BARS[0] if n == 0 else _BARS[max(1, round(n / peak * (len(_BARS) - 1)))] for n in merged
    )


def _when(moment: datetime | None) -> str:
    return moment.strftime("%Y-%m-%d %H:%M UTC") if moment else "?"


def _span(first: datetime | None, last: datetime | None) -> str:
    if first is None or last is None:
        return "?"
    seconds = int((last - first).total_seconds())
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _short(text: str, limit: int = 90) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _counts(items: dict[Any, int], limit: int = 8) -> str:
    shown = [f"{k} {n}" for k, n in list(items.items())[:limit]]
    if len(items) > limit:
        shown.append(f"… {len(items) - limit} more")
    return ", ".join(shown) or "(none)"


def _group_lines(number: int, g: ErrorGroup, paths: Sequence[str]) -> list[str]:
    label = _short(f"{g.exception_type}: {g.template}")
    lines = [f"  #{number:<2} {g.count:>7}  {g.kind:<9}  {label}"]
    where = f" at {g.frame}" if g.frame else ""
    lines.append(
        f"      {', '.join(g.queues)} · {_when(g.first_seen)} → {_when(g.last_seen)}{where}"
    )
    lines.append("      e.g. " + ", ".join(e.message_id for e in g.examples))
    if g.kind != "permanent":
        lines.append(f"      redrive: {g.redrive_command(paths)}")
    return lines


def format_table(analysis: Analysis) -> str:
    """A compact summary for a terminal: totals, breakdowns, one timeline line, the groups."""
    a = analysis
    lines = [
        f"Parked messages in {', '.join(a.paths)} (report made {_when(a.generated_at)})",
        f"  {a.distinct} distinct ({a.total} archived rows), "
        f"parked {_when(a.first_parked_at)} → {_when(a.last_parked_at)} "
        f"({_span(a.first_parked_at, a.last_parked_at)})",
        f"  queues:     {_counts(a.by_queue)}",
        f"  reasons:    {_counts(a.by_reason)}",
        f"  kinds:      {_counts(a.by_kind)}",
        f"  retries:    {_counts({f'{r}×': n for r, n in a.by_retries.items()})}",
    ]
    if a.park_seconds:
        lines.append(
            "  first failure → parked: "
            + ", ".join(f"{k} {v:.1f} s" for k, v in a.park_seconds.items())
        )
    timeline = a.by_queue_over_time
    if timeline is not None and timeline.starts:
        lines.append(
            f"  per {bucket_name(timeline.bucket_seconds)}: |{sparkline(timeline.totals)}| "
            f"peak {max(timeline.totals)}"
        )
    lines += ["", f"Failure groups ({len(a.groups)} of {a.group_count}, biggest first)"]
    for number, group in enumerate(a.groups, 1):
        lines += _group_lines(number, group, a.paths)
    if not a.groups:
        lines.append("  (none)")
    return "\n".join(lines)


def _png(draw: Callable[[Any], None], *, height: float = 3.4) -> str:
    import matplotlib

    matplotlib.use("Agg")
    # matplotlib logs font-cache chatter at INFO; the report is not the place for it.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(12, height))
    try:
        draw(axes)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    finally:
        plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _time_chart(timeline: Timeline, labels: dict[str, str], what: str) -> Callable[[Any], None]:
    def draw(ax: Any) -> None:
        import matplotlib.dates as mdates
        from matplotlib.ticker import MaxNLocator

        width = timedelta(seconds=timeline.bucket_seconds) * 0.9
        bottom = [0] * len(timeline.starts)
        for name, counts in timeline.series.items():
            ax.bar(
                timeline.starts,
                counts,
                width=width,
                bottom=bottom,
                align="edge",
                label=_short(labels.get(name, name), 80),
            )
            bottom = [b + c for b, c in zip(bottom, counts, strict=True)]
        locator = mdates.AutoDateLocator(minticks=3, maxticks=10)  # type: ignore[no-untyped-call]
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        end = timeline.starts[-1] + timedelta(seconds=timeline.bucket_seconds)
        ax.set_xlim(timeline.starts[0], end)
        ax.set_xlabel("parked at (UTC)")
        ax.set_ylabel(f"messages per {bucket_name(timeline.bucket_seconds)}")
        # Below the axes, so long group labels never squeeze the time axis.
        ax.legend(
            title=what,
            fontsize=8,
            title_fontsize=8,
            loc="upper left",
            bbox_to_anchor=(0.0, -0.22),
            ncol=2,
            frameon=False,
        )
        ax.grid(axis="y", alpha=0.3)

    return draw


def _charts(a: Analysis) -> list[tuple[str, str]]:
    from matplotlib.ticker import MaxNLocator

    charts = []
    labels = {g.key: f"#{i} {g.exception_type}: {g.template}" for i, g in enumerate(a.groups, 1)}
    if a.by_group_over_time is not None:
        charts.append(
            (
                "Parked over time, by failure group",
                _png(_time_chart(a.by_group_over_time, labels, "failure group"), height=4.2),
            )
        )
    if a.by_queue_over_time is not None:
        charts.append(
            (
                "Parked over time, by queue",
                _png(_time_chart(a.by_queue_over_time, {}, "queue"), height=4.2),
            )
        )
    if a.by_retries:

        def retries(ax: Any) -> None:
            ax.bar([str(k) for k in a.by_retries], list(a.by_retries.values()))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("delayed retries before parking")
            ax.set_ylabel("messages")

        charts.append(("Retries before parking", _png(retries, height=2.6)))
    if a.park_seconds_sample:

        def park(ax: Any) -> None:
            ax.hist(a.park_seconds_sample, bins=30)
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_xlabel("seconds from first failure to parking")
            ax.set_ylabel("messages")

        charts.append(("Time from first failure to parking", _png(park, height=2.6)))
    return charts


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


_STYLE = (
    "body{font-family:sans-serif;margin:1.5em;max-width:none}"
    "table{border-collapse:collapse;margin-bottom:1em}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}"
    "img{width:100%;height:auto}"
    ".group{border:1px solid #ccc;border-radius:4px;padding:.5em 1em;margin-bottom:.8em}"
    ".transient{border-left:6px solid #2a7}.permanent{border-left:6px solid #c33}"
    ".unknown{border-left:6px solid #999}"
    "code{background:#f4f4f4;padding:2px 4px;display:inline-block;word-break:break-all}"
    ".meta{color:#555}"
)


def _group_html(number: int, g: ErrorGroup, paths: Sequence[str]) -> str:
    examples = "".join(
        f"<li><code>{html.escape(e.message_id)}</code> {html.escape(_short(e.message, 200))}"
        f" <span class='meta'>body: {html.escape(e.body)}</span></li>"
        for e in g.examples
    )
    frame = f" · raised at <code>{html.escape(g.frame)}</code>" if g.frame else ""
    if g.kind == "permanent":
        action = "<p>Likely permanent: fix the message or the code before redriving.</p>"
    else:
        action = f"<p>Redrive: <code>{html.escape(g.redrive_command(paths))}</code></p>"
    return (
        f"<div class='group {html.escape(g.kind)}'>"
        f"<h3>#{number} · {g.count} × {html.escape(g.exception_type)} · {html.escape(g.kind)}</h3>"
        f"<p><code>{html.escape(g.template)}</code></p>"
        f"<p class='meta'>queues {html.escape(', '.join(g.queues))} · first "
        f"{html.escape(_when(g.first_seen))} · last {html.escape(_when(g.last_seen))}{frame}"
        f" · fingerprint <code>{html.escape(g.key)}</code></p>"
        f"<ul>{examples}</ul>{action}</div>"
    )


def write_html_report(analysis: Analysis, path: str, *, title: str = "Parked messages") -> str:
    """Write the analysis as one self-contained HTML file (charts inline); return its path."""
    a = analysis
    parts = [
        "<!doctype html><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        f"<style>{_STYLE}</style>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='meta'>Archive {html.escape(', '.join(a.paths))} · report made "
        f"{html.escape(_when(a.generated_at))}</p>",
        f"<p><b>{a.distinct}</b> distinct messages ({a.total} archived rows) in "
        f"<b>{a.group_count}</b> failure groups, parked from "
        f"<b>{html.escape(_when(a.first_parked_at))}</b> to "
        f"<b>{html.escape(_when(a.last_parked_at))}</b> "
        f"({html.escape(_span(a.first_parked_at, a.last_parked_at))}).</p>",
    ]
    charts = _charts(a)
    for caption, png in charts[:2]:
        parts += [
            f"<h2>{html.escape(caption)}</h2>",
            f"<img alt='{html.escape(caption)}' src='data:image/png;base64,{png}'>",
        ]
    parts.append(f"<h2>Failure groups ({len(a.groups)} of {a.group_count})</h2>")
    parts += [_group_html(i, g, a.paths) for i, g in enumerate(a.groups, 1)]
    parts += [
        "<h2>By queue</h2>",
        _html_table(["queue", "messages"], list(a.by_queue.items())),
        "<h2>By parked reason</h2>",
        _html_table(["reason", "messages"], list(a.by_reason.items())),
        "<h2>Likely transient vs permanent</h2>",
        _html_table(["kind", "messages"], list(a.by_kind.items())),
        "<h2>By exception type</h2>",
        _html_table(["exception type", "messages"], list(a.by_exception.items())),
        "<h2>First failure to parking (seconds)</h2>",
        _html_table(["statistic", "seconds"], [(k, f"{v:.1f}") for k, v in a.park_seconds.items()]),
    ]
    for caption, png in charts[2:]:
        parts += [
            f"<h2>{html.escape(caption)}</h2>",
            f"<img alt='{html.escape(caption)}' src='data:image/png;base64,{png}'>",
        ]
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("\n".join(parts))
    return path
