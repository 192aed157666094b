"""What the broker holds on a vhost, as records, and which policies apply to an object. Pure.

The management API client (:mod:`delayed_retry.admin.management`) reads a
vhost into a :class:`LiveChain`; the chain's diff
(:mod:`delayed_retry.admin.chain_diff`), the bindings' check
(:mod:`delayed_retry.admin.chain_bindings`) and the plugin migration read it.
:func:`applying_policies` is the broker's rule for which policies act on a
queue or an exchange.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Binding",
    "LiveChain",
    "LiveExchange",
    "LiveQueue",
    "Policy",
    "applying_policies",
]


@dataclass(frozen=True, kw_only=True)
class Binding:
    """One binding: the ``source`` exchange routes to a queue or exchange ``destination``.

    The one binding record of the package: what the chain needs
    (:func:`expected_bindings`), what the management API reports
    (:mod:`delayed_retry.admin.management`) and what a plugin migration copies.
    Equal bindings have the same source, destination and routing key; their
    ``arguments`` and ``properties_key`` do not take part (the chain binds
    without arguments).
    """

    source: str
    destination_type: str  # "queue" or "exchange"
    destination: str
    routing_key: str
    arguments: Mapping[str, Any] = field(default_factory=dict, compare=False)
    # How the management API names the binding (to delete it).
    properties_key: str = field(default="", compare=False)

    def describe(self) -> str:
        """``binding 'src' → queue 'dst' (key 'k')``, the object named in a difference."""
        return (
            f"binding {self.source!r} → {self.destination_type} {self.destination!r} "
            f"(key {self.routing_key!r})"
        )


@dataclass(frozen=True, kw_only=True)
class LiveExchange:
    """An exchange as the broker reports it."""

    name: str
    type: str
    durable: bool = True
    arguments: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class LiveQueue:
    """A queue as the broker reports it."""

    name: str
    durable: bool = True
    arguments: Mapping[str, Any] = field(default_factory=dict)
    messages: int | None = None
    leader: str | None = None
    """The node leading it (a quorum queue's leader, a classic queue's node), if reported."""
    members: tuple[str, ...] = ()
    """The nodes holding a replica of a quorum queue (empty for other types)."""


@dataclass(frozen=True, kw_only=True)
class Policy:
    """A policy (or an operator policy) of the vhost, as the management API lists it."""

    name: str
    pattern: str
    apply_to: str = "all"
    priority: int = 0
    definition: Mapping[str, Any] = field(default_factory=dict)
    operator: bool = False


@dataclass(frozen=True, kw_only=True)
class LiveChain:
    """What the broker holds on a vhost: exchanges, queues, bindings and policies."""

    exchanges: Mapping[str, LiveExchange]
    queues: Mapping[str, LiveQueue]
    bindings: frozenset[Binding]
    policies: tuple[Policy, ...] = ()
    vhost: str = "/"


def _applies(policy: Policy, name: str, kind: str, queue_type: str | None) -> bool:
    targets = {
        "all": ("queue", "exchange"),
        "queues": ("queue",),
        "exchanges": ("exchange",),
        "classic_queues": ("queue",),
        "quorum_queues": ("queue",),
        "streams": ("queue",),
    }.get(policy.apply_to, ())
    if kind not in targets:
        return False
    if policy.apply_to in ("classic_queues", "quorum_queues", "streams"):
        wanted = {"classic_queues": "classic", "quorum_queues": "quorum", "streams": "stream"}
        if queue_type != wanted[policy.apply_to]:
            return False
    try:
        return re.search(policy.pattern, name) is not None  # the broker's re:run searches too
    except re.error:
        return False


def applying_policies(
    policies: Iterable[Policy], name: str, *, kind: str, queue_type: str | None = None
) -> list[Policy]:
    """The policies the broker applies to ``name``: the highest-priority match of each sort.

    Computed from the policy list rather than read from the object, whose
    reported policy lags behind by the management plugin's statistics interval.
    """
    out = []
    for operator in (False, True):
        matches = [
            p for p in policies if p.operator == operator and _applies(p, name, kind, queue_type)
        ]
        if matches:
            out.append(max(matches, key=lambda p: p.priority))
    return out
