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
) -> Any:
    """The active SparkSession, or a new one on ``master`` (default :data:`DEFAULT_MASTER`).

    Use it from scripts and the command line; inside an existing Spark
    application (a notebook, spark-submit) the running session is returned
    unchanged. Logging is set to WARN so progress stays readable.
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
    spark.sparkContext.setLogLevel("WARN")
    return spark


@contextmanager
def progress(
    spark: Any, label: str, *, stream: Any = None, interval: float = 1.0
) -> Iterator[None]:
    """Print a one-line progress indication (tasks done of total) while the block runs."""
    out = stream or sys.stderr
    tracker = spark.sparkContext.statusTracker()
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(interval):
            done = total = 0
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    done += info.numCompletedTasks
                    total += info.numTasks
            if total:
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
