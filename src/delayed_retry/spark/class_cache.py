"""A cache of the classes a short local Spark run loads: Java's class data sharing.

Use it only for local runs on small inputs, where loading Spark's classes is most of the
time. The archive (about 200 MB, in the user's cache folder, named after the pyspark
installation and the ``java``) is written under a temporary name and kept only once the JVM
that wrote it exited cleanly (:func:`keep_class_cache`).
``DELAYED_RETRY_SPARK_CLASS_CACHE=off`` turns it off. What it saves: docs/spark.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["CACHE_ENV", "ClassCache", "class_cache_path", "keep_class_cache", "plan_class_cache"]

log = logging.getLogger(__name__)

CACHE_ENV = "DELAYED_RETRY_SPARK_CLASS_CACHE"
"""Set to ``off`` to start every driver JVM without the class cache."""

_QUIET = "-Xlog:cds=off -Xlog:cds+dynamic=off"
"""Class data sharing's own warnings (classes it cannot archive) are not the user's business."""

JVM_EXIT_TIMEOUT = 120.0
"""How long :func:`keep_class_cache` waits for the JVM to write its archive and exit."""


@dataclass(frozen=True)
class ClassCache:
    """How one driver JVM uses the class cache: read it, or write it at exit."""

    path: Path
    java_options: str
    writing: Path | None = None
    """The temporary archive this JVM writes as it exits; ``None`` when it reads ``path``."""


def class_cache_path(
    environ: Mapping[str, str] | None = None, *, home: Path | None = None
) -> Path | None:
    """Where the class cache of this pyspark and ``java`` is, or ``None`` when it is off."""
    env = os.environ if environ is None else environ
    if env.get(CACHE_ENV, "").lower() in ("off", "0", "no", "false"):
        return None
    try:
        import pyspark
    except ImportError:
        return None
    java_home = env.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    if not java:
        return None
    identity = "\n".join(
        [pyspark.__version__, os.path.realpath(pyspark.__file__), os.path.realpath(java)]
    )
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    cache = env.get("XDG_CACHE_HOME", "")
    base = Path(cache) if cache and Path(cache).is_absolute() else (home or Path.home()) / ".cache"
    return base / "delayed-retry" / f"spark-classes-{key}.jsa"


def plan_class_cache(path: Path) -> ClassCache:
    """Read the archive at ``path`` if there is one, else write it as this JVM exits."""
    if path.is_file():
        return ClassCache(path, f"-XX:SharedArchiveFile={path} {_QUIET}")
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(path.parent)
    writing = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    return ClassCache(path, f"-XX:ArchiveClassesAtExit={writing} {_QUIET}", writing)


ABANDONED_AFTER = 3600.0
"""A temporary archive older than this (seconds) was left by a run that did not end cleanly."""


def _remove_abandoned(folder: Path) -> None:
    now = time.time()
    for stale in folder.glob("spark-classes-*.jsa.*.tmp"):
        with contextlib.suppress(OSError):
            if now - stale.stat().st_mtime > ABANDONED_AFTER:
                stale.unlink()


def keep_class_cache(cache: ClassCache, spark: Any, *, timeout: float = JVM_EXIT_TIMEOUT) -> None:
    """Stop ``spark`` and its JVM and keep the archive it wrote, if it exited cleanly.

    Call it at the end of a run that writes the cache (``cache.writing``);
    otherwise it only stops the session. The JVM ends when its standard input
    closes; the archive is moved into place only after a clean exit, never
    half written.
    """
    spark.stop()
    if cache.writing is None:
        return
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc = getattr(gateway, "proc", None)
    try:
        if gateway is None or proc is None or proc.stdin is None:
            return
        with contextlib.suppress(Exception):
            gateway.shutdown()
        proc.stdin.close()
        code = proc.wait(timeout=timeout)
        SparkContext._gateway = None
        SparkContext._jvm = None
        if code == 0 and cache.writing.is_file():
            os.replace(cache.writing, cache.path)
            log.debug("kept the class cache at %s", cache.path)
    except Exception as exc:  # a cache only: the run itself succeeded
        log.debug("no class cache kept: %r", exc)
    finally:
        with contextlib.suppress(OSError):
            cache.writing.unlink()
