"""The data side: archive parking queues to Parquet, analyse, redrive and schedule in bulk.

Archiving needs pyarrow only; analysis, redrive and bulk scheduling run on
Apache Spark through PySpark (local mode by default, any cluster with a
``master``). Install with ``pip install 'delayed-retry[spark]'``; pyspark is
imported only when a Spark function runs.
"""

from delayed_retry.headers.names import X_REDRIVE_ID, X_SCHEDULE_ID
from delayed_retry.spark.analyze import Analysis, ErrorGroup, analyze_archive
from delayed_retry.spark.archive import ArchiveError, ArchiveResult, archive, archive_queue
from delayed_retry.spark.bulk import (
    ScheduleResult,
    schedule_dataframe,
)
from delayed_retry.spark.dataset import ArchiveReadError, read_archive
from delayed_retry.spark.publisher import PublishRunError
from delayed_retry.spark.redrive import (
    RedriveError,
    RedriveResult,
    redrive,
)
from delayed_retry.spark.report import format_table, write_html_report
from delayed_retry.spark.session import SparkMissingError, get_spark
from delayed_retry.spark.sinks import (
    ArchiveSink,
    ArchiveSinkError,
    ArrowFileSystemSink,
    LocalSink,
)

__all__ = [
    # archive
    "archive",
    "archive_queue",
    "ArchiveResult",
    "ArchiveSink",
    "LocalSink",
    "ArrowFileSystemSink",
    "read_archive",
    # analysis
    "analyze_archive",
    "Analysis",
    "ErrorGroup",
    "format_table",
    "write_html_report",
    # redrive and bulk scheduling
    "redrive",
    "RedriveResult",
    "X_REDRIVE_ID",
    "schedule_dataframe",
    "ScheduleResult",
    "X_SCHEDULE_ID",
    # session
    "get_spark",
    # errors
    "ArchiveError",
    "ArchiveReadError",
    "ArchiveSinkError",
    "PublishRunError",
    "RedriveError",
    "SparkMissingError",
]
