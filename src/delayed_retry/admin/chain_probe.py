"""Look at a live chain over AMQP: queue depths, and what can be checked without the HTTP API.

AMQP answers whether an exchange or queue exists (a passive declare) and
whether it was declared with the same arguments (an equivalent declare, a
no-op when they match and a refusal naming the argument when not); it cannot
list bindings or policies, which :mod:`delayed_retry.admin.management` reads.
Each probe runs on a channel of its own, since a refusal closes the channel.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiormq
import aiormq.abc
from aio_pika.abc import AbstractConnection

from delayed_retry.admin.chain_diff import (
    Difference,
    collapse_absent_chain,
    declare_hint,
    missing_queue_fix,
)
from delayed_retry.amqp.channels import (
    declared_queue,
    exchange_exists,
    on_scratch_channel,
    underlay_connection,
)
from delayed_retry.chain.topology import DelayTopology, QueueSpec, amqp_arguments

__all__ = [
    "QueueDepth",
    "declared_queue",
    "declared_with",
    "exchange_exists",
    "level_depths",
    "probe_over_amqp",
    "queue_depth",
]


async def queue_depth(connection: AbstractConnection, name: str) -> int | None:
    """Ready messages in queue ``name``, or ``None`` when it does not exist."""
    declared = await declared_queue(connection, name)
    return None if declared is None else int(declared.message_count or 0)


async def declared_with(
    connection: AbstractConnection, name: str, arguments: Mapping[str, Any]
) -> bool:
    """Whether queue ``name``, which exists, was declared durable with exactly ``arguments``.

    AMQP cannot read a queue's arguments; a declaration with the same ones is
    accepted and changes nothing, other ones are refused (``PRECONDITION_FAILED``),
    on a scratch channel of its own. Call it only for a queue known to exist:
    on a missing one the declaration would create it.
    """

    async def declare(channel: aiormq.abc.AbstractChannel) -> None:
        await channel.queue_declare(name, durable=True, arguments=dict(arguments))

    try:
        await on_scratch_channel(await underlay_connection(connection), declare)
    except aiormq.exceptions.ChannelPreconditionFailed:
        return False
    return True


@dataclass(frozen=True)
class QueueDepth:
    """One level of the chain and the messages waiting in it (``None``: the queue is missing)."""

    level: int
    name: str
    messages: int | None


async def level_depths(connection: AbstractConnection, topology: DelayTopology) -> list[QueueDepth]:
    """The depth of every level queue, lowest level first."""
    return [
        QueueDepth(level, topology.level_name(level), await queue_depth(connection, name))
        for level in range(topology.levels)
        for name in (topology.level_name(level),)
    ]


_Action = Callable[[aiormq.abc.AbstractChannel], Awaitable[object]]


def _exchange_declare(name: str, **options: Any) -> _Action:
    """``exchange.declare`` of ``name`` with ``options``, to run on a scratch channel."""

    async def action(channel: aiormq.abc.AbstractChannel) -> object:
        return await channel.exchange_declare(name, **options)

    return action


def _queue_declare(name: str, **options: Any) -> _Action:
    """``queue.declare`` of ``name`` with ``options``, to run on a scratch channel."""

    async def action(channel: aiormq.abc.AbstractChannel) -> object:
        return await channel.queue_declare(name, **options)

    return action


async def _refusal(
    connection: AbstractConnection,
    action: _Action,
) -> str | None:
    """Run ``action(channel)`` on a fresh channel: ``None`` if accepted, else the refusal text."""
    try:
        await on_scratch_channel(await underlay_connection(connection), action)
        return None
    except aiormq.exceptions.ChannelClosed as exc:
        return str(exc)


async def probe_over_amqp(
    connection: AbstractConnection,
    topology: DelayTopology,
    *,
    options: str,
    queues: tuple[str, ...] = (),
) -> list[Difference]:
    """Missing exchanges and queues, and those declared with other arguments.

    ``options`` are the chain's command-line options the fixes quote
    (``delayed_retry.cli.common.topology_options`` renders them).
    """
    other_settings = (
        f"the chain under prefix {topology.prefix!r} was declared with other settings; check "
        "--prefix/--levels/--unit-ms/--queue-type, or migrate its messages to a new prefix"
    )
    # With --bind for the queues named: a queue's parking queue is declared with its binding.
    declare = declare_hint(options, queues)
    out: list[Difference] = []
    for ex in topology.exchanges():
        what = f"exchange {ex.name!r}"
        if (
            await _refusal(
                connection,
                _exchange_declare(ex.name, passive=True),
            )
            is not None
        ):
            out.append(Difference(what, "missing", f"run {declare}"))
            continue
        args: dict[str, Any] = (
            {"alternate-exchange": ex.alternate_exchange} if ex.alternate_exchange else {}
        )
        refused = await _refusal(
            connection,
            _exchange_declare(ex.name, exchange_type=ex.type, durable=True, arguments=args),
        )
        if refused is not None:
            out.append(Difference(what, f"declared differently: {refused}", other_settings))
    specs: list[QueueSpec] = [
        *topology.queues(),
        *(topology.parking_queue_spec(q) for q in queues),
    ]
    for spec in specs:
        what = f"queue {spec.name!r}"
        if await queue_depth(connection, spec.name) is None:
            out.append(Difference(what, "missing", f"run {declare}"))
            continue
        refused = await _refusal(
            connection,
            _queue_declare(spec.name, durable=True, arguments=dict(amqp_arguments(spec.arguments))),
        )
        if refused is not None:
            out.append(Difference(what, f"declared differently: {refused}", other_settings))
    for queue in queues:
        if await queue_depth(connection, queue) is None:
            out.append(
                Difference(f"queue {queue!r}", "missing", missing_queue_fix(options, queues))
            )
    return collapse_absent_chain(topology, out, options=options)
