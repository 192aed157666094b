"""The declarations that put a chain and its queues on a broker, on a channel given.

Each step sends what ``topology`` names and says what the broker refused: the
chain in full (exchanges, level queues, its alert, unroutable and parking
queues, every binding, and its markers), or one queue with its bindings. A
queue that exists with other arguments the library can live with (an older
version's, an in-memory argument) is used as it is, with a warning. Nothing
here remembers what was declared: use :mod:`delayed_retry.amqp.declarer`,
which calls these once per connection. ``warned`` is that connection's set of
queues already warned about, so each warning comes once per connection.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.amqp.chain_marker import withdraw_markers, write_markers
from delayed_retry.amqp.channels import close_quietly, connection_vhost, on_scratch_channel
from delayed_retry.amqp.refusals import (
    HOME_NODE_DOWN,
    close_reason,
    existing_in_memory_argument,
    explain_refusal,
    tolerated_message,
)
from delayed_retry.chain.digest import markable
from delayed_retry.chain.topology import (
    IN_MEMORY_ARGUMENTS,
    DelayTopology,
    QueueSpec,
    amqp_arguments,
)
from delayed_retry.errors import NotFoundError, TopologyMismatchError
from delayed_retry.rabbitmq.delivery_limits import kept_classic_queue_risk, kept_queue_risk
from delayed_retry.rabbitmq.versions import (
    bodies_in_memory_hint,
    broker_major_version,
    broker_version,
)

__all__ = [
    "bind_queue",
    "declare_in_full",
    "declare_queue",
    "declare_queue_then_fanout",
    "log_memory_hint",
]

log = logging.getLogger(__name__)


async def _declare_level_queue(
    channel: aiormq.abc.AbstractChannel, spec: QueueSpec, kept: dict[str, int]
) -> aiormq.abc.AbstractChannel | None:
    """Declare a level queue; use one that has an in-memory argument as it is.

    Returns a new channel when the broker closed ``channel`` refusing the
    declaration (the caller goes on with it and closes it), else ``None``.
    Every other argument is still checked: the declaration is repeated with
    the existing in-memory values added, so a different TTL, say, still fails.
    """
    args: dict[str, Any] = dict(amqp_arguments(spec.arguments))
    try:
        await channel.queue_declare(spec.name, durable=True, arguments=args)
        return None
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        found = existing_in_memory_argument(str(exc))
        if found is None:
            raise explain_refusal(exc, f"queue {spec.name!r}", args) from exc
        kept[found[0]] = found[1]
    except aiormq.exceptions.ChannelClosed as exc:
        raise explain_refusal(exc, f"queue {spec.name!r}", args) from exc
    replacement = await channel.connection.channel(publisher_confirms=False)
    for _ in IN_MEMORY_ARGUMENTS:  # at most one refusal per in-memory argument
        try:
            await replacement.queue_declare(spec.name, durable=True, arguments={**args, **kept})
            return replacement
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            found = existing_in_memory_argument(str(exc))
            if found is None or found[0] in kept:
                raise explain_refusal(exc, f"queue {spec.name!r}", args) from exc
            kept[found[0]] = found[1]
            replacement = await channel.connection.channel(publisher_confirms=False)
        except aiormq.exceptions.ChannelClosed as exc:
            raise explain_refusal(exc, f"queue {spec.name!r}", args) from exc
    raise TopologyMismatchError(  # pragma: no cover - the broker refuses one argument at a time
        f"queue {spec.name!r} keeps refusing the chain's arguments {args}; delete it (after "
        "moving its messages) or use another prefix for the chain"
    )


async def declare_queue(
    channel: aiormq.abc.AbstractChannel,
    spec: QueueSpec,
    *,
    warned: set[str],
    bind: bool = True,
) -> None:
    """Declare the queue of ``spec`` and, unless ``bind=False``, make its bindings.

    A queue with a delivery limit that exists without one (declared by an
    older version) or as a classic queue is used as it is, with a warning
    (once: its name goes into ``warned``).
    """
    args: dict[str, Any] = dict(amqp_arguments(spec.arguments))
    if "x-delivery-limit" in args:
        # A queue declared by an older version without the limit refuses the new
        # argument and would close the channel: declare it on a channel of its own.
        await _declare_kept_queue(channel.connection, spec.name, args, warned)
    else:
        try:
            await channel.queue_declare(spec.name, durable=True, arguments=args)
        except aiormq.exceptions.ChannelClosed as exc:
            raise explain_refusal(exc, f"queue {spec.name!r}", args) from exc
    if bind:
        await bind_queue(channel, spec)


async def bind_queue(channel: aiormq.abc.AbstractChannel, spec: QueueSpec) -> None:
    """Make the bindings of ``spec``'s queue, which exists."""
    for exchange, key in spec.bindings:
        try:
            await channel.queue_bind(spec.name, exchange, routing_key=key)
        except aiormq.exceptions.ChannelClosed as exc:
            raise explain_refusal(
                exc, f"binding of queue {spec.name!r} to {exchange!r}", key
            ) from exc


async def declare_queue_then_fanout(
    channel: aiormq.abc.AbstractChannel, spec: QueueSpec, exchange: str, *, warned: set[str]
) -> None:
    """Declare ``spec``'s queue unbound, then fanout ``exchange`` and the binding, back to back.

    No round trip between the exchange and the binding, so the exchange never
    stands unbound while a producer could see it. Every binding of ``spec``
    is to ``exchange``.
    """
    await declare_queue(channel, spec, warned=warned, bind=False)
    # nowait: the binding's answer confirms the exchange too (a failed
    # declaration closes the channel, and the bind fails with its reason).
    await channel.exchange_declare(exchange, exchange_type="fanout", durable=True, nowait=True)
    await bind_queue(channel, spec)


async def _declare_kept_queue(
    connection: aiormq.abc.AbstractConnection, name: str, args: dict[str, Any], warned: set[str]
) -> None:
    """Declare a queue the library consumes or keeps messages in; keep using an older one.

    The broker refuses to change a queue's arguments, so a queue that exists
    without the delivery limit (declared by an older version) or as a classic
    queue (made by hand or by another tool; RabbitMQ 4.3 refuses the quorum
    declaration where 3.x let it through) is used as it is, with a warning
    naming the risk and the fix, once per queue in ``warned``.
    """
    try:
        await on_scratch_channel(
            connection, lambda ch: ch.queue_declare(name, durable=True, arguments=args)
        )
        return
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        refusal = str(exc)
        if "x-delivery-limit" not in refusal and "x-queue-type" not in refusal:
            raise explain_refusal(exc, f"queue {name!r}", args) from exc
    except aiormq.exceptions.ChannelClosed as exc:
        raise explain_refusal(exc, f"queue {name!r}", args) from exc
    await on_scratch_channel(connection, lambda ch: ch.queue_declare(name, passive=True))
    if name not in warned:
        warned.add(name)
        major = broker_major_version(getattr(connection, "server_properties", None))
        if "x-queue-type" in refusal:
            log.warning("%s", kept_classic_queue_risk(queue=name))
        else:
            log.warning("%s", kept_queue_risk(queue=name, broker_major=major))


async def declare_in_full(
    channel: aiormq.abc.AbstractChannel, topology: DelayTopology, *, warned: set[str]
) -> None:
    """Declare every exchange, queue and binding of ``topology``; mark it complete if it is.

    The markers go first and come back last (see
    :mod:`delayed_retry.amqp.chain_marker`), and only when the chain is exactly
    as declared: not while its alert queue's node is down, nor when a queue is
    used as it is despite other arguments (in ``warned``, so the warning about
    it keeps coming on every new connection).
    """
    await withdraw_markers(channel, topology)
    for ex in topology.exchanges():
        args: dict[str, Any] = (
            {"alternate-exchange": ex.alternate_exchange} if ex.alternate_exchange else {}
        )
        try:
            await channel.exchange_declare(
                ex.name, exchange_type=ex.type, durable=True, arguments=args
            )
        except aiormq.exceptions.ChannelClosed as exc:
            raise explain_refusal(exc, f"exchange {ex.name!r} ({ex.type})", args) from exc
    tolerated: dict[str, dict[str, int]] = {}
    specs = topology.queues()
    async with contextlib.AsyncExitStack() as replaced:
        for spec in list(specs):
            if spec.arguments.get("x_queue_type") == "classic":
                if not await _declare_unless_home_down(channel.connection, spec, warned):
                    specs = [kept for kept in specs if kept is not spec]  # bindings exist
                continue
            if not topology.is_level_queue(spec.name):
                await declare_queue(channel, spec, warned=warned, bind=False)
                continue
            kept: dict[str, int] = {}
            replacement = await _declare_level_queue(channel, spec, kept)
            if replacement is not None:
                # The broker closed the channel refusing the first try; go on with the new one.
                replaced.push_async_callback(close_quietly, replacement)
                channel = replacement
                tolerated[spec.name] = kept
        await _bind_chain(channel, topology, specs)
        used_as_they_are = {spec.name for spec in specs} & warned
        if (
            markable(topology)
            and len(specs) == len(topology.queues())
            and not tolerated
            and not used_as_they_are
        ):
            await write_markers(channel, topology)
    if tolerated:
        log.warning(
            "%s", tolerated_message(topology, tolerated, vhost=connection_vhost(channel.connection))
        )
    log_memory_hint(channel.connection, topology, tolerated=bool(tolerated))


def log_memory_hint(
    connection: aiormq.abc.AbstractConnection, topology: DelayTopology, *, tolerated: bool
) -> None:
    """On RabbitMQ 3.10–3.11, say how to keep the chain's waiting bodies on disk (info)."""
    if topology.queue_type != "quorum" or tolerated:
        return
    hint = bodies_in_memory_hint(
        broker_version(getattr(connection, "server_properties", None)),
        topology=topology,
        vhost=connection_vhost(connection),
    )
    if hint is not None:
        log.info("%s", hint)


async def _declare_unless_home_down(
    connection: aiormq.abc.AbstractConnection, spec: QueueSpec, warned: set[str]
) -> bool:
    """Declare classic queue ``spec`` on a channel of its own; ``False`` if its node is down.

    A classic queue lives on one node (the chain's alert queue is one). While
    that node is down the queue exists but refuses every declaration; the
    chain works without it, so producers and consumers go on, and parked
    messages get no alert copy until the node is back.
    """
    try:
        await on_scratch_channel(
            connection, lambda ch: declare_queue(ch, spec, warned=warned, bind=False)
        )
    except NotFoundError as exc:
        if not any(phrase in str(exc) for phrase in HOME_NODE_DOWN):
            raise
        log.warning(
            "queue %r exists but its node is down, so it cannot be declared now; going on "
            "without it until the node is back (%s)",
            spec.name,
            exc.__cause__,
        )
        return False
    return True


async def _bind_chain(
    channel: aiormq.abc.AbstractChannel, topology: DelayTopology, specs: Iterable[QueueSpec]
) -> None:
    """Make every binding of ``topology``, then remove the pass-through bindings it retired.

    Hundreds of bindings (a 36-level chain that skips zeros has 702): they
    are sent without waiting for each answer, and one synchronous request
    after them returns once the broker has made them all, or fails with its
    first refusal (the broker handles a channel's requests in order). The
    retired bindings go only after the new ones are in place, so a message
    routed meanwhile always finds its way.
    """
    what = f"the bindings of the delay chain {topology.prefix!r}"
    try:
        for destination, source, key in topology.exchange_bindings():
            await channel.exchange_bind(destination, source, routing_key=key, nowait=True)
        for spec in specs:
            for exchange, key in spec.bindings:
                await channel.queue_bind(spec.name, exchange, routing_key=key, nowait=True)
        await channel.exchange_declare(topology.delivery_exchange, passive=True)
        for destination, source, key in topology.retired_bindings():
            await channel.exchange_unbind(destination, source, routing_key=key, nowait=True)
        await channel.exchange_declare(topology.delivery_exchange, passive=True)
    except (aiormq.exceptions.ChannelClosed, aiormq.exceptions.ChannelInvalidStateError) as exc:
        refusal = close_reason(channel) or exc
        if isinstance(refusal, aiormq.exceptions.ChannelClosed):
            raise explain_refusal(refusal, what, "") from exc
        raise
