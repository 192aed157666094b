"""Where archive and ledger part files go, written durably before anything is acked.

A sink's :meth:`~ArchiveSink.write` returns only once the file is complete,
on stable storage and visible under its final name; until then nothing in
the queue is acked. :class:`LocalSink` writes a hidden temporary file,
fsyncs and closes it, renames it into place and fsyncs the folder.
:class:`ArrowFileSystemSink` covers anything pyarrow reaches by URI (S3,
GCS, HDFS, …), where closing the output stream commits the object.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any, Protocol
from urllib.parse import urlsplit

from delayed_retry.errors import DelayedRetryError

__all__ = [
    "ArchiveSink",
    "ArchiveSinkError",
    "ArrowFileSystemSink",
    "LocalSink",
    "local_path",
    "sink_for",
]

log = logging.getLogger(__name__)


class ArchiveSinkError(DelayedRetryError):
    """A target folder cannot be written; nothing was acked."""


class ArchiveSink(Protocol):
    """Something that stores Parquet part files durably."""

    def write(self, table: Any, relative_dir: str, *, stem: str = "part") -> str:
        """Store ``table`` as a new file ``<stem>-<uuid>.parquet`` under ``relative_dir``.

        Returns the file's full path only once it is durable and visible;
        raises otherwise.
        """
        ...


def _part_name(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex}.parquet"


class LocalSink:
    """Part files in a local (or mounted) folder, written with fsync and an atomic rename."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as exc:
            raise ArchiveSinkError(
                f"cannot create the folder {self.root!r}: {exc.strerror or exc}; "
                "choose a folder you can write to"
            ) from exc
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ArchiveSinkError(
                f"the folder {self.root!r} is not writable; fix its permissions or choose another"
            )

    def write(self, table: Any, relative_dir: str, *, stem: str = "part") -> str:
        import pyarrow.parquet as pq

        folder = os.path.join(self.root, relative_dir)
        os.makedirs(folder, exist_ok=True)
        name = _part_name(stem)
        final = os.path.join(folder, name)
        temp = os.path.join(folder, f".{name}.tmp")
        try:
            with open(temp, "wb") as handle:
                pq.write_table(table, handle, compression="zstd")
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, final)
            _fsync_dir(folder)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
        return final


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ArrowFileSystemSink:
    """Part files on any pyarrow filesystem; closing the stream commits the object."""

    def __init__(self, filesystem: Any, root: str, uri: str) -> None:
        self.filesystem = filesystem
        self.root = root.rstrip("/")
        self.uri = uri

    def write(self, table: Any, relative_dir: str, *, stem: str = "part") -> str:
        import pyarrow.parquet as pq

        folder = f"{self.root}/{relative_dir}" if relative_dir else self.root
        self.filesystem.create_dir(folder, recursive=True)
        path = f"{folder}/{_part_name(stem)}"
        with self.filesystem.open_output_stream(path) as stream:
            pq.write_table(table, stream, compression="zstd")
        return path


def local_path(target: str) -> str | None:
    """``target`` as a local path when it is one (a path, a ``file://`` URI), else ``None``."""
    parts = urlsplit(target)
    if parts.scheme == "file":
        return parts.path
    if parts.scheme == "" or (len(parts.scheme) == 1 and os.name == "nt"):
        return target
    return None


def sink_for(target: str) -> ArchiveSink:
    """The sink for a folder path or a URI such as ``s3://bucket/archive``."""
    local = local_path(target)
    if local is not None:
        return LocalSink(local)
    import pyarrow.fs as pafs

    try:
        filesystem, root = pafs.FileSystem.from_uri(target)
    except Exception as exc:
        raise ArchiveSinkError(
            f"cannot open {target!r} with pyarrow: {exc}; use a local folder or a URI pyarrow "
            "supports (s3://, gs://, hdfs://) with its credentials configured"
        ) from exc
    return ArrowFileSystemSink(filesystem, root, target)
