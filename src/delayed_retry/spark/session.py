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

__all__ = [
    "DEFAULT_MASTER",
    "QUICK_START_BYTES",
    "SparkMissingError",
    "default_parallelism",
    "get_spark",
    "local_driver_memory",
    "progress",
    "quick_start_options",
    "require_pyspark",
    "shuffle_partitions_for",
]

log = logging.getLogger(__name__)

DEFAULT_MASTER = "local[*]"
"""Every core of this machine; pass ``master="spark://host:7077"`` (or yarn, k8s://…) to scale."""


QUICK_START_BYTES = 64 * 1024 * 1024
"""Inputs up to this size on disk start a local driver JVM for a short run.

Measured on a 2-core machine with 32 archived messages (``spark analyze``):
the driver's just-in-time compilers and garbage collector burnt more CPU
than the analysis. The quick start (:data:`QUICK_START_JAVA_OPTIONS`) cut
the run's CPU time by about 40 %; on a large input the optimising compiler
pays for itself, so it keeps the JVM's defaults.
"""

QUICK_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""The client compiler only and the single-threaded collector: a JVM for seconds, not hours."""

_PYSPARK_LOGGERS = ("SQLQueryContextLogger", "DataFrameQueryContextLogger")
"""PySpark's own Python loggers, which print every analysis error as JSON with a Java stack."""


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
    input_bytes: int | None = None,
) -> Any:
    """The active SparkSession, or a new one on ``master`` (default :data:`DEFAULT_MASTER`).

    Use it from scripts and the command line; inside an existing Spark
    application (a notebook, spark-submit) the running session is returned
    unchanged. Spark logs only errors unless ``verbose`` (then warnings too),
    from the JVM's start on (:mod:`delayed_retry.spark.jvm_output`), and
    PySpark's JSON error logs are left out (the error itself is raised).

    ``input_bytes``, the size on disk of what the job reads, lets a local
    run on a small input (up to :data:`QUICK_START_BYTES`) start a JVM made
    for a short run (:data:`QUICK_START_JAVA_OPTIONS`).

    Shuffles are sized to the data: adaptive execution merges small shuffle
    partitions, so a 10-row archive runs a handful of tasks, not 200.
    """
    require_pyspark()
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from delayed_retry.spark.jvm_output import filtered_jvm_stderr, log4j2_java_option

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
        **_local_defaults(master or DEFAULT_MASTER),
        **(config or {}),
    }
    new_jvm = SparkContext._gateway is None
    if new_jvm:
        # The log4j2 configuration must reach the JVM's command line: it logs before any call.
        quiet = log4j2_java_option(verbose=verbose)
        quick = quick_start_options(master or DEFAULT_MASTER, input_bytes=input_bytes)
        settings["spark.driver.extraJavaOptions"] = " ".join(
            filter(None, (quiet, quick, settings.get("spark.driver.extraJavaOptions")))
        )
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        with filtered_jvm_stderr(verbose=verbose or not new_jvm):
            spark = builder.getOrCreate()
    except Exception as exc:
        raise SparkMissingError(
            f"could not start Spark on master {master or DEFAULT_MASTER!r}: {exc}; "
            "check that Java 17 is installed (java -version) and JAVA_HOME points to it"
        ) from exc
    spark.sparkContext.setLogLevel("WARN" if verbose else "ERROR")
    _quiet_pyspark_loggers(verbose=verbose)
    return spark


def _quiet_pyspark_loggers(*, verbose: bool) -> None:
    """Keep PySpark's JSON error logs (an analysis error with its Java stack) off stderr.

    The error is raised all the same, and the command line prints it in one line.
    """
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # pyspark before 4.0 has no such loggers
        return
    for name in _PYSPARK_LOGGERS:
        PySparkLogger.getLogger(name).setLevel(logging.WARNING if verbose else logging.CRITICAL)


def quick_start_options(master: str, *, input_bytes: int | None) -> str | None:
    """The driver JVM's options for a short local run, or ``None`` to keep the JVM's defaults.

    Only a local master with an input known to be small (up to
    :data:`QUICK_START_BYTES`) gets :data:`QUICK_START_JAVA_OPTIONS`.
    """
    if not master.startswith("local") or input_bytes is None:
        return None
    return QUICK_START_JAVA_OPTIONS if input_bytes <= QUICK_START_BYTES else None


def default_parallelism(spark: Any) -> int:
    """How many tasks the executors run at once (Spark's default parallelism)."""
    try:
        return max(1, int(spark.sparkContext.defaultParallelism))
    except Exception:  # Spark Connect has no SparkContext
        return max(1, int(spark.conf.get("spark.sql.shuffle.partitions")))


def shuffle_partitions_for(input_bytes: int, *, cores: int) -> int:
    """Initial shuffle partitions for an input of ``input_bytes`` on disk.

    Compressed Parquet grows about fourfold in memory; each partition gets
    about 64 MB of that (adaptive execution's advisory size), and there are
    at least two per core so every core works. Adaptive execution merges
    partitions that turn out smaller; it never splits one, so the count must
    be right for the biggest input, not for a 10-row one.
    """
    target = 64 * 1024 * 1024
    return max(2 * cores, -(-input_bytes * 4 // target))


def local_driver_memory(total_bytes: int) -> str:
    """The driver JVM's heap in local mode: a quarter of the machine, 1 to 8 GB.

    In local mode the driver is the only executor; Spark's 1 GB default
    spills a 10-million-row shuffle to disk many times over.
    """
    gigabytes = max(1, min(8, total_bytes // 4 // 1024**3))
    return f"{gigabytes}g"


def _local_defaults(master: str) -> dict[str, str]:
    """In local mode: no web UI (its server costs start-up time nobody looks at), more heap."""
    if not master.startswith("local"):
        return {}
    settings = {"spark.ui.enabled": "false"}
    if os.environ.get("SPARK_DRIVER_MEMORY"):
        return settings
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return settings
    return {**settings, "spark.driver.memory": local_driver_memory(total)}


def _shuffle_partitions(master: str) -> int:
    """Initial shuffle partitions: a few per local core; Spark's 200 on a cluster.

    Adaptive execution coalesces them further once the data size is known.
    """
    if master.startswith("local"):
        return max(2, 2 * (os.cpu_count() or 1))
    return 200


@contextmanager
def progress(
    spark: Any,
    label: str,
    *,
    stream: Any = None,
    interval: float = 1.0,
    enabled: bool | None = None,
) -> Iterator[None]:
    """Print a one-line progress indication (tasks done of those seen) while the block runs.

    The count never goes backwards: every stage seen is remembered, a stage
    that left the active list counts as finished, so a new job starting
    adds to the total instead of resetting it. ``enabled=None`` shows it only
    when ``stream`` (default stderr) is a terminal: a log file or a pipe gets
    no ``\\r`` lines.
    """
    out = stream or sys.stderr
    if enabled is None:
        isatty = getattr(out, "isatty", None)
        enabled = bool(isatty and isatty())
    if not enabled:
        yield
        return
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
