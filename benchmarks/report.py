"""Write a suite run out: a table on stdout, a JSON file and a PNG plot."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any


def table(rows: list[dict[str, Any]]) -> str:
    """Rows as a fixed-width text table: workload, subject, value, baseline, ratio."""
    header = (
        "workload",
        "subject",
        "value",
        "baseline",
        "value (baseline)",
        "ratio",
        "client",
        "wall",
        "note",
    )
    lines = []
    for row in rows:
        ratio = row.get("ratio")
        lines.append(
            (
                row["workload"],
                row["subject"],
                f"{row['value']:g} {row['unit']}",
                row["baseline"],
                f"{row['baseline_value']:g}",
                "n/a" if ratio is None else f"{ratio:.3f}",
                f"{row['client_ratio']:.3f}" if "client_ratio" in row else "",
                f"{row['wall_ratio']:.3f}" if "wall_ratio" in row else "",
                row.get("note", ""),
            )
        )
    widths = [max(len(str(c)) for c in col) for col in zip(header, *lines, strict=False)]
    out = []
    for line in (header, *lines):
        out.append("  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)))
        if line is header:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_json(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    path.write_text(json.dumps({"meta": meta, "results": rows}, indent=2, default=str) + "\n")


def plot(path: Path, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    """One bar per row: its ratio to its baseline (1.0 = as fast as the baseline)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outcome_rows = [r for r in rows if _is_outcome(r)]
    ratio_rows = [
        r
        for r in rows
        if r.get("ratio") is not None and "precision" not in r["workload"] and not _is_outcome(r)
    ]
    precision_rows = [r for r in rows if "precision" in r["workload"]]
    # The ratio panel when there are ratios (or nothing else), then precision, then outcomes.
    kinds = ["ratio"] if ratio_rows or not (precision_rows or outcome_rows) else []
    kinds += ["precision"] * bool(precision_rows) + ["outcome"] * bool(outcome_rows)
    panels = len(kinds)
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 0.6 * len(rows) + 2.5), squeeze=False)
    for kind, ax in zip(kinds, axes[0], strict=True):
        if kind == "ratio":
            _plot_ratios(ax, ratio_rows)
        elif kind == "precision":
            _plot_precision(ax, precision_rows)
        else:
            _plot_outcomes(ax, outcome_rows)
    fig.suptitle(
        f"delayed-retry benchmarks — RabbitMQ {meta.get('rabbitmq')} — {meta.get('machine')}\n"
        + textwrap.fill(str(meta.get("parameters")), 200),
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _is_outcome(row: dict[str, Any]) -> bool:
    """A storm, crash or long-delay row (benchmarks/storm.py): counts beside a time."""
    return "lost" in row and "duplicates" in row


def _plot_outcomes(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Storm time / ideal, and what each peer lost, duplicated or had closed, per row."""
    names = [f"{r['workload']}\n{r['subject']}" for r in rows]
    series = (
        ("time / ideal (storm, long delay)", [_slowdown(r) for r in rows]),
        ("not finished in time", [float(r.get("not_done", 0)) for r in rows]),
        ("lost", [float(r["lost"]) for r in rows]),
        ("duplicates", [float(r["duplicates"]) for r in rows]),
        (
            "channels closed by the broker",
            [float(max(r["channel_closures"], r["timeouts_logged"])) for r in rows],
        ),
    )
    height = 0.16
    for j, (label, values) in enumerate(series):
        ax.barh([i + j * height for i in range(len(rows))], values, height=height, label=label)
    ax.set_yticks([i + 2 * height for i in range(len(rows))], names, fontsize=6)
    ax.set_xscale("symlog", linthresh=10)
    ax.invert_yaxis()
    ax.set_xlabel("count, or slowdown against the ideal (1 = ideal; log above 10)")
    ax.legend(fontsize=7)


def _slowdown(row: dict[str, Any]) -> float:
    ratio = row.get("ratio")
    if "crash" in row["workload"] or not ratio:
        return 0.0
    return float(1 / ratio)


def _plot_ratios(ax: Any, rows: list[dict[str, Any]]) -> None:
    labels = [f"{r['workload']}\n{r['subject']}\nvs {r['baseline']}" for r in rows]
    values = [r["ratio"] for r in rows]
    ax.barh(range(len(values)), values, color="tab:blue")
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to the baseline of the same run (CPU cost per message, inverse)")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=7)


def _plot_precision(ax: Any, rows: list[dict[str, Any]]) -> None:
    names = [f"{r['workload']}\n{r['subject']}" for r in rows]
    for j, key in enumerate(("p50", "p99", "max")):
        ax.barh(
            [i + j * 0.25 for i in range(len(names))],
            [r["lateness_ms"][key] for r in rows],
            height=0.25,
            label=key,
        )
    ax.set_yticks([i + 0.25 for i in range(len(names))], names, fontsize=7)
    ax.set_xscale("symlog", linthresh=10)
    ax.invert_yaxis()
    ax.set_xlabel("ms after due (log above 10 ms)")
    ax.legend(fontsize=7)
