"""``delayed-retry demo``: the README's demo, on a throwaway broker unless a URL is given."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the ``demo`` command."""
    demo = sub.add_parser(
        "demo",
        help="watch a consumer fail, back off through the chain, succeed or park",
        description="Run the README's demo. Without --url or $RABBITMQ_URL it starts a "
        "throwaway RabbitMQ node on free ports (from the system's rabbitmq-server, or a "
        "container) and removes it at the end; with one, it uses names of its own "
        "(delayed-retry-demo.*) on that broker.",
    )
    demo.set_defaults(func=_demo)


def _demo(args: argparse.Namespace) -> int:
    from delayed_retry.cli.demo import main as run_demo

    return run_demo(args.url if args.url_given else None)
