"""The idempotency ledger: which messages a redrive or a bulk schedule already sent.

A ledger is a Parquet dataset of ``(run_id, message_key, sent_at)`` rows
(:data:`~delayed_retry.spark.schema.LEDGER_COLUMNS`), one row per publish the
broker confirmed. Before sending, rows whose key the ledger already holds
for the same run id are anti-joined away, so running the same redrive or
schedule again sends only what is missing.

The executors write it: each partition appends what the broker confirmed
in chunks (:class:`LedgerWriter`), with the same durable write as the
archive, named after the publish and the partition so that a retried task
can skip what its failed attempt already sent (:func:`recorded_keys`).
"""

from __future__ import annotations

import os
from typing import Any

from delayed_retry.spark.schema import ledger_arrow_schema, ledger_spark_schema
from delayed_retry.spark.sinks import local_path, sink_for

__all__ = [
    "LedgerWriter",
    "filesystem_of",
    "ledger_files",
    "ledger_keys",
    "path_exists",
    "recorded_keys",
    "remove_files",
    "write_marker",
]


def path_exists(path: str) -> bool:
    """Whether a local folder or a pyarrow-reachable URI exists."""
    import pyarrow.fs as pafs

    filesystem, root = filesystem_of(path)
    return bool(filesystem.get_file_info(root).type != pafs.FileType.NotFound)


def ledger_keys(spark: Any, ledger: str, run_id: str) -> Any:
    """A DataFrame of the ``message_key`` values already sent under ``run_id``."""
    from pyspark.sql import functions as F

    if not path_exists(ledger):
        return spark.createDataFrame([], "message_key string")
    frame = spark.read.schema(ledger_spark_schema()).parquet(ledger)
    return frame.where(F.col("run_id") == F.lit(run_id)).select("message_key").distinct()


def filesystem_of(target: str) -> tuple[Any, str]:
    """The pyarrow filesystem of a local path or a URI, and the path within it."""
    import pyarrow.fs as pafs

    local = local_path(target)
    if local is not None:
        return pafs.LocalFileSystem(), os.path.abspath(local)
    filesystem, root = pafs.FileSystem.from_uri(target)
    return filesystem, root


def ledger_files(ledger: str, stem: str) -> list[str]:
    """The names of the ledger files whose names start with ``stem`` (no folder)."""
    import pyarrow.fs as pafs

    filesystem, root = filesystem_of(ledger)
    infos = filesystem.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return sorted(i.base_name for i in infos if i.is_file and i.base_name.startswith(f"{stem}-"))


def recorded_keys(ledger: str, stem: str) -> set[str]:
    """The keys in the ledger files named ``<stem>-*``: what a task's earlier attempts sent."""
    import pyarrow.parquet as pq

    filesystem, root = filesystem_of(ledger)
    keys: set[str] = set()
    for name in ledger_files(ledger, stem):
        table = pq.read_table(f"{root}/{name}", columns=["message_key"], filesystem=filesystem)
        keys.update(table.column("message_key").to_pylist())
    return keys


def write_marker(ledger: str, stem: str) -> str:
    """Write an empty ledger file named ``<stem>-*`` and return its name: where does it land?"""
    return os.path.basename(
        sink_for(ledger).write(ledger_arrow_schema().empty_table(), "", stem=stem)
    )


def remove_files(ledger: str, names: list[str]) -> None:
    """Delete the ledger files ``names`` (as :func:`ledger_files` lists them)."""
    filesystem, root = filesystem_of(ledger)
    for name in names:
        filesystem.delete_file(f"{root}/{name}")


class LedgerWriter:
    """Records the confirmed sends of one partition, a durable file per ``every`` sends.

    Use one per partition: :meth:`add` each confirmed key, call :meth:`flush`
    when :attr:`due` and once at the end. A crash loses at most the keys added
    since the last flush, and those are sent again by a re-run.
    """

    def __init__(self, ledger: str, run_id: str, *, stem: str, every: int) -> None:
        self._sink = sink_for(ledger)
        self._run_id = run_id
        self._stem = stem
        self._every = every
        self._keys: list[str] = []
        self._sent_ms: list[int] = []
        self.recorded = 0
        self.files: list[str] = []
        """Names (no folder) of the files written so far."""

    @property
    def pending(self) -> int:
        """Confirmed keys not yet in a ledger file."""
        return len(self._keys)

    @property
    def due(self) -> bool:
        """Whether enough keys wait to be worth a file."""
        return len(self._keys) >= self._every

    def add(self, key: str, sent_ms: int) -> None:
        """Note that the broker confirmed ``key`` at ``sent_ms`` (epoch milliseconds)."""
        self._keys.append(key)
        self._sent_ms.append(sent_ms)

    def flush(self) -> None:
        """Write the pending keys to a new ledger file; raises when it cannot."""
        if not self._keys:
            return
        import pyarrow as pa

        keys, sent_ms = self._keys, self._sent_ms
        table = pa.Table.from_pydict(
            {
                "run_id": [self._run_id] * len(keys),
                "message_key": keys,
                "sent_at": pa.array(sent_ms, pa.timestamp("ms", tz="UTC")),
            },
            schema=ledger_arrow_schema(),
        )
        self.files.append(os.path.basename(self._sink.write(table, "", stem=self._stem)))
        self.recorded += len(keys)
        self._keys, self._sent_ms = [], []
