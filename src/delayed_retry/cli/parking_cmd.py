"""``delayed-retry parking list|show|replay|edit|purge|refresh``: the on-call parking lot.

Reading never removes anything. Replay, purge and refresh are at-least-once:
a message leaves its place only after its copy is confirmed (replay,
refresh) or the operator confirmed (purge); a failing command moves nothing
more.
"""

from __future__ import annotations

from delayed_retry.cli.command import Command
from delayed_retry.cli.parking_edit import EDIT
from delayed_retry.cli.parking_move import PURGE, REFRESH, REPLAY
from delayed_retry.cli.parking_read import LIST, SHOW

__all__ = ["COMMAND"]

COMMAND = Command(
    name="parking",
    help="look at, replay, edit and purge parked messages",
    description="The parking lot of a queue: messages that used up their retries.",
    verbs=(LIST, SHOW, REPLAY, PURGE, REFRESH, EDIT),
    verbs_metavar="ACTION",
)
