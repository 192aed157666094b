"""Declare the delay topology on a broker: idempotent, cached per connection.

Every consumer may call this at start-up and on first use: declarations are
sent once per AMQP connection and again after a reconnect (a robust
connection's new underlying connection is a new cache key). Declarations run
on a short-lived channel of their own, so an argument mismatch, which makes
the broker close the channel, never closes the caller's channel.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiormq
import aiormq.abc

from delayed_retry.amqp.chain_marker import (
    chain_is_marked_complete,
    withdraw_markers,
    write_markers,
)
from delayed_retry.amqp.channels import close_quietly, on_scratch_channel, underlay_channel
from delayed_retry.broker_versions import (
    bodies_in_memory_hint,
    broker_major_version,
    broker_version,
)
from delayed_retry.chain_digest import markable
from delayed_retry.delivery_limits import kept_classic_queue_risk, kept_queue_risk
from delayed_retry.errors import (
    AccessRefusedError,
    ConfigurationError,
    NotFoundError,
    TopologyMismatchError,
)
from delayed_retry.topology import (
    DEFAULT_TOPOLOGY,
    IN_MEMORY_ARGUMENTS,
    DelayTopology,
    QueueSpec,
    amqp_arguments,
)

__all__ = [
    "EXISTS_CACHE_SECONDS",
    "TopologyDeclarer",
    "declare_topology",
    "declare_parking_queue",
    "declarer_for",
]

log = logging.getLogger(__name__)


def _explain(exc: aiormq.exceptions.ChannelClosed, what: str, wanted: Any) -> Exception:
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
            raise _explain(exc, f"queue {spec.name!r}", args) from exc
        kept[found[0]] = found[1]
    except aiormq.exceptions.ChannelClosed as exc:
        raise _explain(exc, f"queue {spec.name!r}", args) from exc
    replacement = await channel.connection.channel(publisher_confirms=False)
    for _ in IN_MEMORY_ARGUMENTS:  # at most one refusal per in-memory argument
        try:
            await replacement.queue_declare(spec.name, durable=True, arguments={**args, **kept})
            return replacement
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            found = existing_in_memory_argument(str(exc))
            if found is None or found[0] in kept:
                raise _explain(exc, f"queue {spec.name!r}", args) from exc
            kept[found[0]] = found[1]
            replacement = await channel.connection.channel(publisher_confirms=False)
        except aiormq.exceptions.ChannelClosed as exc:
            raise _explain(exc, f"queue {spec.name!r}", args) from exc
    raise TopologyMismatchError(  # pragma: no cover - the broker refuses one argument at a time
        f"queue {spec.name!r} keeps refusing the chain's arguments {args}; delete it (after "
        "moving its messages) or use another prefix for the chain"
    )


async def _declare_queue(
    channel: aiormq.abc.AbstractChannel, spec: QueueSpec, *, bind: bool = True
) -> None:
    args: dict[str, Any] = dict(amqp_arguments(spec.arguments))
    if "x-delivery-limit" in args:
        # A queue declared by an older version without the limit refuses the new
        # argument and would close the channel: declare it on a channel of its own.
        await _declare_kept_queue(channel.connection, spec.name, args)
    else:
        try:
            await channel.queue_declare(spec.name, durable=True, arguments=args)
        except aiormq.exceptions.ChannelClosed as exc:
            raise _explain(exc, f"queue {spec.name!r}", args) from exc
    if bind:
        await _bind_queue(channel, spec)


async def _bind_queue(channel: aiormq.abc.AbstractChannel, spec: QueueSpec) -> None:
    for exchange, key in spec.bindings:
        try:
            await channel.queue_bind(spec.name, exchange, routing_key=key)
        except aiormq.exceptions.ChannelClosed as exc:
            raise _explain(exc, f"binding of queue {spec.name!r} to {exchange!r}", key) from exc


async def _declare_kept_queue(
    connection: aiormq.abc.AbstractConnection, name: str, args: dict[str, Any]
) -> None:
    """Declare a queue the library consumes or keeps messages in; keep using an older one.

    The broker refuses to change a queue's arguments, so a queue that exists
    without the delivery limit (declared by an older version) or as a classic
    queue (made by hand or by another tool; RabbitMQ 4.3 refuses the quorum
    declaration where 3.x let it through) is used as it is, with a warning
    naming the risk and the fix, once per connection and queue.
    """
    try:
        await on_scratch_channel(
            connection, lambda ch: ch.queue_declare(name, durable=True, arguments=args)
        )
        return
    except aiormq.exceptions.ChannelPreconditionFailed as exc:
        refusal = str(exc)
        if "x-delivery-limit" not in refusal and "x-queue-type" not in refusal:
            raise _explain(exc, f"queue {name!r}", args) from exc
    except aiormq.exceptions.ChannelClosed as exc:
        raise _explain(exc, f"queue {name!r}", args) from exc
    await on_scratch_channel(connection, lambda ch: ch.queue_declare(name, passive=True))
    warned = declarer_for(connection).warned
    if name not in warned:
        warned.add(name)
        major = broker_major_version(getattr(connection, "server_properties", None))
        if "x-queue-type" in refusal:
            log.warning("%s", kept_classic_queue_risk(queue=name))
        else:
            log.warning("%s", kept_queue_risk(queue=name, broker_major=major))


async def _declare_topology(channel: aiormq.abc.AbstractChannel, topology: DelayTopology) -> None:
    """Declare every exchange, queue and binding of ``topology``; mark it complete if it is.

    The markers go first and come back last (see
    :mod:`delayed_retry.amqp.chain_marker`), and only when the chain is exactly
    as declared: not while its alert queue's node is down, nor when a queue is
    used as it is despite other arguments (so the warning about it keeps coming
    on every new connection).
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
            raise _explain(exc, f"exchange {ex.name!r} ({ex.type})", args) from exc
    tolerated: dict[str, dict[str, int]] = {}
    specs = topology.queues()
    async with contextlib.AsyncExitStack() as replaced:
        for spec in list(specs):
            if spec.arguments.get("x_queue_type") == "classic":
                if not await _declare_unless_home_down(channel.connection, spec):
                    specs = [kept for kept in specs if kept is not spec]  # bindings exist
                continue
            if not topology.is_level_queue(spec.name):
                await _declare_queue(channel, spec, bind=False)
                continue
            kept: dict[str, int] = {}
            replacement = await _declare_level_queue(channel, spec, kept)
            if replacement is not None:
                # The broker closed the channel refusing the first try; go on with the new one.
                replaced.push_async_callback(close_quietly, replacement)
                channel = replacement
                tolerated[spec.name] = kept
        await _bind_chain(channel, topology, specs)
        used_as_they_are = {spec.name for spec in specs} & declarer_for(channel.connection).warned
        if (
            markable(topology)
            and len(specs) == len(topology.queues())
            and not tolerated
            and not used_as_they_are
        ):
            await write_markers(channel, topology)
    if tolerated:
        log.warning("%s", _tolerated_message(topology, tolerated))
    _log_memory_hint(channel.connection, topology, tolerated=bool(tolerated))


def _log_memory_hint(
    connection: aiormq.abc.AbstractConnection, topology: DelayTopology, *, tolerated: bool
) -> None:
    """On RabbitMQ 3.10–3.11, say how to keep the chain's waiting bodies on disk (info)."""
    if topology.queue_type != "quorum" or tolerated:
        return
    hint = bodies_in_memory_hint(
        broker_version(getattr(connection, "server_properties", None)), topology=topology
    )
    if hint is not None:
        log.info("%s", hint)


HOME_NODE_DOWN = ("is down or inaccessible", "process is stopped by supervisor")
"""What the broker says of a classic queue that exists on a cluster node that is down
(RabbitMQ 3.10: "home node ... is down or inaccessible"; 4.3: "process is stopped by
supervisor")."""


async def _declare_unless_home_down(
    connection: aiormq.abc.AbstractConnection, spec: QueueSpec
) -> bool:
    """Declare classic queue ``spec`` on a channel of its own; ``False`` if its node is down.

    A classic queue lives on one node (the chain's alert queue is one). While
    that node is down the queue exists but refuses every declaration; the
    chain works without it, so producers and consumers go on, and parked
    messages get no alert copy until the node is back.
    """
    try:
        await on_scratch_channel(connection, lambda ch: _declare_queue(ch, spec, bind=False))
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
        refusal = _close_reason(channel) or exc
        if isinstance(refusal, aiormq.exceptions.ChannelClosed):
            raise _explain(refusal, what, "") from exc
        raise


def _close_reason(channel: aiormq.abc.AbstractChannel) -> BaseException | None:
    """The broker's reason for closing ``channel`` (a no-wait request it refused), if known."""
    closing = channel.closing
    if closing.done() and not closing.cancelled():
        reason = closing.exception()
        if isinstance(reason, aiormq.exceptions.ChannelClosed):
            return reason
    reason = getattr(channel, "_close_exception", None)
    return reason if isinstance(reason, BaseException) else None


def _tolerated_message(topology: DelayTopology, tolerated: dict[str, dict[str, int]]) -> str:
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
        f"{topology.memory_policy().command()}"
    )


async def declare_parking_queue(
    connection: aiormq.abc.AbstractConnection,
    topology: DelayTopology,
    queue: str,
    parking_queue: str | None = None,
) -> None:
    """Declare ``queue``'s parking queue and its binding (idempotent, not cached)."""
    spec = topology.parking_queue_spec(queue, parking_queue)
    await on_scratch_channel(connection, lambda ch: _declare_queue(ch, spec))


EXISTS_CACHE_SECONDS = 1.0
"""How long ``publish_delayed`` trusts that an exchange it checked still exists."""

PARKING_REDECLARE_INTERVAL = 1.0
"""Seconds a parking queue's re-declaration counts as fresh for the parks that follow."""


class TopologyDeclarer:
    """What one connection has declared and checked: the per-connection state of the library.

    Declarations are made once per connection (under one lock), parking queues
    re-declared at most once per :data:`PARKING_REDECLARE_INTERVAL`, and
    exchange checks trusted for a moment. :meth:`forget` drops what a
    publish found missing, so the next use declares it again.
    """

    def __init__(self) -> None:
        self._done: set[tuple[object, ...]] = set()
        self._lock = asyncio.Lock()
        self._parking_at: dict[tuple[object, ...], float] = {}
        self._parking_now: dict[tuple[object, ...], asyncio.Future[None]] = {}
        self._exchange_seen: dict[str, float] = {}
        self.warned: set[str] = set()
        """Queues used as they are despite other arguments, already warned about."""
        self._exchange_checks: dict[str, asyncio.Lock] = {}
        self._repair: set[DelayTopology] = set()

    def forget(self, topology: DelayTopology) -> None:
        """Declare ``topology`` (and every destination of it) again on next use, in full.

        Call it when a publish into the chain found an exchange missing (deleted
        by hand, or by a mistaken teardown): the next hand-over puts it back,
        every binding included, whatever the chain's markers say.
        """
        self._done = {key for key in self._done if topology not in key}
        self._repair.add(topology)

    async def exchange_exists(
        self, connection: aiormq.abc.AbstractConnection, exchange: str, *, cache: float = 0.0
    ) -> None:
        """Raise :class:`ConfigurationError` naming ``exchange`` when it does not exist.

        ``cache`` seconds: trust a check this recent on this connection (an
        exchange deleted in between is caught by the forwarder, which parks).
        One check per exchange is in flight at a time: a burst of calls shares it.
        """
        if cache and time.monotonic() - self._exchange_seen.get(exchange, -math.inf) < cache:
            return
        lock = self._exchange_checks.setdefault(exchange, asyncio.Lock())
        async with lock:
            if cache and time.monotonic() - self._exchange_seen.get(exchange, -math.inf) < cache:
                return
            try:
                await on_scratch_channel(
                    connection, lambda ch: ch.exchange_declare(exchange, passive=True)
                )
            except aiormq.exceptions.ChannelNotFoundEntity as exc:
                raise ConfigurationError(
                    f"exchange {exchange!r} does not exist, so nothing could be delivered to "
                    "it; declare it (with its bindings) before scheduling messages for it"
                ) from exc
            self._exchange_seen[exchange] = time.monotonic()

    async def queue(self, connection: aiormq.abc.AbstractConnection, spec: QueueSpec) -> None:
        """Declare the queue of ``spec`` with its bindings, once on this connection.

        A queue with a delivery limit that exists without one (declared by an
        older version) is used as it is, with a warning naming the fix.
        """
        key = ("queue", spec.name, tuple(sorted(spec.arguments.items())), spec.bindings)
        await self._once(key, connection, lambda ch: _declare_queue(ch, spec))

    async def fanout_with_queue(
        self, connection: aiormq.abc.AbstractConnection, spec: QueueSpec
    ) -> None:
        """Declare the queue of ``spec``, then its fanout exchange and the binding, back to back.

        For an exchange producers publish to as soon as it exists (the front
        door's ``X.delay``): the queue is declared first, unbound, and the
        exchange and the binding follow on one channel with no round trip in
        between, so the exchange never stands unbound while a producer could
        see it (a fanout exchange with no queue drops what it gets). Every
        binding of ``spec`` must be to its one exchange. Once per connection.
        """
        exchanges = {exchange for exchange, _ in spec.bindings}
        if len(exchanges) != 1:
            raise ConfigurationError(
                f"queue {spec.name!r} must be bound to exactly one exchange, not {exchanges!r}"
            )
        (exchange,) = exchanges

        async def action(channel: aiormq.abc.AbstractChannel) -> None:
            await _declare_queue(channel, spec, bind=False)
            # nowait: the binding's answer confirms the exchange too (a failed
            # declaration closes the channel, and the bind fails with its reason).
            await channel.exchange_declare(
                exchange, exchange_type="fanout", durable=True, nowait=True
            )
            await _bind_queue(channel, spec)

        key = ("fanout-queue", spec.name, tuple(sorted(spec.arguments.items())), spec.bindings)
        await self._once(key, connection, action)

    async def forward_queue(
        self, connection: aiormq.abc.AbstractConnection, topology: DelayTopology, exchange: str
    ) -> str:
        """Declare ``exchange``'s forward queue, bound to the chain's end, and its parking.

        Once per connection: a retry returning to an exchange comes through here
        each time. Returns the queue's name.
        """
        spec = topology.forward_queue_spec(exchange)
        await self.topology(connection, topology)
        await self._once(
            ("forward-queue", topology, spec.name),
            connection,
            lambda ch: _declare_queue(ch, spec),
        )
        await self.destination(connection, topology, spec.name)
        return spec.name

    def has_destination(
        self, topology: DelayTopology, queue: str, parking_queue: str | None = None
    ) -> bool:
        """Whether :meth:`destination` (with parking) has succeeded on this connection."""
        return ("destination", topology, queue, parking_queue, True) in self._done

    async def parking(
        self,
        connection: aiormq.abc.AbstractConnection,
        topology: DelayTopology,
        queue: str,
        parking_queue: str | None = None,
    ) -> None:
        """Re-declare ``queue``'s parking queue before a park, so one deleted by hand is back.

        Concurrent parks share one declaration (one channel), and a declaration
        serves the parks of the next :data:`PARKING_REDECLARE_INTERVAL` seconds:
        a storm of parks opens a bounded number of channels, never one each
        (the broker closes the whole connection past its ``channel_max``). A
        park in that window after a deletion is caught by the parking
        exchange's alternate exchange, in the unroutable queue.
        """
        key = (topology, queue, parking_queue)
        declared_at = self._parking_at.get(key)
        if declared_at is not None and time.monotonic() - declared_at < PARKING_REDECLARE_INTERVAL:
            return
        running = self._parking_now.get(key)
        if running is not None:
            await asyncio.shield(running)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parking_now[key] = done
        try:
            spec = topology.parking_queue_spec(queue, parking_queue)
            await on_scratch_channel(connection, lambda ch: _declare_queue(ch, spec))
        except BaseException as exc:
            done.set_exception(exc)
            done.exception()  # retrieved: waiters, if any, raise it themselves
            raise
        else:
            self._parking_at[key] = time.monotonic()
            done.set_result(None)
        finally:
            self._parking_now.pop(key, None)

    async def _once(
        self,
        key: tuple[object, ...],
        connection: aiormq.abc.AbstractConnection,
        action: Callable[[aiormq.abc.AbstractChannel], Awaitable[None]],
    ) -> None:
        await self._once_doing(key, lambda: on_scratch_channel(connection, action))

    async def _once_doing(
        self, key: tuple[object, ...], work: Callable[[], Awaitable[None]]
    ) -> None:
        """Run ``work`` for ``key`` once on this connection, however many ask at once."""
        if key in self._done:
            return
        async with self._lock:
            if key in self._done:
                return
            await work()
            self._done.add(key)

    async def topology(
        self, connection: aiormq.abc.AbstractConnection, topology: DelayTopology
    ) -> None:
        """Declare the chain, delivery, unroutable and parking exchanges and queues.

        Once per connection, and only when something is missing or different:
        a chain marked complete, with every exchange and queue in place (passive
        checks, :func:`~delayed_retry.amqp.chain_marker.chain_is_marked_complete`),
        is not declared again. After :meth:`forget` it is, in full.
        """

        async def declare_unless_complete() -> None:
            if (
                topology not in self._repair
                and markable(topology)
                and await chain_is_marked_complete(connection, topology)
            ):
                log.debug("delay topology %r is complete: nothing to declare", topology.prefix)
                _log_memory_hint(connection, topology, tolerated=False)
                return
            await on_scratch_channel(connection, lambda ch: _declare_topology(ch, topology))
            log.debug("declared delay topology %r (%d levels)", topology.prefix, topology.levels)
            self._repair.discard(topology)

        await self._once_doing(("topology", topology), declare_unless_complete)

    async def destination(
        self,
        connection: aiormq.abc.AbstractConnection,
        topology: DelayTopology,
        queue: str,
        parking_queue: str | None = None,
        *,
        with_parking: bool = True,
    ) -> None:
        """Bind ``queue`` to the end of the chain and, unless told not to, declare its parking."""
        # with_parking in the key: a binding made for scheduling (no parking) must not
        # stand in for a consumer's, which also needs its parking queue.
        done_key = ("destination", topology, queue, parking_queue, with_parking)
        if done_key in self._done:  # every message comes through here: stay cheap
            return
        await self.topology(connection, topology)
        exchange, key = topology.delivery_binding(queue)

        async def action(channel: aiormq.abc.AbstractChannel) -> None:
            try:
                await channel.queue_bind(queue, exchange, routing_key=key)
            except aiormq.exceptions.ChannelNotFoundEntity as exc:
                if f"no exchange '{exchange}'" not in str(exc):
                    raise _explain(
                        exc, f"queue {queue!r}", "a binding to the delivery exchange"
                    ) from exc
                # The chain was deleted under this connection: declare it again next time.
                self.forget(topology)
                raise NotFoundError(
                    f"the delivery exchange {exchange!r} of the delay chain {topology.prefix!r} "
                    f"is missing (deleted by hand, or by a teardown): {exc}. The chain is "
                    "declared again on the next try; if this repeats, find what deletes it"
                ) from exc
            except aiormq.exceptions.ChannelClosed as exc:
                raise _explain(
                    exc, f"queue {queue!r}", "a binding to the delivery exchange"
                ) from exc
            if with_parking:
                await _declare_queue(channel, topology.parking_queue_spec(queue, parking_queue))

        await self._once(done_key, connection, action)


_declarers: weakref.WeakKeyDictionary[aiormq.abc.AbstractConnection, TopologyDeclarer] = (
    weakref.WeakKeyDictionary()
)


def declarer_for(connection: aiormq.abc.AbstractConnection) -> TopologyDeclarer:
    """The declaration cache of ``connection``; a reconnect brings a new, empty one."""
    declarer = _declarers.get(connection)
    if declarer is None:
        declarer = _declarers[connection] = TopologyDeclarer()
    return declarer


async def declare_topology(
    channel: Any,
    topology: DelayTopology = DEFAULT_TOPOLOGY,
    *,
    queues: Iterable[str] = (),
    repair: bool = False,
) -> None:
    """Declare ``topology`` now, and bind ``queues`` to its end (with their parking queues).

    Optional: the decorator and :func:`~delayed_retry.publish_delayed` declare
    what they need on first use. Call it at start-up to fail fast on a
    mismatch. ``channel`` is an aio-pika or aiormq channel; the declarations
    are cached per connection, so calling it again costs nothing; a new
    connection that finds the chain complete and marked so declares none of it
    (see :mod:`delayed_retry.amqp.chain_marker`).

    ``repair=True`` declares every exchange, queue and binding now, even on a
    connection that declared them, even when the chain is marked complete: for
    a binding removed by hand, which no check over AMQP sees (the
    ``delayed-retry declare`` command does this).
    """
    underlay = await underlay_channel(channel)
    declarer = declarer_for(underlay.connection)
    if repair:
        declarer.forget(topology)
    await declarer.topology(underlay.connection, topology)
    for queue in queues:
        await declarer.destination(underlay.connection, topology, queue)
