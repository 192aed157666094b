"""The analysis job against a single-process pyarrow computation of the same statistics.

The suite's ``spark-analyze`` workload: ``benchmarks/run --only spark-analyze
--spark-analyze-rows 10 1000000``. For each size a synthetic archive is generated
(``delayed-retry spark generate``), then, in the same run: ``delayed-retry spark analyze`` end to
end as a user runs it (a fresh JVM), the pyarrow baseline (read,
deduplicate, fingerprint every row with the same function, count by queue,
reason, kind, group, first/last parked), and the Spark job alone on a warm
session (warmed up once, on the first size; ``--spark-analyze-no-warm`` skips it), which
must agree with the baseline.
Prints seconds and the ratio Spark / pyarrow; results are also appended as
JSON lines to ``benchmarks/results/spark_analyze.jsonl``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from workloads import Row, Suite

from delayed_retry.parking.fingerprint import fingerprint_headers
from delayed_retry.spark.analyze import PERMANENT_PATTERN, TRANSIENT_PATTERN
from delayed_retry.spark.generate import generate_archive


def pyarrow_statistics(path: str) -> dict[str, Any]:
    """The report's statistics computed in one process with pyarrow and the fingerprint.

    Streams record batches, so 10 million rows fit: only the set of keys
    seen is kept whole (duplicates, same key, count once).
    """
    import re

    import pyarrow.dataset as ds

    dataset = ds.dataset(path, format="parquet", partitioning="hive")
    columns = [
        "message_key",
        "origin_queue",
        "queue",
        "parked_reason",
        "exception_type",
        "exception_message",
        "exception_traceback",
        "last_error",
        "parked_at",
    ]
    transient, permanent = re.compile(TRANSIENT_PATTERN), re.compile(PERMANENT_PATTERN)
    seen: set[str] = set()
    groups: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    queues: Counter[str] = Counter()
    reasons: Counter[str | None] = Counter()
    first: Any = None
    last: Any = None
    for batch in dataset.to_batches(columns=columns, batch_size=65_536):
        values = [batch.column(c).to_pylist() for c in columns]
        for key, origin, queue, reason, kind_, message, trace, error, parked in zip(
            *values, strict=True
        ):
            if key in seen:
                continue
            seen.add(key)
            fp = fingerprint_headers(
                {
                    "x-exception-type": kind_,
                    "x-exception-message": message,
                    "x-exception-traceback": trace,
                    "x-retry-last-error": error,
                }
            )
            groups[fp.key] += 1
            text = f"{kind_ or ''} {message or error or ''}"
            kinds[
                "transient"
                if transient.search(text)
                else "permanent"
                if permanent.search(text)
                else "unknown"
            ] += 1
            queues[origin or queue] += 1
            reasons[reason] += 1
            if parked is not None:
                first = parked if first is None else min(first, parked)
                last = parked if last is None else max(last, parked)
    return {
        "distinct": len(seen),
        "by_queue": dict(queues),
        "by_reason": dict(reasons),
        "by_kind": dict(kinds),
        "groups": len(groups),
        "first": str(first),
        "last": str(last),
    }


def measure(sizes: list[int], *, master: str, workdir: str, warm: bool) -> list[dict[str, Any]]:
    """For each size: the CLI end to end, pyarrow, and (``warm``) the job on a warm session."""
    results = Path(__file__).parent / "results"
    results.mkdir(exist_ok=True)
    cli = str(Path(sys.executable).with_name("delayed-retry"))
    spark: Any = None
    lines = []
    for rows in sizes:
        archive = Path(workdir) / f"archive-{rows}"
        if not archive.exists():
            started = time.perf_counter()
            generate_archive(archive, rows=rows)
            print(
                f"{rows:>10} rows: generated in {time.perf_counter() - started:.1f} s", flush=True
            )
        load = os.getloadavg()[0]

        started = time.perf_counter()
        subprocess.run(
            [cli, "spark", "analyze", str(archive), "--master", master, "--no-report"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        cli_s = time.perf_counter() - started

        started = time.perf_counter()
        baseline = pyarrow_statistics(str(archive))
        arrow_s = time.perf_counter() - started

        line: dict[str, Any] = {
            "rows": rows,
            "master": master,
            "load_before": round(load, 1),
            "pyarrow_s": round(arrow_s, 2),
            "spark_cli_s": round(cli_s, 2),
            "cli_over_pyarrow": round(cli_s / arrow_s, 2),
        }
        if warm:
            from delayed_retry.spark.analyze import analyze_archive
            from delayed_retry.spark.session import get_spark

            if spark is None:
                spark = get_spark(master=master)
                analyze_archive(spark, str(archive))  # warm-up: JIT, Python workers
            started = time.perf_counter()
            analysis = analyze_archive(spark, str(archive))
            job_s = time.perf_counter() - started
            assert analysis.distinct == baseline["distinct"], (analysis.distinct, baseline)
            assert analysis.group_count == baseline["groups"], (analysis.group_count, baseline)
            assert analysis.by_kind == baseline["by_kind"], (analysis.by_kind, baseline)
            assert analysis.by_queue == baseline["by_queue"], (analysis.by_queue, baseline)
            line["spark_job_warm_s"] = round(job_s, 2)
            line["job_over_pyarrow"] = round(job_s / arrow_s, 2)
        print(json.dumps(line), flush=True)
        with (results / "spark_analyze.jsonl").open("a") as handle:
            handle.write(json.dumps(line) + "\n")
        lines.append(line)
    return lines


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("spark-analyze")
    group.add_argument("--spark-analyze-rows", type=int, nargs="+", help="(10 1000000)")
    group.add_argument(
        "--spark-analyze-no-warm", action="store_true", help="skip the warm-session job"
    )


async def spark_analyze(suite: Suite) -> list[Row]:
    """The ``spark-analyze`` workload: seconds of the analysis beside pyarrow's."""
    sizes = suite.args.spark_analyze_rows or ([10, 100_000] if suite.quick else [10, 1_000_000])
    print(f"spark-analyze: archives of {sizes} rows ...")
    lines = await asyncio.to_thread(
        measure,
        sizes,
        master="local[2]",
        workdir="/tmp/delayed-retry-bench-analyze",
        warm=not suite.args.spark_analyze_no_warm,
    )
    return [
        {
            "workload": f"spark analyze, {line['rows']} rows",
            "subject": subject,
            "unit": "s",
            "value": line[key],
            "baseline": "pyarrow, 1 process",
            "baseline_value": line["pyarrow_s"],
            "ratio": line[key] / line["pyarrow_s"] if line["pyarrow_s"] else None,
        }
        for line in lines
        for subject, key in (("CLI, fresh JVM", "spark_cli_s"), ("job, warm", "spark_job_warm_s"))
        if key in line
    ]
