"""Entry point: builds the parser from the subcommand modules and runs the chosen one.

Each module in :data:`SUBCOMMAND_MODULES` has ``register(subparsers)``, which
adds its commands and sets ``func`` (``(args) -> int``) on each.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from delayed_retry.errors import DelayedRetryError
from delayed_retry.urls import redact_url

__all__ = [
    "SUBCOMMAND_MODULES",
    "build_parser",
    "main",
    "run",
]

SUBCOMMAND_MODULES = (
    "delayed_retry.cli.topology_cmd",
    "delayed_retry.cli.parking_cmd",
    "delayed_retry.cli.spark_cmd",
    "delayed_retry.cli.alerts_cmd",
    "delayed_retry.cli.delivery_cmd",
    "delayed_retry.cli.migrate_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="delayed-retry",
        description="Delayed retries, parking and scheduling in RabbitMQ: operate the chain.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/"),
        help="broker URL (default: $RABBITMQ_URL or amqp://guest:guest@127.0.0.1:5672/)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
    except DelayedRetryError as exc:
        print(f"delayed-retry: error: {exc}", file=sys.stderr)
        return 2
    except (ConnectionError, OSError) as exc:
        print(
            f"delayed-retry: error: cannot reach the broker at {redact_url(args.url)!r}: {exc}. "
            "Check --url or $RABBITMQ_URL",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    return code


def run(coro: object) -> int:
    """Run a subcommand coroutine returning an exit code."""
    result: int = asyncio.run(coro)  # type: ignore[arg-type]
    return result


if __name__ == "__main__":
    sys.exit(main())
