"""Check that the chain the options describe is the one on the broker, before acting on it.

A wrong or missing ``--prefix``/``--levels`` must not silently bind a queue to
a chain nobody consumes from. :func:`checked_topology` looks at the broker:
the chain's delivery exchange must exist (its name carries the level count),
its level-0 queue must have the arguments the options give, and, where the
management API answers, the queue acted on must be bound to that chain. When
neither ``--prefix`` nor ``$DELAYED_RETRY_PREFIX`` is given and the queue is
bound to exactly one chain, that chain is used.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import aiormq
from aio_pika.abc import AbstractConnection

from delayed_retry.amqp.declare import underlay_of
from delayed_retry.cli.common import topology_from_args
from delayed_retry.cli.output import CommandError
from delayed_retry.topology import DelayTopology, amqp_arguments

__all__ = ["bound_chains", "checked_topology", "management_base"]

_DELIVERY = re.compile(r"^(?P<prefix>.+)\.delivery-(?P<levels>\d+)$")


async def _exists(connection: AbstractConnection, kind: str, name: str) -> bool:
    channel = await connection.channel(publisher_confirms=False)
    try:
        if kind == "exchange":
            await channel.declare_exchange(name, passive=True)
        else:
            await channel.declare_queue(name, passive=True)
        return True
    except aiormq.exceptions.ChannelNotFoundEntity:
        return False
    finally:
        if not channel.is_closed:
            await channel.close()


def management_base(url: str) -> str:
    """The management API's address: ``$RABBITMQ_MANAGEMENT_URL``, else the AMQP host's 15672."""
    given = os.environ.get("RABBITMQ_MANAGEMENT_URL")
    if given:
        return given.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme == "amqps":
        return f"https://{parts.hostname}:15671"
    return f"http://{parts.hostname}:15672"


def _management_bindings(url: str, queue: str) -> list[dict[str, Any]] | None:
    """The queue's bindings from the management API, or ``None`` when it does not answer."""
    parts = urlsplit(url)
    vhost = unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    api = (
        f"{management_base(url)}/api/queues/{quote(vhost, safe='')}/"
        f"{quote(queue, safe='')}/bindings"
    )
    request = urllib.request.Request(api)
    user, password = unquote(parts.username or "guest"), unquote(parts.password or "guest")
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            data = json.load(response)
    except (OSError, urllib.error.URLError, ValueError):
        return None
    return data if isinstance(data, list) else None


async def bound_chains(url: str, queue: str) -> list[tuple[str, int]] | None:
    """``(prefix, levels)`` of every chain ``queue`` is bound to; ``None`` if unknowable.

    Bindings cannot be read over AMQP: this asks the management API (see
    :func:`management_base`; the URL's credentials) and gives ``None`` when
    it does not answer.
    """
    bindings = await asyncio.to_thread(_management_bindings, url, queue)
    if bindings is None:
        return None
    found = set()
    for binding in bindings:
        match = _DELIVERY.match(str(binding.get("source", "")))
        if match:
            found.add((match["prefix"], int(match["levels"])))
    return sorted(found)


async def _levels_of(connection: AbstractConnection, prefix: str) -> int | None:
    for levels in range(1, 49):
        if await _exists(connection, "exchange", f"{prefix}.delivery-{levels}"):
            return levels
    return None


def _options(prefix: str, levels: int) -> str:
    return f"--prefix {prefix} --levels {levels}"


async def checked_topology(
    connection: AbstractConnection, args: argparse.Namespace, *, queue: str | None = None
) -> DelayTopology:
    """The topology the options describe, once the broker shows it is the one in use.

    Raises :class:`CommandError` naming the mismatch and the options to pass.
    """
    topology = topology_from_args(args)
    given = bool(args.prefix or os.environ.get("DELAYED_RETRY_PREFIX"))
    if queue is not None:
        chains = await bound_chains(args.url, queue)
        if chains is not None and (topology.prefix, topology.levels) not in chains:
            if len(chains) == 1 and not given:
                prefix, levels = chains[0]
                topology = replace(topology, prefix=prefix, levels=levels)
            elif chains:
                shown = "; ".join(_options(p, n) for p, n in chains)
                raise CommandError(
                    f"queue {queue!r} is bound to the delay chain of {shown}, not to "
                    f"{_options(topology.prefix, topology.levels)}; pass the options of the "
                    "chain its consumers use (or set DELAYED_RETRY_PREFIX)"
                )
    if not await _exists(connection, "exchange", topology.delivery_exchange):
        found = await _levels_of(connection, topology.prefix)
        if found is not None:
            raise CommandError(
                f"the delay chain {topology.prefix!r} on this vhost has {found} levels, not "
                f"{topology.levels}; pass --levels {found}"
            )
        raise CommandError(
            f"there is no delay chain {topology.prefix!r} on this vhost (exchange "
            f"{topology.delivery_exchange!r} is missing); pass the --prefix your consumers use "
            "(or set DELAYED_RETRY_PREFIX), or create the chain with "
            f"'delayed-retry declare {_options(topology.prefix, topology.levels)}'"
        )
    spec = topology.queues()[0]
    if await _exists(connection, "queue", spec.name):
        # Re-declaring with the same arguments changes nothing; other arguments are refused.
        underlay = await underlay_of(await connection.channel(publisher_confirms=False))
        try:
            await underlay.queue_declare(
                spec.name, durable=True, arguments=dict(amqp_arguments(spec.arguments))
            )
        except aiormq.exceptions.ChannelPreconditionFailed as exc:
            raise CommandError(
                f"the delay chain {topology.prefix!r} was declared with another unit or queue "
                f"type than --unit-ms {topology.unit_ms} --queue-type {topology.queue_type} "
                f"(the broker said: {exc.args[0] if exc.args else exc}); pass the options your "
                "consumers use"
            ) from None
        finally:
            if not underlay.is_closed:
                await underlay.close()
    return topology
