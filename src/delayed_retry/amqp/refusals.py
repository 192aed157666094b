"""Why the broker refused a declaration: errors that name the object and the fix.

Use these where a declaration or binding failed: they turn what the broker
said when it closed the channel into :class:`~delayed_retry.errors.TopologyMismatchError`,
:class:`~delayed_retry.errors.NotFoundError` or
:class:`~delayed_retry.errors.AccessRefusedError`, read the in-memory argument a
level queue has, and spell the warning for queues used as they are. Nothing
here sends a request; :mod:`delayed_retry.amqp.chain_declaration` does.
"""

from __future__ import annotations

import re
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.chain.topology import IN_MEMORY_ARGUMENTS, DelayTopology
from delayed_retry.errors import AccessRefusedError, NotFoundError, TopologyMismatchError

__all__ = [
    "HOME_NODE_DOWN",
    "close_reason",
    "existing_in_memory_argument",
    "explain_refusal",
    "tolerated_message",
]


def explain_refusal(exc: aiormq.exceptions.ChannelClosed, what: str, wanted: Any) -> Exception:
    """The library's error for the broker refusing ``what`` (which wanted ``wanted``).

    A precondition failure, a missing entity or a refused permission becomes
    an error naming ``what`` and the fix; any other closing is returned as it is.
    """
    text = str(exc)
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return TopologyMismatchError(
            f"{what} exists with other arguments than this topology wants ({wanted}); the broker "
            f"said: {text}. delayed-retry never deletes anything by itself: delete {what} "
            "(after moving its messages) or use another prefix for the chain"
        )
    if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
        return NotFoundError(
            f"{what} refers to something that does not exist: {text}. Declare the queue "
            "before consuming from it or scheduling messages for it"
        )
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return AccessRefusedError(
            f"the broker refused to declare {what}: {text}. Grant the user configure, write "
            "and read permissions on names starting with the topology prefix"
        )
    return exc


_EXISTING_IN_MEMORY = re.compile(
    r"inequivalent arg '(?P<key>x-max-in-memory-(?:length|bytes))' .*received none but "
    r"current is the value '(?P<value>-?\d+)'"
)


def existing_in_memory_argument(error: str) -> tuple[str, int] | None:
    """The in-memory argument a queue has and a declaration lacked, from the broker's refusal.

    RabbitMQ (3.10.8 and 4.0.5 alike) says ``inequivalent arg 'x-max-in-memory-length'
    for queue 'Q' in vhost '/': received none but current is the value '0' of type
    'byte'``. Returns ``("x-max-in-memory-length", 0)`` for that, else ``None``.
    """
    match = _EXISTING_IN_MEMORY.search(error)
    if match is None or match["key"] not in IN_MEMORY_ARGUMENTS:
        return None
    return match["key"], int(match["value"])


HOME_NODE_DOWN = ("is down or inaccessible", "process is stopped by supervisor")
"""What the broker says of a classic queue that exists on a cluster node that is down
(RabbitMQ 3.10: "home node ... is down or inaccessible"; 4.3: "process is stopped by
supervisor")."""


def close_reason(channel: aiormq.abc.AbstractChannel) -> BaseException | None:
    """The broker's reason for closing ``channel`` (a no-wait request it refused), if known."""
    closing = channel.closing
    if closing.done() and not closing.cancelled():
        reason = closing.exception()
        if isinstance(reason, aiormq.exceptions.ChannelClosed):
            return reason
    reason = getattr(channel, "_close_exception", None)
    return reason if isinstance(reason, BaseException) else None


def tolerated_message(
    topology: DelayTopology, tolerated: dict[str, dict[str, int]], *, vhost: str = "/"
) -> str:
    """The warning for level queues used as they are: ``tolerated`` maps each to its kept
    in-memory arguments. It names the risk and the fix (another prefix, then a policy)."""
    names = sorted(tolerated)
    shown = ", ".join(repr(n) for n in names[:3]) + (
        f" and {len(names) - 3} more" if len(names) > 3 else ""
    )
    settings = sorted({f"{k}={v}" for kept in tolerated.values() for k, v in kept.items()})
    return (
        f"level queues {shown} exist with {', '.join(settings)}, which delayed-retry does not "
        "declare; they are used as they are. Any process that declares them without it (other "
        "tools, and delayed-retry versions that do not tolerate it) is refused with "
        "'inequivalent arg', and RabbitMQ 3.12+ ignores the argument. Fix: move their messages "
        "to a chain under another prefix (delayed-retry topology migrate), delete them, and on "
        f"RabbitMQ 3.10-3.11 keep bodies on disk with a policy instead: "
        f"{topology.memory_policy().command(vhost=vhost)}"
    )
