"""Get or create the SparkSession the data jobs run on: local by default, a cluster on request.

pyspark is imported here lazily, so ``import delayed_retry`` never needs it.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from delayed_retry.errors import ConfigurationError

__all__ = ["DEFAULT_MASTER", "SparkMissingError", "get_spark", "progress", "require_pyspark"]

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
"""Every core of this machine; pass ``master="spark://host:7077"`` (or yarn, k8s://…) to scale."""


class SparkMissingError(ConfigurationError):
    """pyspark (or Java) is not installed; the message says how to install it."""


def require_pyspark() -> Any:
    """The ``pyspark`` module, or a one-line :class:`SparkMissingError` saying what to install."""
    try:
        import pyspark
    except ImportError as exc:
        raise SparkMissingError(
            "pyspark is not installed; install it with: pip install 'delayed-retry[spark]' "
            "(and a Java 17 runtime)"
        ) from exc
    return pyspark


def get_spark(
    *,
    master: str | None = None,
    app_name: str = "delayed-retry",
    config: Mapping[str, str] | None = None,
    verbose: bool = False,
) -> Any:
    """The active SparkSession, or a new one on ``master`` (default :data:`DEFAULT_MASTER`).

    Use it from scripts and the command line; inside an existing Spark
    application (a notebook, spark-submit) the running session is returned
    unchanged. Spark logs only errors unless ``verbose`` (then warnings too).

    Shuffles are sized to the data: adaptive execution merges small shuffle
    partitions, so a 10-row archive runs a handful of tasks, not 200.
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None:
        return active
    # Executors must run the same interpreter as the driver.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master or DEFAULT_MASTER)
    settings = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "true",
        "spark.sql.adaptive.coalescePartitions.enabled": "true",
        # Coalesce by size (64 MB advisory), not to keep every core busy on tiny data.
        "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",
        "spark.sql.shuffle.partitions": str(_shuffle_partitions(master or DEFAULT_MASTER)),
        **(config or {}),
    }
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:
        raise SparkMissingError(
            f"could not start Spark on master {master or DEFAULT_MASTER!r}: {exc}; "
            "check that Java 17 is installed (java -version) and JAVA_HOME points to it"
        ) from exc
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    return spark


def _shuffle_partitions(master: str) -> int:
    """Initial shuffle partitions: a few per local core; Spark's 200 on a cluster.

    Adaptive execution coalesces them further once the data size is known.
    """
    if master.startswith("local"):
        return max(2, 2 * (os.cpu_count() or 1))
    return 200


@contextmanager
def progress(
    spark: Any, label: str, *, stream: Any = None, interval: float = 1.0
) -> Iterator[None]:
    """Print a one-line progress indication (tasks done of those seen) while the block runs.

    The count never goes backwards: every stage seen is remembered, a stage
    that left the active list counts as finished, so a new job starting
    adds to the total instead of resetting it.
    """
    out = stream or sys.stderr
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()
    stages: dict[int, tuple[int, int]] = {}

    def report() -> None:
        shown = -1
        while not stop.wait(interval):
            active = set(tracker.getActiveStageIds())
            for stage_id, (_, n) in list(stages.items()):
                if stage_id not in active:
                    stages[stage_id] = (n, n)
            for stage_id in active:
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    before = stages.get(stage_id, (0, 0))[0]
                    stages[stage_id] = (max(before, info.numCompletedTasks), info.numTasks)
            done = sum(d for d, _ in stages.values())
            total = sum(n for _, n in stages.values())
            if total and done > shown:
                shown = done
                out.write(f"\r{label}: {done}/{total} tasks")
                out.flush()

    thread = threading.Thread(target=report, name="spark-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        out.write(f"\r{label}: done{' ' * 20}\n")
        out.flush()
