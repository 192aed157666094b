"""``delayed-retry parking list|show|replay|edit|purge|refresh``: the on-call parking lot.

Reading never removes anything. Replay, purge and refresh are at-least-once:
a message leaves its place only after its copy is confirmed (replay,
refresh) or the operator confirmed (purge); a failing command moves nothing
more.
"""

from __future__ import annotations

from typing import Any

from delayed_retry.cli.parking_edit import register_edit
from delayed_retry.cli.parking_move import register_purge, register_refresh, register_replay
from delayed_retry.cli.parking_read import register_list, register_show

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add the parking commands."""
    parking = sub.add_parser(
        "parking",
        help="look at, replay, edit and purge parked messages",
        description="The parking lot of a queue: messages that used up their retries.",
    )
    commands = parking.add_subparsers(dest="parking_command", required=True, metavar="ACTION")
    register_list(commands)
    register_show(commands)
    register_replay(commands)
    register_purge(commands)
    register_refresh(commands)
    register_edit(commands)
