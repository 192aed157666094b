"""``delayed-retry demo``: the README's demo, on the broker the command line names."""

from __future__ import annotations

import argparse

from delayed_retry.cli import output
from delayed_retry.cli.command import Command

__all__ = ["NO_BROKER", "COMMAND"]

NO_BROKER = (
    "the demo needs a broker: pass --url amqp://USER:PASSWORD@HOST:5672/ (before `demo`) or set "
    "RABBITMQ_URL; it uses names of its own there (delayed-retry-demo.*) and says at the end how "
    "to remove them. For a throwaway broker started and removed for you, run scripts/demo from a "
    "checkout of the repository"
)
"""Why ``delayed-retry demo`` without a broker URL starts nothing, and what to run instead."""


def _demo(args: argparse.Namespace) -> int:
    if not args.url_given:
        raise output.UsageError(NO_BROKER)
    from delayed_retry.cli.demo import main as run_demo

    return run_demo(args.url)


COMMAND = Command(
    name="demo",
    help="watch a consumer fail, back off through the chain, succeed or park",
    description="Run the README's demo on the broker that --url or $RABBITMQ_URL names, "
    "with names of its own (delayed-retry-demo.*) that it says how to remove at the end. "
    "For a throwaway broker, run scripts/demo from a checkout of the repository: it "
    "starts a private RabbitMQ node on free ports and removes it at the end.",
    run=_demo,
)
