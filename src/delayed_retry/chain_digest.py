"""What a complete declaration of a delay chain leaves behind: a digest and a marker name. Pure.

Declaring a 36-level chain sends 702 bindings, which the broker writes one by
one (RabbitMQ 3.10 in Mnesia, 4.3 through Khepri's consensus), even when they
exist already. So a declaration that completes writes, last, a marker: an
exchange named by :func:`marker_exchange`, whose name ends in a digest of
everything the declaration sent (:func:`declaration_digest`). A connection
that finds that marker, and every exchange and queue of the chain, needs to
send no binding (see :mod:`delayed_retry.amqp.chain_marker`). Other settings,
or another version whose declarations differ, give another digest, hence
another marker, and a full declaration.
"""

from __future__ import annotations

import hashlib
import json

from delayed_retry.topology import DelayTopology, amqp_arguments

__all__ = ["MARKER_FORMAT", "declaration_digest", "marker_exchange"]

MARKER_FORMAT = 1
"""Part of the digest: a change of what a marker vouches for changes every marker's name."""

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


def marker_exchange(topology: DelayTopology) -> str:
    """``<prefix>.chain-<digest>``: the exchange a complete declaration of ``topology`` writes last.

    Its suffix is no longer than the longest one the topology allows for, so
    every valid prefix gives a valid name.
    """
    return f"{topology.prefix}.chain-{declaration_digest(topology)}"
