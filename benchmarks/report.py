"""Write a suite run out: a table on stdout, a JSON file and a PNG plot."""

from __future__ import annotations

import json
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

    ratio_rows = [
        r for r in rows if r.get("ratio") is not None and "precision" not in r["workload"]
    ]
    precision_rows = [r for r in rows if "precision" in r["workload"]]
    panels = 1 + bool(precision_rows)
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 0.6 * len(rows) + 2.5), squeeze=False)
    ax = axes[0][0]
    labels = [f"{r['workload']}\n{r['subject']}\nvs {r['baseline']}" for r in ratio_rows]
    values = [r["ratio"] for r in ratio_rows]
    ax.barh(range(len(values)), values, color="tab:blue")
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.invert_yaxis()
    ax.set_xlabel("ratio to the baseline of the same run (CPU cost per message, inverse)")
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f}", va="center", fontsize=7)
    if precision_rows:
        ax2 = axes[0][1]
        names = [f"{r['workload']}\n{r['subject']}" for r in precision_rows]
        for j, key in enumerate(("p50", "p99", "max")):
            ax2.barh(
                [i + j * 0.25 for i in range(len(names))],
                [r["lateness_ms"][key] for r in precision_rows],
                height=0.25,
                label=key,
            )
        ax2.set_yticks([i + 0.25 for i in range(len(names))], names, fontsize=7)
        ax2.set_xscale("symlog", linthresh=10)
        ax2.invert_yaxis()
        ax2.set_xlabel("ms after due (log above 10 ms)")
        ax2.legend(fontsize=7)
    fig.suptitle(
        f"delayed-retry benchmarks — RabbitMQ {meta.get('rabbitmq')} — {meta.get('machine')}\n"
        f"{meta.get('parameters')}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
