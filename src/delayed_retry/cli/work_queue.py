"""What ``declare`` and ``status`` check of a work queue: its defence against undecodable messages.

A message the AMQP client cannot decode never reaches delayed-retry's code, so
only the queue's own arguments (or policy) can move it aside:
:func:`~delayed_retry.rabbitmq.delivery_limits.undecodable_risk` says what is missing. Queue
arguments and policies cannot be read over AMQP; the management API is asked,
best effort, and a note says so when it cannot be read.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import AbstractConnection

from delayed_retry.admin.management import BEST_EFFORT_TIMEOUT, ManagementError
from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.cli import common
from delayed_retry.rabbitmq.delivery_limits import undecodable_risk
from delayed_retry.rabbitmq.versions import broker_major_version
from delayed_retry.rabbitmq.work_queues import dead_letter_target

__all__ = ["WorkQueueCheck", "check_work_queue"]


@dataclass(frozen=True, kw_only=True)
class WorkQueueCheck:
    """What the broker says of a work queue's defence against undecodable messages.

    ``warning`` is the line to print (what is missing and the fix), ``None`` when
    defended, missing or not checked (``unchecked`` then says why).
    ``dead_letter_queue`` is the queue it dead-letters into through the default
    exchange (by argument or policy), which must exist.
    """

    warning: str | None
    dead_letter_queue: str | None
    unchecked: str | None = None
    """Why the queue could not be checked (the management API did not answer), or ``None``."""


def _effective(info: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    arguments = info.get("arguments")
    policy = info.get("effective_policy_definition")
    return (
        dict(arguments) if isinstance(arguments, Mapping) else {},
        dict(policy) if isinstance(policy, Mapping) else {},
    )


async def check_work_queue(
    args: argparse.Namespace, connection: AbstractConnection, queue: str
) -> WorkQueueCheck:
    """Check ``queue`` through the management API of the broker at ``--url``."""
    client = common.management_client(args, timeout=BEST_EFFORT_TIMEOUT)
    try:
        info = await client.queue(queue)
    except ManagementError as exc:
        if exc.status == 404:
            return WorkQueueCheck(warning=None, dead_letter_queue=None)
        return WorkQueueCheck(
            warning=None,
            dead_letter_queue=None,
            unchecked=f"not checked whether queue {queue!r} moves aside a message the AMQP "
            f"client cannot decode (that needs the management API: {exc})",
        )
    arguments, policy = _effective(info)
    channel = await connection.channel()
    try:
        underlay = await underlay_channel(channel)
        server_properties = getattr(underlay.connection, "server_properties", None)
    finally:
        await channel.close()
    warning = undecodable_risk(
        queue=queue,
        queue_type=info.get("type") if isinstance(info.get("type"), str) else None,
        arguments=arguments,
        policy=policy,
        broker_major=broker_major_version(server_properties),
    )
    # An argument wins over the policy's key, as the broker applies them.
    merged = {**{f"x-{key}": value for key, value in policy.items()}, **arguments}
    return WorkQueueCheck(warning=warning, dead_letter_queue=dead_letter_target(merged))
