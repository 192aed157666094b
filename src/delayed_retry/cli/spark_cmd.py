"""``delayed-retry spark {generate,analyze,redrive,schedule}``: the PySpark jobs."""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

from delayed_retry.chain.topology import DelayTopology
from delayed_retry.cli import common, output
from delayed_retry.cli.command import Command
from delayed_retry.errors import (
    ConfigurationError,
    DelayedRetryError,
    NotFoundError,
    queue_not_found,
)

__all__ = ["COMMAND"]


def _spark(args: argparse.Namespace, *, input_bytes: int | None = None) -> Any:
    from delayed_retry.spark.session import get_spark

    return get_spark(
        master=args.master,
        verbose=bool(getattr(args, "verbose", False)),
        input_bytes=input_bytes,
    )


@contextlib.contextmanager
def _short_run(args: argparse.Namespace, *, input_bytes: int) -> Iterator[Any]:
    """The session of a job that reads ``input_bytes``; a small local one uses the class cache.

    The first such run writes the cache as its JVM exits (it waits for that),
    the next ones start from it (:mod:`delayed_retry.spark.class_cache`).
    """
    from pyspark import SparkContext

    from delayed_retry.spark.class_cache import (
        ClassCache,
        class_cache_path,
        keep_class_cache,
        plan_class_cache,
    )
    from delayed_retry.spark.session import DEFAULT_MASTER, get_spark, quick_start_options

    master = args.master or DEFAULT_MASTER
    # Only a JVM this run starts can read or write it (a running one is someone else's).
    new_jvm = SparkContext._gateway is None
    quick = quick_start_options(master, input_bytes=input_bytes) is not None
    path = class_cache_path() if new_jvm and quick else None
    cache: ClassCache | None = None
    if path is not None:
        try:
            cache = plan_class_cache(path)
        except OSError:  # an unwritable cache folder: start without it
            cache = None
    spark = get_spark(
        master=args.master,
        verbose=bool(getattr(args, "verbose", False)),
        input_bytes=input_bytes,
        config=None if cache is None else {"spark.driver.extraJavaOptions": cache.java_options},
    )
    try:
        yield spark
    finally:
        if cache is not None and cache.writing is not None:
            keep_class_cache(cache, spark)


def _check_broker(url: str, queue: str | None = None) -> None:
    """Connect (and find ``queue``) before Spark starts: a dead broker fails in a second."""
    import asyncio

    from delayed_retry.admin.chain_probe import queue_depth
    from delayed_retry.cli.connection import connect

    async def probe() -> None:
        connection = await connect(url, timeout=15)
        async with connection:
            if queue is not None and await queue_depth(connection, queue) is None:
                raise NotFoundError(queue_not_found(queue, so="nothing can be scheduled for it"))

    asyncio.run(probe())


def _rate(text: str) -> float:
    value = text.removesuffix("/s")
    try:
        rate = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"rate {text!r} is not a number such as 100/s") from None
    if not rate > 0:
        raise argparse.ArgumentTypeError(f"rate {text!r} must be above zero")
    return rate


def _header(text: str) -> tuple[str, str]:
    name, sep, column = text.partition("=")
    if not sep or not name or not column:
        raise argparse.ArgumentTypeError(
            f"header {text!r} must be NAME=COLUMN, e.g. x-order-id=order_id"
        )
    return name, column


def _spark_command(
    command: str, *, needs: tuple[str, ...]
) -> Callable[[Callable[[argparse.Namespace], int]], Callable[[argparse.Namespace], int]]:
    """Wrap ``spark COMMAND``: the 'spark' extra checked first, Spark failures as one line.

    ``needs`` are the modules of the extra the command imports; a missing one is named
    with ``pip install 'delayed-retry[spark]'`` before anything is read or connected.
    """

    def wrap(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(func)
        def wrapper(args: argparse.Namespace) -> int:
            output.require_extra("spark", needs, what=f"'delayed-retry {command}'")
            from delayed_retry.spark.session import SparkMissingError

            try:
                return func(args)
            except SparkMissingError as exc:  # no Java, or Spark would not start: not the words
                raise output.CommandError(str(exc)) from exc
            except DelayedRetryError:
                raise
            except Exception as exc:
                if type(exc).__module__.startswith(("pyspark", "py4j")):
                    from delayed_retry.spark.dataset import root_cause

                    raise DelayedRetryError(f"Spark failed: {root_cause(exc)}") from exc
                raise

        return wrapper

    return wrap


SPARK_JOB = ("pyarrow", "pyspark")
"""The modules of the 'spark' extra every Spark job imports."""


@_spark_command("spark analyze", needs=(*SPARK_JOB, "pandas", "matplotlib"))
def cmd_analyze(args: argparse.Namespace) -> int:
    """Analyse archives: terminal tables plus an HTML report next to the archive."""
    from delayed_retry.spark.analyze import analyze_archive, default_report_path
    from delayed_retry.spark.dataset import archive_bytes, check_archive_paths
    from delayed_retry.spark.report import format_table, write_html_report
    from delayed_retry.spark.session import progress

    check_archive_paths(args.paths)
    with _short_run(args, input_bytes=archive_bytes(args.paths)) as spark:
        with progress(spark, "analyzing"):
            analysis = analyze_archive(spark, args.paths, top=args.top)
        print(format_table(analysis), flush=True)
        if analysis.distinct and not args.no_report:
            report = write_html_report(analysis, args.report or default_report_path(args.paths[0]))
            print(f"report: {report}", flush=True)
    return 0


class _Sending(TypedDict):
    """The keyword arguments every sending job takes from the options (see :func:`_sending`)."""

    url: str
    topology: DelayTopology
    partitions: int | None


def _sending(args: argparse.Namespace) -> _Sending:
    """What a job that sends (``redrive``, ``schedule``) takes of the options besides its
    ledger: the broker, the chain and the partitions sending at once."""
    return {
        "url": args.url,
        "topology": common.topology_from_args(args),
        "partitions": args.partitions,
    }


@_spark_command("spark redrive", needs=SPARK_JOB)
def cmd_redrive(args: argparse.Namespace) -> int:
    """Send selected archived messages back to their queues through the delay chain."""
    from delayed_retry.spark.dataset import archive_bytes, check_archive_paths
    from delayed_retry.spark.redrive import redrive
    from delayed_retry.spark.session import progress

    check_archive_paths(args.paths)
    if not args.dry_run and args.url:
        _check_broker(args.url)
    with (
        _short_run(args, input_bytes=archive_bytes(args.paths)) as spark,
        progress(spark, "redrive"),
    ):
        result = redrive(
            spark,
            args.paths,
            where=args.where,
            rate=args.rate,
            dry_run=args.dry_run,
            redrive_id=args.redrive_id,
            ledger=args.ledger,
            **_sending(args),
        )
    verb = "would send" if result.dry_run else "sent"
    count = result.to_send if result.dry_run else result.sent
    print(
        f"redrive {result.redrive_id}: selected {result.selected}, already sent "
        f"{result.already_sent}, without a queue {result.without_queue}; {verb} {count}"
    )
    for queue, n in sorted(result.by_queue.items()):
        print(f"  {queue}: {n}")
    if result.first_due_at and result.last_due_at:
        print(f"  due from {result.first_due_at.isoformat()} to {result.last_due_at.isoformat()}")
    return 0


@_spark_command("spark schedule", needs=SPARK_JOB)
def cmd_schedule(args: argparse.Namespace) -> int:
    """Schedule one message per row of a Parquet, CSV or JSON file."""
    from delayed_retry.spark.bulk import schedule_dataframe
    from delayed_retry.spark.ledger import path_exists
    from delayed_retry.spark.session import progress

    if not path_exists(args.input):
        raise NotFoundError(f"input {args.input!r} does not exist; check the path")
    if args.url:
        _check_broker(args.url, args.queue)
    spark = _spark(args)
    reader = spark.read
    if args.format == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    try:
        frame = reader.format(args.format).load(args.input)
    except Exception as exc:
        raise ConfigurationError(
            f"cannot read {args.input!r} as {args.format}: {str(exc).splitlines()[0]}; "
            "check the path and --format"
        ) from exc
    with progress(spark, "schedule"):
        result = schedule_dataframe(
            frame,
            queue=args.queue,
            due_at=args.due_at,
            body=args.body,
            key=args.key,
            schedule_id=args.schedule_id,
            headers=dict(args.header),
            ledger=args.ledger,
            **_sending(args),
        )
    print(
        f"schedule {result.schedule_id}: {result.rows} rows, sent {result.sent}, "
        f"skipped {result.already_sent} (already sent or duplicate keys)"
    )
    return 0


@_spark_command("spark generate", needs=("pyarrow",))
def cmd_generate(args: argparse.Namespace) -> int:
    """Write a synthetic archive (no Spark, no broker): for benchmarks and trying the report."""
    from delayed_retry.spark.generate import generate_archive

    if args.rows < 1:
        raise ConfigurationError(f"--rows {args.rows} must be at least 1")
    files = generate_archive(args.to, rows=args.rows, hours=args.hours, seed=args.seed)
    print(f"wrote {args.rows} synthetic parked messages in {files} part file(s) under {args.to}")
    return 0


def _with_master(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master", default=None, help="Spark master (default local[*]; e.g. spark://host:7077)"
    )


def _with_partitions(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="publishing connections at once (default: one per executor core)",
    )


def _generate_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, required=True, help="how many parked messages")
    parser.add_argument("--to", required=True, help="archive folder to write")
    parser.add_argument("--hours", type=int, default=72, help="span of parked times (default 72)")
    parser.add_argument("--seed", type=int, default=7, help="random seed (same seed, same archive)")


def _analyze_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", help="archive folder(s)")
    parser.add_argument(
        "--report", default=None, help="HTML report path (default <archive>.report.html)"
    )
    parser.add_argument("--no-report", action="store_true", help="print tables only")
    parser.add_argument("--top", type=int, default=10, help="how many distinct errors to list")
    _with_master(parser)


def _redrive_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", help="archive folder(s)")
    parser.add_argument("--where", default=None, help="Spark SQL predicate selecting rows to send")
    parser.add_argument("--rate", type=_rate, default=None, help="messages per second, e.g. 200/s")
    parser.add_argument("--dry-run", action="store_true", help="count and plan, send nothing")
    parser.add_argument(
        "--redrive-id", default=None, help="id for the ledger (default: from the input)"
    )
    parser.add_argument("--ledger", default=None, help="ledger folder (default <archive>/_ledger)")
    _with_master(parser)
    _with_partitions(parser)
    common.add_topology_args(parser)


def _schedule_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", help="Parquet, CSV or JSON file or folder")
    parser.add_argument("--format", choices=("parquet", "csv", "json"), default="parquet")
    parser.add_argument("--queue", required=True, help="destination queue")
    parser.add_argument("--due-at", required=True, help="column holding the due time")
    parser.add_argument("--body", required=True, help="column holding the body")
    parser.add_argument(
        "--key",
        default=None,
        help="column identifying a row: the message_id consumers deduplicate on (default: a hash)",
    )
    parser.add_argument(
        "--schedule-id", required=True, help="name of this schedule, for the ledger"
    )
    parser.add_argument("--ledger", required=True, help="ledger folder")
    parser.add_argument(
        "--header",
        type=_header,
        action="append",
        default=[],
        metavar="NAME=COLUMN",
        help="a message header taken from a column; repeat for more",
    )
    _with_master(parser)
    _with_partitions(parser)
    common.add_topology_args(parser)


COMMAND = Command(
    name="spark",
    help="analyse, redrive and schedule with PySpark",
    description="PySpark jobs over archives of parked messages and files of messages to "
    "schedule. Spark's own log output is left out (errors only, each in one line); "
    "'delayed-retry -v spark ...' shows its warnings too. Progress shows on a terminal "
    "only.",
    verbs=(
        Command(
            name="generate",
            help="write a synthetic archive of parked messages (benchmarks, demos)",
            options=_generate_options,
            run=cmd_generate,
        ),
        Command(
            name="analyze",
            help="report on archived parked messages",
            options=_analyze_options,
            run=cmd_analyze,
        ),
        Command(
            name="redrive",
            help="send archived messages back to their queues",
            options=_redrive_options,
            run=cmd_redrive,
        ),
        Command(
            name="schedule",
            help="schedule one delayed message per row of a file",
            options=_schedule_options,
            run=cmd_schedule,
        ),
    ),
    verbs_metavar="ACTION",
)

if __name__ == "__main__":  # pragma: no cover
    sys.exit("run it as: delayed-retry archive|spark …")
