"""RabbitMQ policies the library asks an operator to set, and the command that sets each. Pure.

A policy changes what an existing queue does without touching its
arguments, which the broker will not change once the queue exists. The
library names two: the operator policy that keeps the chain's waiting bodies
on disk on RabbitMQ 3.10–3.11 (:meth:`DelayTopology.memory_policy
<delayed_retry.chain.topology.DelayTopology.memory_policy>`) and the one that
gives an existing work queue its defence against undecodable messages
(:func:`~delayed_retry.rabbitmq.work_queues.work_queue_policy_command`). Both are
spelled as ``rabbitmqctl`` commands here, once.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["BrokerPolicy", "regex_literal"]


@dataclass(frozen=True, kw_only=True)
class BrokerPolicy:
    """A policy (or, with ``operator=True``, an operator policy) to set on a vhost.

    An *operator* policy merges with whatever ordinary policy applies to the
    same queues instead of displacing it: use one for what the library needs
    beside the user's own policies. An ordinary policy displaces any other of
    lower priority on the queues it matches. ``priority`` is left to the
    broker's default when ``None``.
    """

    name: str
    pattern: str
    definition: Mapping[str, str | int]
    apply_to: str = "queues"
    priority: int | None = None
    operator: bool = False

    def rabbitmqctl_args(self, *, vhost: str = "/") -> list[str]:
        """Arguments of ``rabbitmqctl`` that set this policy on ``vhost``."""
        priority = [] if self.priority is None else ["--priority", str(self.priority)]
        return [
            "set_operator_policy" if self.operator else "set_policy",
            "--vhost",
            vhost,
            "--apply-to",
            self.apply_to,
            *priority,
            self.name,
            self.pattern,
            json.dumps(dict(self.definition), separators=(",", ":")),
        ]

    def command(self, *, vhost: str = "/") -> str:
        """The shell command an operator runs on a broker node to set this policy."""
        return shlex.join(["rabbitmqctl", *self.rabbitmqctl_args(vhost=vhost)])


def regex_literal(text: str) -> str:
    """``text`` as a regular expression matching itself (``-`` left alone: it is plain there)."""
    return re.escape(text).replace("\\-", "-")
