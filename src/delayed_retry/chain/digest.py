"""What a complete declaration of a delay chain leaves behind: a digest and two markers. Pure.

:func:`settled_marker` (``<prefix>.chain``) is deleted first by every declaration and
written last; :func:`digest_marker` (``<prefix>.chain-<digest>``) says which declarations
completed (:func:`declaration_digest`). A connection that finds both, and every exchange and
queue of the chain, sends no binding (:mod:`delayed_retry.amqp.chain_marker`). Why:
docs/operating-the-chain.md, "What a new connection checks before declaring the chain".
"""

from __future__ import annotations

import hashlib
import json

from delayed_retry.chain.topology import DelayTopology, amqp_arguments

__all__ = [
    "MARKER_FORMAT",
    "declaration_digest",
    "digest_marker",
    "markable",
    "markers",
    "settled_marker",
]

MARKER_FORMAT = 1
"""Part of the digest: a change of what the markers vouch for changes every digest."""

_DIGEST_HEX = 8


def declaration_digest(topology: DelayTopology) -> str:
    """Eight hex digits that change with anything the declaration of ``topology`` sends.

    Every exchange (name, type, alternate exchange), every queue (name,
    arguments, bindings), the exchange-to-exchange bindings and the retired
    bindings the declaration removes. Same settings and same library
    declarations give the same digest in every process.
    """
    described = {
        "format": MARKER_FORMAT,
        "exchanges": [[ex.name, ex.type, ex.alternate_exchange] for ex in topology.exchanges()],
        "queues": [
            [spec.name, sorted(amqp_arguments(spec.arguments).items()), list(spec.bindings)]
            for spec in topology.queues()
        ],
        "exchange_bindings": topology.exchange_bindings(),
        "retired_bindings": topology.retired_bindings(),
    }
    text = json.dumps(described, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:_DIGEST_HEX]


def settled_marker(topology: DelayTopology) -> str:
    """``<prefix>.chain``: no declaration of the chain is under way, none was cut short."""
    return f"{topology.prefix}.chain"


def digest_marker(topology: DelayTopology) -> str:
    """``<prefix>.chain-<digest>``: a declaration of exactly ``topology``'s objects completed.

    Its suffix is no longer than the longest one the topology allows for, so
    every valid prefix gives a valid name.
    """
    return f"{topology.prefix}.chain-{declaration_digest(topology)}"


def markable(topology: DelayTopology) -> bool:
    """Whether a new connection may skip declaring ``topology`` when its markers say complete.

    Only a chain whose exchanges send what they cannot route to the unroutable
    queue: a binding removed by hand, which no check on a connection can see,
    then parks what it would have carried, with an alert. Without that net
    (NServiceBus naming) such a message would wait in its level for the binding,
    holding up the ones behind it, so every connection declares the chain in
    full, which puts the binding back.
    """
    unroutable = topology.unroutable_exchange
    return all(
        exchange.alternate_exchange == unroutable
        for exchange in topology.exchanges()
        if exchange.name != unroutable
    )


def markers(topology: DelayTopology) -> tuple[str, str]:
    """Both markers of ``topology``: the digest's, then the settled one (checked last)."""
    return digest_marker(topology), settled_marker(topology)
