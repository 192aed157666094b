"""Remove a delay chain's queues and exchanges, only when nothing waits in them.

For a chain no longer used (after ``topology migrate`` moved its messages, or a test
chain): :func:`plan_teardown` looks at every queue and refuses if one is in use;
:func:`tear_down` deletes the queues, checking each again, then the exchanges.
:func:`found_forwarding` lists what forwarders and front doors declared for it. The order
of the deletes and what a check between them can miss: docs/operating-the-chain.md,
"Removing a chain".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

import aiormq
import aiormq.abc
from aio_pika.abc import AbstractConnection

from delayed_retry.admin.chain_probe import declared_queue
from delayed_retry.admin.management import ManagementClient, ManagementError
from delayed_retry.amqp.channels import on_scratch_channel, scratch_channel, underlay_connection
from delayed_retry.chain.digest import markers
from delayed_retry.chain.topology import DelayTopology, QueueSpec
from delayed_retry.delivery.front_door import delay_exchange_name
from delayed_retry.errors import TopologyMismatchError

__all__ = [
    "TeardownOutcome",
    "TeardownPlan",
    "deletion_order",
    "forwarding_queues",
    "found_forwarding",
    "other_parking_queues",
    "plan_teardown",
    "tear_down",
]

QueueType = Literal["classic", "quorum"]


@dataclass
class TeardownPlan:
    """What a teardown would delete, and what stops it."""

    queues: list[str] = field(default_factory=list)
    """The queues to delete, in the order they are deleted."""
    exchanges: list[str] = field(default_factory=list)
    not_empty: dict[str, int] = field(default_factory=dict)
    """Queues holding messages (ready ones, as the broker counts them): they block."""
    consumers: dict[str, int] = field(default_factory=dict)
    """Queues with consumers, whose unacked messages no count shows: they block."""
    missing: list[str] = field(default_factory=list)
    queue_types: dict[str, QueueType] = field(default_factory=dict)
    """The type of each queue to delete, as the topology declares it."""
    discard: dict[str, int] = field(default_factory=dict)
    """Queues deleted with the messages they hold (the alert copies, messages waiting in
    the levels, when asked)."""
    forwarding: list[str] = field(default_factory=list)
    """Exchanges whose forward queue and front door go with the chain."""
    markers: tuple[str, ...] = ()
    """The chain's markers (:func:`~delayed_retry.chain.digest.markers`), deleted first:
    a teardown cut short leaves connections declaring the chain in full."""

    @property
    def blocked(self) -> bool:
        return bool(self.not_empty or self.consumers)


@dataclass
class TeardownOutcome:
    """What :func:`tear_down` deleted, and the queue that stopped it (if one did)."""

    queues: list[str] = field(default_factory=list)
    exchanges: list[str] = field(default_factory=list)
    refused: str | None = None
    """The queue found in use as it was deleted; it and everything after it were kept."""
    reason: str | None = None
    """Why ``refused`` was kept, e.g. ``holds 2 message(s)``."""


def _queue_type(spec: QueueSpec) -> QueueType:
    return "quorum" if spec.arguments.get("x_queue_type") == "quorum" else "classic"


def forwarding_queues(topology: DelayTopology, exchange: str) -> tuple[list[QueueSpec], ...]:
    """What a front door and a forwarder declare for ``exchange``, by place in the flow.

    ``(feeding, fed, parking)``: the front door's queue ``X.delay`` feeds the
    chain, the forward queue is fed by it, and the parking queue of each.
    """
    inbox = topology.inbox_queue_spec(delay_exchange_name(exchange))
    forward = topology.forward_queue_spec(exchange)
    parking = [topology.parking_queue_spec(inbox.name), topology.parking_queue_spec(forward.name)]
    return [inbox], [forward], parking


def deletion_order(
    topology: DelayTopology, queues: Iterable[str] = (), forwarding: Iterable[str] = ()
) -> list[QueueSpec]:
    """The queues of ``topology``, the parking queues of ``queues`` and what a forwarder and a
    front door declared for each exchange of ``forwarding``, in deletion order.

    Front doors' queues first (they feed the chain), then the levels from the
    highest down, then the queues the chain feeds (forward queues, parking,
    unroutable, rejected, alerts): a message moving down the chain during the
    teardown always reaches a queue that is still to be checked.
    """
    by_name = {spec.name: spec for spec in topology.queues()}
    levels = [by_name.pop(topology.level_name(level)) for level in reversed(range(topology.levels))]
    feeding: list[QueueSpec] = []
    fed: list[QueueSpec] = []
    parking = [topology.parking_queue_spec(q) for q in queues]
    for exchange in forwarding:
        into, out_of, parked = forwarding_queues(topology, exchange)
        feeding += into
        fed += out_of
        parking += parked
    mutes = QueueSpec(topology.mutes_stream, {}, ())  # a stream: see plan_teardown
    return [*feeding, *levels, *fed, *parking, *by_name.values(), mutes]


async def found_forwarding(client: ManagementClient, topology: DelayTopology) -> list[str] | None:
    """The exchanges ``topology``'s chain forwards to (it has their forward queues).

    Queues cannot be listed over AMQP: this asks the management API and gives
    ``None`` when it cannot be read.
    """
    try:
        names = await client.queue_names()
    except ManagementError:
        return None
    start = f"{topology.prefix}.forward."
    return sorted(
        name.removeprefix(start)
        for name in names
        if name.startswith(start) and not name.endswith(".parking")
    )


async def other_parking_queues(
    client: ManagementClient, topology: DelayTopology, *, removing: Iterable[str]
) -> dict[str, str] | None:
    """Queues bound to ``topology``'s parking exchange that the teardown is not ``removing``.

    Maps each such queue to the work queue its binding key names. Removing the chain
    removes the exchange, not those queues: they are left behind, with what they hold.
    ``None`` when the management API cannot be read (AMQP cannot list bindings).
    """
    try:
        bindings = await client.exchange_bindings(topology.parking_exchange, direction="source")
    except ManagementError as exc:
        if exc.status == 404:
            return {}
        return None
    removed = {*removing, topology.alerts_queue}
    return {
        b.destination: b.routing_key
        for b in sorted(bindings, key=lambda b: b.destination)
        if b.destination_type == "queue" and b.destination not in removed
    }


async def _exchange_exists(connection: aiormq.abc.AbstractConnection, name: str) -> bool:
    try:
        await on_scratch_channel(connection, lambda ch: ch.exchange_declare(name, passive=True))
        return True
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False


async def plan_teardown(
    connection: AbstractConnection,
    topology: DelayTopology,
    *,
    queues: Iterable[str] = (),
    discard_alerts: bool = False,
    discard_waiting: bool = False,
    forwarding: Iterable[str] = (),
) -> TeardownPlan:
    """Look at every queue and exchange of ``topology`` (and ``queues``' parking queues, and
    what a forwarder and a front door declared for each exchange of ``forwarding``).

    ``discard_alerts=True`` lets the alert queue go with the copies it holds
    (copies of parked and unroutable messages, which stay where they are);
    ``discard_waiting=True`` lets the level queues go with the messages still
    waiting in them, which are then never delivered.
    """
    plan = TeardownPlan(forwarding=list(dict.fromkeys(forwarding)), markers=markers(topology))
    for spec in deletion_order(topology, queues, plan.forwarding):
        declared = await declared_queue(connection, spec.name)
        if declared is None:
            plan.missing.append(spec.name)
            continue
        messages = int(declared.message_count or 0)
        consumers = int(declared.consumer_count or 0)
        if consumers:
            plan.consumers[spec.name] = consumers
        if messages and (
            (discard_alerts and spec.name in (topology.alerts_queue, topology.mutes_stream))
            or (discard_waiting and topology.is_level_queue(spec.name))
        ):
            plan.discard[spec.name] = messages
        elif messages:
            plan.not_empty[spec.name] = messages
        if not consumers and spec.name not in plan.not_empty:
            plan.queues.append(spec.name)
            # The mutes stream refuses if-empty as quorum queues do: checked just before.
            stream = spec.name == topology.mutes_stream
            plan.queue_types[spec.name] = "quorum" if stream else _queue_type(spec)
    underlay = await underlay_connection(connection)
    exchanges = [spec.name for spec in topology.exchanges()]
    exchanges += [delay_exchange_name(exchange) for exchange in plan.forwarding]
    for name in exchanges:
        if await _exchange_exists(underlay, name):
            plan.exchanges.append(name)
        else:
            plan.missing.append(name)
    return plan


async def _delete_checked(
    channel: aiormq.abc.AbstractChannel, name: str, *, with_messages: bool
) -> str | None:
    """Delete ``name`` right after a passive declare finds it unused (and empty, unless
    ``with_messages``); else say why it stays. For queues that refuse ``if-empty``."""
    declared = await channel.queue_declare(name, passive=True)
    if declared.message_count and not with_messages:
        return f"holds {declared.message_count} message(s)"
    if declared.consumer_count:
        return f"has {declared.consumer_count} consumer(s)"
    await channel.queue_delete(name)
    return None


async def _delete_one(
    connection: aiormq.abc.AbstractConnection, name: str, *, kind: QueueType, discard: bool
) -> str | None:
    """Delete queue ``name`` unless it is in use; ``None`` when deleted (or already gone)."""
    try:
        async with scratch_channel(connection) as channel:
            if kind == "quorum":
                return await _delete_checked(channel, name, with_messages=discard)
            await channel.queue_delete(name, if_unused=True, if_empty=not discard)
            return None
    except aiormq.exceptions.ChannelNotFoundEntity:
        return None
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        return f"was refused by the broker ({_reply_text(exc)})"
    except aiormq.exceptions.ConnectionNotImplemented as exc:
        raise TopologyMismatchError(
            f"queue {name!r} is a quorum queue, but the topology says classic "
            "(--queue-type classic): the broker refused a delete with if-empty and closed "
            f"the connection ({_reply_text(exc)}); run the teardown again with the chain's "
            "queue type (--queue-type quorum)"
        ) from exc


def _reply_text(exc: BaseException) -> str:
    return str(exc.args[-1]) if exc.args else str(exc)


async def _delete_exchange(connection: aiormq.abc.AbstractConnection, name: str) -> None:
    with contextlib.suppress(aiormq.exceptions.ChannelNotFoundEntity):  # gone already
        await on_scratch_channel(connection, lambda ch: ch.exchange_delete(name))


async def tear_down(connection: AbstractConnection, plan: TeardownPlan) -> TeardownOutcome:
    """Delete what ``plan`` lists, in its order, checking each queue again as it goes.

    The first queue found holding messages or consumers stops it: that queue,
    the ones after it and every exchange are kept, so the chain still delivers
    what waits in them; :attr:`TeardownOutcome.refused` names it.
    """
    underlay = await underlay_connection(connection)
    outcome = TeardownOutcome()
    for marker in plan.markers:
        await _delete_exchange(underlay, marker)
    for name in plan.queues:
        reason = await _delete_one(
            underlay,
            name,
            kind=plan.queue_types.get(name, "quorum"),
            discard=name in plan.discard,
        )
        if reason is not None:
            outcome.refused, outcome.reason = name, reason
            return outcome
        outcome.queues.append(name)
    for name in plan.exchanges:
        await _delete_exchange(underlay, name)
        outcome.exchanges.append(name)
    return outcome
