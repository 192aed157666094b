"""The analysis job against a single-process pyarrow computation of the same statistics.

Usage::

    .venv/bin/python benchmarks/bench_spark_analyze.py --rows 10 1000000 [--master local[2]]

For each size a synthetic archive is generated (``delayed-retry spark
generate``), then, in the same run: ``delayed-retry spark analyze`` end to
end as a user runs it (a fresh JVM), the Spark job alone on a warm session,
and the pyarrow baseline (read, deduplicate, fingerprint every row with the
same function, count by queue, reason, kind, group, first/last parked).
Prints seconds and the ratio Spark / pyarrow; results are also appended as
JSON lines to ``benchmarks/results/spark_analyze.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from delayed_retry.fingerprint import fingerprint_headers
from delayed_retry.spark.analyze import PERMANENT_PATTERN, TRANSIENT_PATTERN
from delayed_retry.spark.generate import generate_archive


def pyarrow_statistics(path: str) -> dict[str, Any]:
    """The report's statistics computed in one process with pyarrow and the fingerprint."""
    import re

    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    table = ds.dataset(path, format="parquet", partitioning="hive").to_table(
        columns=[
            "message_key",
            "origin_queue",
            "parked_reason",
            "exception_type",
            "exception_message",
            "exception_traceback",
            "last_error",
            "parked_at",
            "message_id",
        ]
    )
    # Duplicates (same key) count once: keep the first row of each key.
    keys = table.column("message_key").to_pylist()
    seen: set[str] = set()
    keep = []
    for i, key in enumerate(keys):
        if key not in seen:
            seen.add(key)
            keep.append(i)
    table = table.take(keep)
    transient, permanent = re.compile(TRANSIENT_PATTERN), re.compile(PERMANENT_PATTERN)
    groups: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    columns = [
        table.column(c).to_pylist()
        for c in ("exception_type", "exception_message", "exception_traceback", "last_error")
    ]
    for kind_, message, trace, last in zip(*columns, strict=True):
        fp = fingerprint_headers(
            {
                "x-exception-type": kind_,
                "x-exception-message": message,
                "x-exception-traceback": trace,
                "x-retry-last-error": last,
            }
        )
        groups[fp.key] += 1
        text = f"{kind_ or ''} {message or last or ''}"
        kinds[
            "transient"
            if transient.search(text)
            else "permanent"
            if permanent.search(text)
            else "unknown"
        ] += 1
    parked = table.column("parked_at")
    return {
        "distinct": table.num_rows,
        "by_queue": dict(Counter(table.column("origin_queue").to_pylist())),
        "by_reason": dict(Counter(table.column("parked_reason").to_pylist())),
        "by_kind": dict(kinds),
        "groups": len(groups),
        "first": str(pc.min(parked)),
        "last": str(pc.max(parked)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[10, 1_000_000])
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--workdir", default="/tmp/delayed-retry-bench-analyze")
    args = parser.parse_args()
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    cli = str(Path(sys.executable).with_name("delayed-retry"))
    for rows in args.rows:
        archive = Path(args.workdir) / f"archive-{rows}"
        if not archive.exists():
            started = time.perf_counter()
            generate_archive(archive, rows=rows)
            print(
                f"{rows:>10} rows: generated in {time.perf_counter() - started:.1f} s", flush=True
            )

        started = time.perf_counter()
        baseline = pyarrow_statistics(str(archive))
        arrow_s = time.perf_counter() - started

        started = time.perf_counter()
        subprocess.run(
            [cli, "spark", "analyze", str(archive), "--master", args.master, "--no-report"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        cli_s = time.perf_counter() - started

        from delayed_retry.spark.analyze import analyze_archive
        from delayed_retry.spark.session import get_spark

        spark = get_spark(master=args.master)
        analyze_archive(spark, str(archive))  # warm-up: JIT, Python workers
        started = time.perf_counter()
        analysis = analyze_archive(spark, str(archive))
        job_s = time.perf_counter() - started
        assert analysis.distinct == baseline["distinct"], (analysis.distinct, baseline)
        assert analysis.group_count == baseline["groups"], (analysis.group_count, baseline)
        assert analysis.by_kind == baseline["by_kind"], (analysis.by_kind, baseline)
        line = {
            "rows": rows,
            "master": args.master,
            "pyarrow_s": round(arrow_s, 2),
            "spark_cli_s": round(cli_s, 2),
            "spark_job_warm_s": round(job_s, 2),
            "cli_over_pyarrow": round(cli_s / arrow_s, 2),
            "job_over_pyarrow": round(job_s / arrow_s, 2),
        }
        print(json.dumps(line), flush=True)
        with (results / "spark_analyze.jsonl").open("a") as handle:
            handle.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    main()
