"""Which bindings a chain needs, and how a live chain's level exchanges are bound. Pure.

A chain of this library's naming skips zeros: each level exchange binds
every lower level's queue directly (:meth:`DelayTopology.level_queue_bindings`).
A pass-through chain binds each level exchange to the next lower one instead:
NServiceBus.RabbitMQ's chain is made that way, and so was this library's
before 0.1.0. :func:`binding_style` tells them apart, and the mix of both
that a chain holds while processes of either kind declare it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from delayed_retry.admin.live_chain import Binding
from delayed_retry.chain.topology import DelayTopology

__all__ = [
    "BindingStyle",
    "binding_style",
    "expected_bindings",
    "retired_bindings",
    "skip_only_bindings",
]


def _as_binding(destination_type: str, destination: str, source: str, key: str) -> Binding:
    return Binding(
        source=source, destination_type=destination_type, destination=destination, routing_key=key
    )


def expected_bindings(topology: DelayTopology, queues: Iterable[str] = ()) -> set[Binding]:
    """Every binding the chain needs, and those of ``queues`` (delivery and parking)."""
    out = {
        _as_binding("queue", spec.name, exchange, key)
        for spec in topology.queues()
        for exchange, key in spec.bindings
    }
    out |= {_as_binding("exchange", *binding) for binding in topology.exchange_bindings()}
    for queue in queues:
        out.add(_as_binding("queue", queue, *topology.delivery_binding(queue)))
        spec = topology.parking_queue_spec(queue)
        out |= {_as_binding("queue", spec.name, ex, k) for ex, k in spec.bindings}
    return out


BindingStyle = Literal["skip-zeros", "pass-through", "mixed", "incomplete"]
"""How a live chain's level exchanges are bound (see :func:`binding_style`)."""


def _chain_bindings(topology: DelayTopology) -> set[Binding]:
    """The bindings of the chain itself (level queues and exchange-to-exchange), as declared."""
    out = {
        _as_binding("queue", spec.name, exchange, key)
        for spec in topology.queues()
        if topology.is_level_queue(spec.name)
        for exchange, key in spec.bindings
    }
    out |= {_as_binding("exchange", *binding) for binding in topology.exchange_bindings()}
    return out


def retired_bindings(topology: DelayTopology) -> set[Binding]:
    """:meth:`DelayTopology.retired_bindings` as records: what a skip-zero chain removes."""
    return {_as_binding("exchange", *binding) for binding in topology.retired_bindings()}


def skip_only_bindings(topology: DelayTopology) -> set[Binding]:
    """The skip-zero bindings a pass-through chain lacks (those beyond one per level)."""
    one_per_level = {
        _as_binding("queue", topology.level_name(level), *topology.level_queue_bindings(level)[0])
        for level in range(topology.levels)
    }
    one_per_level.add(_as_binding("exchange", *topology.exchange_bindings()[0]))
    return _chain_bindings(topology) - one_per_level


def binding_style(topology: DelayTopology, bindings: frozenset[Binding]) -> BindingStyle:
    """How the live ``bindings`` route ``topology``'s chain.

    ``skip-zeros``: the skip-zero bindings only. ``pass-through``: each level
    exchange bound to the next lower one, and none of the skip-zero bindings
    (a chain declared before 0.1.0). ``mixed``: both, as while a process that
    declares the pass-through bindings still runs beside one that declares
    the skip-zero ones; every message still reaches its queue once (the broker
    delivers a message once to a queue however many bindings match), but it
    passes every level exchange again. ``incomplete``: anything else.
    NServiceBus naming is always ``pass-through``, its own design, when whole.
    """
    chain = _chain_bindings(topology)
    retired = retired_bindings(topology)
    if not topology.skips_zeros:
        return "pass-through" if chain <= bindings else "incomplete"
    has_chain = chain <= bindings
    skip_only = skip_only_bindings(topology)
    if has_chain and not retired & bindings:
        return "skip-zeros"
    if has_chain and retired <= bindings:
        return "mixed"
    if not skip_only & bindings and retired <= bindings and (chain - skip_only) <= bindings:
        return "pass-through"
    return "incomplete"
