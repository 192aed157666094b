"""The delay chain's names and arguments: which exchanges and queues exist, and how.

Pure: nothing here talks to a broker. :mod:`delayed_retry.amqp.chain_declaration` turns a
:class:`DelayTopology` into declarations. The chain drawn, with its skip-zero bindings and
the queues around it: docs/reference/topology.md.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal, NamedTuple, TypedDict

from delayed_retry.chain import routing_keys
from delayed_retry.durations import Duration, to_seconds
from delayed_retry.errors import ConfigurationError, DelayOutOfRangeError
from delayed_retry.rabbitmq.policies import BrokerPolicy, regex_literal

__all__ = [
    "DEFAULT_TOPOLOGY",
    "DelayTopology",
    "ExchangeSpec",
    "IN_MEMORY_ARGUMENTS",
    "QueueArguments",
    "QueueSpec",
    "QueueType",
    "Naming",
    "Route",
    "amqp_arguments",
]

QueueType = Literal["quorum", "classic"]
Naming = Literal["delayed-retry", "nservicebus-v2"]

NSB_LEVEL_PREFIX = "nsb.v2.delay-level-"
"""NServiceBus.RabbitMQ's v2 level names: ``nsb.v2.delay-level-00`` … ``-27``."""
NSB_DELIVERY_EXCHANGE = "nsb.v2.delay-delivery"
"""NServiceBus.RabbitMQ's v2 delivery exchange (endpoints bind ``#.<address>`` to it)."""
NSB_LEVELS = 28

MAX_QUEUE_TTL_MS = 315_360_000_000
"""The largest ``x-message-ttl`` RabbitMQ accepts: ten years (measured on 3.10.8)."""

MAX_NAME_BYTES = 255
"""AMQP 0-9-1 exchange and queue names are short strings."""

_LONGEST_SUFFIX = ".parking.alerts"

_NO_DELAY = timedelta(0)
_MICROSECOND = timedelta(microseconds=1)

DELIVERY_LIMIT = 1_000_000_000
"""``x-delivery-limit`` of every quorum queue delayed-retry consumes or keeps messages in.

That is the parking and unroutable queues, the rejected queue, the front
door's inbox and the forward queues. Without one, RabbitMQ 4.0–4.2 apply a
limit of 20, and every return counts: a peek (``basic.get`` returned unacked),
a message given back after a failed hand-over, a consumer crash. The 21st
drops the message. ``-1`` turns the limit off on 4.0+, but RabbitMQ 3.10 reads
it as "drop at the first return" (both measured, 3.10.8 and 4.0.5), so a
finite limit no return can reach is the one value safe on 3.10–4.x.
"""


IN_MEMORY_ARGUMENTS = ("x-max-in-memory-length", "x-max-in-memory-bytes")
"""Quorum queue arguments that keep message bodies on disk on RabbitMQ 3.10–3.11.

delayed-retry never declares them: the broker (3.10.8 and 4.0.5 alike)
refuses to re-declare a queue with or without one of them when the queue
exists the other way, so a chain declared with them by one process could no
longer be declared by a process that declares it without, and the reverse.
The same effect comes from a policy (:meth:`DelayTopology.memory_policy`),
which leaves the arguments alone. A level queue that already has one is used
as it is. RabbitMQ 3.12+ accepts them but ignores them (bodies are on disk).
"""


class QueueArguments(TypedDict, total=False):
    """The ``x-*`` arguments delayed-retry sets on the queues it declares."""

    x_queue_type: QueueType
    x_message_ttl: int
    x_dead_letter_exchange: str
    x_dead_letter_routing_key: str
    x_dead_letter_strategy: Literal["at-least-once", "at-most-once"]
    x_overflow: Literal["reject-publish", "drop-head"]
    x_max_length: int
    x_delivery_limit: int


def amqp_arguments(args: QueueArguments) -> dict[str, str | int]:
    """``QueueArguments`` spelled as AMQP wants them (``x_message_ttl`` → ``x-message-ttl``)."""
    return {key.replace("_", "-"): value for key, value in args.items()}  # type: ignore[misc]


class ExchangeSpec(NamedTuple):
    """One exchange to declare."""

    name: str
    type: Literal["topic", "fanout"]
    alternate_exchange: str | None


class QueueSpec(NamedTuple):
    """One queue to declare, with its bindings as (exchange, routing key) pairs."""

    name: str
    arguments: QueueArguments
    bindings: tuple[tuple[str, str], ...]


class Route(NamedTuple):
    """Where to publish a message so that it arrives at ``destination`` after ``units``."""

    exchange: str
    routing_key: str
    units: int


@dataclass(frozen=True, kw_only=True)
class DelayTopology:
    """The delay chain and parking exchanges shared by every consumer on a vhost.

    The defaults suit most systems: 1 ms resolution, 36 levels (a maximum
    delay of about 795 days) and quorum queues with at-least-once
    dead-lettering, which keep delayed messages through a node loss in a
    cluster. Choose ``queue_type="classic"`` only on a single node where
    at-most-once dead-lettering is acceptable. Every process that uses the
    same ``prefix`` must use the same settings: declaring a different one
    fails with :class:`~delayed_retry.errors.TopologyMismatchError`.

    ``naming="nservicebus-v2"`` (made by :meth:`nservicebus`) names the levels
    and the delivery exchange as NServiceBus.RabbitMQ's v2 delay infrastructure
    does, so Python services and .NET endpoints on one broker share one chain.
    """

    prefix: str = "delayed-retry"
    levels: int = 36
    unit: Duration = timedelta(milliseconds=1)
    queue_type: QueueType = "quorum"
    naming: Naming = "delayed-retry"
    unit_ms: int = field(init=False, repr=False, compare=False)

    @classmethod
    def nservicebus(cls, *, prefix: str = "delayed-retry") -> DelayTopology:
        """The chain NServiceBus.RabbitMQ (7.0+) declares: ``nsb.v2.delay-level-00`` … ``27``.

        Use it when .NET NServiceBus endpoints already run on the broker (or
        will): 28 levels of 1 s on quorum queues, the delivery exchange
        ``nsb.v2.delay-delivery``, routing keys of 28 digit words then the
        destination, exactly NServiceBus's. Delays are whole seconds, rounded up
        (at most about 8.5 years). The parking, unroutable and rejected
        exchanges keep ``prefix``. NServiceBus declares its level and delivery
        exchanges without an alternate exchange, so these do too; a message
        whose destination was deleted is caught only if a policy sets one (see
        docs/nservicebus.md).
        """
        return cls(
            prefix=prefix,
            levels=NSB_LEVELS,
            unit=timedelta(seconds=1),
            queue_type="quorum",
            naming="nservicebus-v2",
        )

    def __post_init__(self) -> None:
        if not self.prefix or self.prefix.startswith("amq.") or " " in self.prefix:
            raise ConfigurationError(
                f"prefix {self.prefix!r} of the delay chain is not usable; pick a name such as "
                "'delayed-retry' (not empty, no spaces, not starting with 'amq.')"
            )
        if isinstance(self.levels, bool) or not isinstance(self.levels, int):
            raise ConfigurationError(
                f"levels {self.levels!r} of the delay chain must be a whole number, 1 to 48"
            )
        if not 1 <= self.levels <= 48:
            raise ConfigurationError(
                f"levels {self.levels} of the delay chain is outside 1..48; 36 levels of 1 ms "
                "hold delays up to about 795 days"
            )
        unit_seconds = to_seconds(self.unit, name="DelayTopology unit")
        unit_ms = unit_seconds * 1000
        if unit_ms < 1 or not math.isclose(unit_ms, round(unit_ms), abs_tol=1e-9):
            raise ConfigurationError(
                f"unit {unit_ms:g} ms of the delay chain must be a whole number of "
                "milliseconds, at least 1, because queue TTLs are whole milliseconds"
            )
        if self.queue_type not in ("quorum", "classic"):
            raise ConfigurationError(
                f"DelayTopology queue_type={self.queue_type!r} must be 'quorum' or 'classic'"
            )
        if self.naming not in ("delayed-retry", "nservicebus-v2"):
            raise ConfigurationError(
                f"DelayTopology naming={self.naming!r} must be 'delayed-retry' or 'nservicebus-v2'"
            )
        if self.naming == "nservicebus-v2" and (
            self.levels != NSB_LEVELS or round(unit_ms) != 1000 or self.queue_type != "quorum"
        ):
            raise ConfigurationError(
                "NServiceBus's v2 delay infrastructure is 28 levels of 1 s on quorum queues; "
                f"got levels={self.levels}, unit={self.unit!r}, queue_type={self.queue_type!r}. "
                "Use DelayTopology.nservicebus()"
            )
        if len(self.prefix.encode()) + len(_LONGEST_SUFFIX) > MAX_NAME_BYTES:
            raise ConfigurationError(
                f"prefix {self.prefix[:40]!r}… of the delay chain is "
                f"{len(self.prefix.encode())} bytes; names are at most {MAX_NAME_BYTES} bytes, "
                f"so the prefix may have at most {MAX_NAME_BYTES - len(_LONGEST_SUFFIX)}"
            )
        top_ttl = (1 << (self.levels - 1)) * round(unit_ms)
        if top_ttl > MAX_QUEUE_TTL_MS:
            # The broker refuses the queue, and only when the chain is first declared.
            raise ConfigurationError(
                f"{self.levels} levels of {round(unit_ms)} ms give the delay chain's level "
                f"{self.levels - 1} a TTL of {top_ttl} ms, but RabbitMQ accepts at most "
                f"{MAX_QUEUE_TTL_MS} ms (ten years); use at most "
                f"{(MAX_QUEUE_TTL_MS // round(unit_ms)).bit_length()} levels with this unit"
            )
        object.__setattr__(self, "unit_ms", round(unit_ms))

    # -- names ---------------------------------------------------------------
    @property
    def _level_prefix(self) -> str:
        if self.naming == "nservicebus-v2":
            return NSB_LEVEL_PREFIX
        return f"{self.prefix}.level."

    def level_name(self, level: int) -> str:
        """Name of level ``level``'s exchange and of its queue (they share it)."""
        return f"{self._level_prefix}{level:02d}"

    @functools.cached_property
    def _level_names(self) -> tuple[str, ...]:
        """:meth:`level_name` of each level, spelled once: every retry into the chain needs one.

        Not a field: it is derived, and stays out of comparisons, hashes and repr.
        """
        return tuple(self.level_name(level) for level in range(self.levels))

    @property
    def delivery_exchange(self) -> str:
        """The exchange the chain ends in; each destination queue binds to it.

        Its name carries the number of levels: level 0's queue dead-letters
        into it, so two processes that disagree on ``levels`` (and would read
        each other's routing keys wrongly) fail on that queue's arguments.
        With NServiceBus naming it is ``nsb.v2.delay-delivery``.
        """
        if self.naming == "nservicebus-v2":
            return NSB_DELIVERY_EXCHANGE
        return f"{self.prefix}.delivery-{self.levels}"

    @property
    def unroutable_exchange(self) -> str:
        """Alternate exchange catching what the chain cannot route (a deleted destination)."""
        return f"{self.prefix}.unroutable"

    @property
    def unroutable_queue(self) -> str:
        """Where unroutable chain messages are kept for people to inspect and replay."""
        return f"{self.prefix}.unroutable"

    @property
    def rejected_exchange(self) -> str:
        """Dead-letter exchange for consumers in any language: a queue's ``x-dead-letter-exchange``.

        Messages a consumer rejects (``basic.reject``/``nack`` without requeue)
        from a queue with this dead-letter exchange land in :attr:`rejected_queue`,
        where :class:`~delayed_retry.consumer.router.RetryRouter` retries or parks them.
        """
        return f"{self.prefix}.rejected"

    @property
    def rejected_queue(self) -> str:
        """Where rejected messages wait for the router."""
        return f"{self.prefix}.rejected"

    @property
    def parking_exchange(self) -> str:
        """Exchange for parked messages; routing key is the queue that gave up."""
        return f"{self.prefix}.parking"

    @property
    def alerts_queue(self) -> str:
        """Gets a copy of every parked and unroutable message, for alerting."""
        return f"{self.prefix}.parking.alerts"

    @property
    def mutes_stream(self) -> str:
        """The stream of muted failure groups every alerts process reads (declared on use)."""
        return f"{self.prefix}.parking.mutes"

    def is_chain_exchange(self, exchange: str | None) -> bool:
        """Whether a delivery came out of this chain (a level or the delivery exchange).

        A delivery names the exchange its last dead-letter hop went to, which
        is a level exchange unless the last 1 bit was level 0.
        """
        if not exchange:
            return False
        if exchange == self.delivery_exchange:
            return True
        level = exchange.removeprefix(self._level_prefix)
        return level != exchange and level.isdigit() and int(level) < self.levels

    def forward_queue(self, exchange: str) -> str:
        """The queue holding delays for ``exchange`` at the chain's end: ``<prefix>.forward.X``.

        A forwarder consumes it and delivers each message to ``exchange``
        (dead-lettering cannot rewrite a routing key, so this takes one process step).
        """
        if not exchange:
            raise ConfigurationError(
                "exchange='' (the default exchange) cannot be a delay destination; "
                "pass queue=NAME to publish_delayed instead"
            )
        name = f"{self.prefix}.forward.{exchange}"
        self.check_destination(name)
        return name

    @staticmethod
    def default_parking_queue(queue: str) -> str:
        """The parking queue of ``queue`` unless configured: ``<queue>.parking``."""
        return f"{queue}.parking"

    @staticmethod
    def default_dead_letter_queue(queue: str) -> str:
        """Where the broker moves what ``queue`` cannot deliver: ``<queue>.dead-letter``.

        See :func:`work_queue_arguments`.
        """
        return f"{queue}.dead-letter"

    def is_level_queue(self, name: str) -> bool:
        """Whether ``name`` is one of this chain's level queues."""
        level = name.removeprefix(self._level_prefix)
        return level != name and level.isdigit() and int(level) < self.levels

    def memory_policy(self) -> BrokerPolicy:
        """The operator policy that keeps this chain's bodies on disk on RabbitMQ 3.10–3.11.

        RabbitMQ documents ``max-in-memory-length`` for quorum queues on 3.10
        and 3.11, which may keep message bodies in memory; docs/capacity.md has
        what it changed on 3.10.8 here. Apply it once per vhost on those
        versions, before delays pile up; it changes no queue argument, so every
        process that declares the chain keeps agreeing on it. It is an operator
        policy, so it merges with any ordinary policy on the same queues. It
        matches the level queues only (``<prefix>.level.NN``, or NServiceBus's
        ``nsb.v2.delay-level-NN``): they hold the waiting messages. RabbitMQ
        3.12+ accepts the key and ignores it: there is nothing to do there.
        """
        return BrokerPolicy(
            name=f"{self.prefix}.levels-on-disk"
            if self.naming == "delayed-retry"
            else "nsb.v2.delay-levels-on-disk",
            pattern=f"^{regex_literal(self._level_prefix)}[0-9]+$",
            definition={"max-in-memory-length": 0},
            priority=0,
            operator=True,
        )

    # -- delays --------------------------------------------------------------
    @property
    def max_units(self) -> int:
        """The longest delay the chain holds, in units."""
        return (1 << self.levels) - 1

    @property
    def max_delay(self) -> timedelta:
        """The longest delay the chain holds."""
        return timedelta(milliseconds=self.max_units * self.unit_ms)

    def units_until(self, due_at: datetime, *, now: datetime) -> int:
        """Units from ``now`` to ``due_at``, rounded up; raises when past the maximum."""
        # Round the exact gap up to units: rounding each end to milliseconds first
        # can lose most of a millisecond and deliver early.
        delay = max(due_at - now, _NO_DELAY)
        units = -(-(delay // _MICROSECOND) // (self.unit_ms * 1000))
        if units > self.max_units:
            raise DelayOutOfRangeError(
                f"a delay of {delay} is longer than the maximum {self.max_delay} of the delay "
                f"chain {self.prefix!r} ({self.levels} levels of {self.unit_ms} ms); add levels "
                "or use a coarser unit"
            )
        return units

    def route(self, units: int, destination: str) -> Route:
        """Where to publish ``units`` of delay to ``destination``: its entry level.

        No delay goes straight to the delivery exchange, with the same key: it
        reaches ``destination`` (or the unroutable queue) in one routing step.
        """
        self.check_destination(destination)
        key = routing_keys.routing_key(units, self.levels, destination)
        if units == 0:
            return Route(self.delivery_exchange, key, 0)
        # routing_key accepted the units, so their entry level is one of the chain's.
        return Route(self._level_names[routing_keys.entry_level(units)], key, units)

    def check_destination(self, destination: str) -> None:
        """Raise :class:`ConfigurationError` when ``destination`` cannot be a chain target."""
        try:
            routing_keys.validate_destination(destination, self.levels)
        except ValueError as exc:
            raise ConfigurationError(f"queue {destination!r} cannot receive delays: {exc}") from exc

    # -- what to declare -----------------------------------------------------
    def _queue_arguments(
        self, dead_letter_exchange: str | None, ttl_ms: int | None, *, limited: bool = False
    ) -> QueueArguments:
        args: QueueArguments = {"x_queue_type": self.queue_type}
        if limited and self.queue_type == "quorum":
            # Queues the library consumes or keeps messages in: never let the broker's
            # delivery limit drop one (see DELIVERY_LIMIT).
            args["x_delivery_limit"] = DELIVERY_LIMIT
        if ttl_ms is not None:
            args["x_message_ttl"] = ttl_ms
        if dead_letter_exchange is not None:
            args["x_dead_letter_exchange"] = dead_letter_exchange
            if self.queue_type == "quorum":
                # At-least-once dead-lettering needs reject-publish; with drop-head the
                # broker silently falls back to at-most-once.
                args["x_dead_letter_strategy"] = "at-least-once"
                args["x_overflow"] = "reject-publish"
        return args

    def exchanges(self) -> list[ExchangeSpec]:
        """Every exchange of the topology, in an order that declares cleanly."""
        # NServiceBus declares its levels and delivery exchange without an alternate
        # exchange; declaring them with one would be refused as inequivalent.
        chain_ae = None if self.naming == "nservicebus-v2" else self.unroutable_exchange
        specs = [
            ExchangeSpec(self.unroutable_exchange, "fanout", None),
            ExchangeSpec(self.delivery_exchange, "topic", chain_ae),
            ExchangeSpec(self.parking_exchange, "topic", self.unroutable_exchange),
            ExchangeSpec(self.rejected_exchange, "fanout", self.unroutable_exchange),
        ]
        specs += [
            ExchangeSpec(self.level_name(level), "topic", chain_ae) for level in range(self.levels)
        ]
        return specs

    @property
    def skips_zeros(self) -> bool:
        """Whether each level exchange routes straight to the next 1 bit's queue.

        True for the chain's own naming. NServiceBus.RabbitMQ's chain keeps its
        pass-through bindings (one exchange per level), so that the endpoints
        that declare it agree with this library on every binding.
        """
        return self.naming == "delayed-retry"

    def exchange_bindings(self) -> list[tuple[str, str, str]]:
        """(destination, source, routing key) of the exchange-to-exchange bindings.

        Skipping zeros: each level exchange sends a message with no 1 bit left
        at or below its level to the delivery exchange. NServiceBus naming:
        each level passes 0 digits one level down.
        """
        out = []
        for level in range(self.levels):
            if self.skips_zeros:
                key = routing_keys.drained_binding_key(level, self.levels)
                out.append((self.delivery_exchange, self.level_name(level), key))
                continue
            lower = self.level_name(level - 1) if level else self.delivery_exchange
            key = routing_keys.level_binding_key(level, self.levels, 0)
            out.append((lower, self.level_name(level), key))
        return out

    def retired_bindings(self) -> list[tuple[str, str, str]]:
        """(destination, source, routing key) of the pass-through bindings this chain removes.

        Level ``j``'s exchange bound to level ``j - 1``'s for a 0 digit. They
        route nothing wrong next to the skip-zero bindings (a message reaches
        each queue once), but every message then passes every level exchange
        again. Declaring the chain removes them, after its own bindings are in
        place. Empty for NServiceBus naming, whose chain these bindings are.
        """
        if not self.skips_zeros:
            return []
        return [
            (
                self.level_name(level - 1),
                self.level_name(level),
                routing_keys.level_binding_key(level, self.levels, 0),
            )
            for level in range(1, self.levels)
        ]

    def level_queue_bindings(self, level: int) -> tuple[tuple[str, str], ...]:
        """(exchange, routing key) pairs binding level ``level``'s queue."""
        if not self.skips_zeros:
            name = self.level_name(level)
            return ((name, routing_keys.level_binding_key(level, self.levels, 1)),)
        return tuple(
            (self.level_name(source), routing_keys.skip_binding_key(source, level, self.levels))
            for source in range(level, self.levels)
        )

    def queues(self) -> list[QueueSpec]:
        """Every shared queue of the topology with its bindings."""
        specs = []
        for level in range(self.levels):
            lower = self.level_name(level - 1) if level else self.delivery_exchange
            specs.append(
                QueueSpec(
                    self.level_name(level),
                    self._queue_arguments(lower, (1 << level) * self.unit_ms),
                    self.level_queue_bindings(level),
                )
            )
        specs.append(
            QueueSpec(
                self.unroutable_queue,
                self._queue_arguments(None, None, limited=True),
                ((self.unroutable_exchange, ""),),
            )
        )
        specs.append(
            QueueSpec(
                self.rejected_queue,
                self._queue_arguments(None, None, limited=True),
                ((self.rejected_exchange, ""),),
            )
        )
        alerts: QueueArguments = {
            "x_queue_type": "classic",
            "x_max_length": 100_000,
            "x_overflow": "drop-head",
        }
        specs.append(
            QueueSpec(
                self.alerts_queue,
                alerts,
                ((self.parking_exchange, "#"), (self.unroutable_exchange, "")),
            )
        )
        return specs

    def parking_queue_spec(self, queue: str, parking_queue: str | None = None) -> QueueSpec:
        """The parking queue of ``queue``, bound to the parking exchange with key ``queue``."""
        name = parking_queue or self.default_parking_queue(queue)
        return QueueSpec(
            name, self._queue_arguments(None, None, limited=True), ((self.parking_exchange, queue),)
        )

    def dead_letter_queue_spec(self, name: str) -> QueueSpec:
        """A work queue's dead-letter queue (:func:`work_queue_arguments`), kept like parking.

        Unbound: the broker dead-letters into it through the default exchange.
        """
        return QueueSpec(name, self._queue_arguments(None, None, limited=True), ())

    def forward_queue_spec(self, exchange: str) -> QueueSpec:
        """The forward queue of ``exchange`` (:meth:`forward_queue`); bound like any destination."""
        return QueueSpec(
            self.forward_queue(exchange), self._queue_arguments(None, None, limited=True), ()
        )

    def inbox_queue_spec(self, delay_exchange: str) -> QueueSpec:
        """The front door's inbox: a queue named and bound like its ``X.delay`` exchange."""
        return QueueSpec(
            delay_exchange,
            self._queue_arguments(None, None, limited=True),
            ((delay_exchange, ""),),
        )

    def delivery_binding(self, queue: str) -> tuple[str, str]:
        """(exchange, routing key) binding ``queue`` to the end of the chain."""
        self.check_destination(queue)
        return self.delivery_exchange, routing_keys.delivery_binding_key(self.levels, queue)


DEFAULT_TOPOLOGY = DelayTopology()
"""The topology used when none is given: prefix ``delayed-retry``, 36 levels of 1 ms, quorum."""
