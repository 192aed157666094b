"""What the broker's version decides, read from the AMQP ``server_properties``. Pure functions.

Use :func:`broker_version` (or :func:`broker_major_version`) wherever behaviour differs by
RabbitMQ version (docs/rabbitmq-versions.md lists where), so the version is parsed in one place;
:func:`bodies_in_memory_hint` is the start-up advice for 3.10–3.11 quorum queues.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from delayed_retry.chain.topology import DelayTopology

__all__ = [
    "bodies_in_memory_hint",
    "broker_major_version",
    "broker_version",
    "keeps_bodies_in_memory",
]


def broker_major_version(server_properties: Mapping[str, Any] | None) -> int | None:
    """The broker's major version from the AMQP ``server_properties``, or ``None``."""
    version = broker_version(server_properties)
    return version[0] if version is not None else None


def broker_version(server_properties: Mapping[str, Any] | None) -> tuple[int, int] | None:
    """The broker's (major, minor) version from the AMQP ``server_properties``, or ``None``."""
    if not isinstance(server_properties, Mapping):
        return None
    version = server_properties.get("version")
    if isinstance(version, bytes | bytearray):
        version = bytes(version).decode("ascii", "replace")
    if not isinstance(version, str):
        return None
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def keeps_bodies_in_memory(version: tuple[int, int] | None) -> bool:
    """Whether quorum queues of this version may keep bodies in memory (3.10–3.11).

    From 3.12 bodies live on disk and ``max-in-memory-length`` is ignored.
    Quorum queues before 3.10 cannot hold the chain (no TTL dead-lettering).
    """
    return version is not None and (3, 10) <= version < (3, 12)


def bodies_in_memory_hint(
    version: tuple[int, int] | None, *, topology: DelayTopology, vhost: str = "/"
) -> str | None:
    """What to do on RabbitMQ 3.10–3.11, where quorum queues may keep waiting bodies in memory.

    ``None`` on other versions. See docs/capacity.md for what was measured.
    """
    if not keeps_bodies_in_memory(version):
        return None
    assert version is not None
    return (
        f"RabbitMQ {version[0]}.{version[1]} quorum queues may keep the bodies of messages "
        f"waiting in delay chain {topology.prefix!r} in memory (max-in-memory-length limits "
        "that; 3.12+ keeps them on disk). If many delays wait at once, set this operator "
        f"policy once per vhost; it changes no queue argument: "
        f"{topology.memory_policy().command(vhost=vhost)}"
    )
