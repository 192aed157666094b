"""Open one or several archives as one Spark DataFrame, with a clear error when one is missing."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from delayed_retry.errors import DelayedRetryError, NotFoundError
from delayed_retry.spark.ledger import path_exists
from delayed_retry.spark.schema import ARCHIVE_COLUMNS, PARTITION_COLUMNS, archive_spark_schema

__all__ = [
    "ArchiveReadError",
    "archive_bytes",
    "archive_columns",
    "read_archive",
    "reading",
    "root_cause",
]


class ArchiveReadError(DelayedRetryError):
    """An archive is missing, empty or unreadable."""


class ArchiveMissingError(ArchiveReadError, NotFoundError):
    """No archive at the path given (the command line exits 1: check the path)."""


def archive_columns() -> list[str]:
    """Every column of an archive DataFrame, partitions last."""
    return [name for name, *_ in ARCHIVE_COLUMNS] + list(PARTITION_COLUMNS)


def check_archive_paths(paths: str | Sequence[str]) -> list[str]:
    """``paths`` as a list, each one checked to exist; no Spark needed.

    The command line calls this before starting Spark, so a typo is
    reported at once instead of after the JVM has started.
    """
    wanted = [paths] if isinstance(paths, str) else list(paths)
    if not wanted:
        raise ArchiveMissingError("no archive path given; pass the folder archive --to wrote")
    for path in wanted:
        try:
            exists = path_exists(path)
        except Exception as exc:
            raise ArchiveReadError(f"cannot reach archive {path!r}: {exc}") from exc
        if not exists:
            raise ArchiveMissingError(
                f"archive {path!r} does not exist; pass the folder given to "
                "'delayed-retry archive --to'"
            )
    return wanted


def archive_bytes(paths: str | Sequence[str]) -> int:
    """The size on disk of every file under ``paths`` (0 when it cannot be listed)."""
    import pyarrow.fs as pafs

    from delayed_retry.spark.ledger import filesystem_of

    total = 0
    for path in [paths] if isinstance(paths, str) else paths:
        try:
            filesystem, root = filesystem_of(path)
            infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
        except Exception:  # sizing is a hint; reading reports the real problem
            continue
        total += sum(i.size or 0 for i in infos if i.type == pafs.FileType.File)
    return total


def read_archive(spark: Any, paths: str | Sequence[str]) -> Any:
    """The archive(s) at ``paths`` as one DataFrame with the archive schema.

    Raises :class:`ArchiveReadError` naming the path when one does not exist
    or cannot be read as Parquet.
    """
    from pyspark.errors import PySparkException

    wanted = check_archive_paths(paths)
    try:
        frame = spark.read.schema(archive_spark_schema()).parquet(*wanted)
        return frame.select(*archive_columns())
    except PySparkException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
        raise ArchiveReadError(
            f"cannot read archive {', '.join(map(repr, wanted))} as Parquet: {first}; "
            "is it a folder written by 'delayed-retry archive'?"
        ) from exc


def root_cause(exc: BaseException) -> str:
    """The innermost cause of a Spark (JVM) error, on one line."""
    text = str(exc).strip()
    causes = [line for line in text.splitlines() if line.startswith("Caused by:")]
    if causes:
        return causes[-1].removeprefix("Caused by:").strip()
    for line in text.splitlines():
        if line.strip() and not line.startswith("An error occurred while calling"):
            return line.strip().lstrip(": ")
    return repr(exc)


@contextmanager
def reading(paths: str | Sequence[str]) -> Iterator[None]:
    """Turn a Spark failure while reading ``paths`` into a one-line :class:`ArchiveReadError`."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    try:
        yield
    except (PySparkException, Py4JJavaError) as exc:
        wanted = [paths] if isinstance(paths, str) else list(paths)
        raise ArchiveReadError(
            f"cannot read archive {', '.join(map(repr, wanted))}: {root_cause(exc)}; "
            "is it a folder written by 'delayed-retry archive'?"
        ) from exc
