"""Start-up checks of the queues a retrying consumer reads. Pure functions.

A quorum queue's *delivery limit* makes the broker drop (or dead-letter) a
message once it has been redelivered that many times. delayed-retry never
counts retries with broker redeliveries: a delayed retry is a new message in
the queue, with a fresh delivery count. Redeliveries still happen, though,
after a consumer crash, a lost connection, or a hand-over into the delay chain
that could not be confirmed. A small limit can then remove a message before
the retry policy has parked it, without any parking record.

RabbitMQ 4.0 and later give every quorum queue a default delivery limit of
20 when none is set; 3.x has none. Set ``x-delivery-limit`` (or a
``delivery-limit`` policy) well above ``max_retries``, and give the queue a
dead-letter exchange so what passes it is kept; on 4.0+ ``-1`` turns the limit
off.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BROKER_DEFAULT_DELIVERY_LIMIT",
    "DeliveryLimitRisk",
    "broker_major_version",
    "check_delivery_limit",
    "warn_about_delivery_limit",
]

log = logging.getLogger(__name__)

BROKER_DEFAULT_DELIVERY_LIMIT = 20
"""The delivery limit RabbitMQ 4.0+ applies to quorum queues that set none."""

SAFE_REDELIVERIES = 10
"""Redeliveries from crashes and failed hand-overs a limit should leave room for."""


@dataclass(frozen=True, kw_only=True)
class DeliveryLimitRisk:
    """A delivery limit that may remove messages before the retry policy parks them."""

    queue: str
    limit: int
    from_broker_default: bool
    dead_letter_exchange: str | None
    message: str


def broker_major_version(server_properties: Mapping[str, Any] | None) -> int | None:
    """The broker's major version from the AMQP ``server_properties``, or ``None``."""
    if not isinstance(server_properties, Mapping):
        return None
    version = server_properties.get("version")
    if isinstance(version, bytes | bytearray):
        version = bytes(version).decode("ascii", "replace")
    if not isinstance(version, str):
        return None
    match = re.match(r"\s*(\d+)\.", version)
    return int(match.group(1)) if match else None


def _as_int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
        return int(value)
    return None


def check_delivery_limit(
    *,
    queue: str,
    arguments: Mapping[str, Any] | None,
    max_retries: int,
    broker_major: int | None = None,
) -> DeliveryLimitRisk | None:
    """The risk a queue's delivery limit poses to retried messages, or ``None`` if there is none.

    ``arguments`` are the queue's ``x-*`` arguments as declared (``None`` when
    unknown, e.g. after a passive declare; a ``delivery-limit`` policy cannot be
    seen from a client either). ``broker_major`` is the broker's major version,
    which decides whether the default limit of 20 applies. A limit is a risk
    when it is finite and leaves fewer than :data:`SAFE_REDELIVERIES` redeliveries
    beyond ``max_retries``.
    """
    args: Mapping[str, Any] = arguments if isinstance(arguments, Mapping) else {}
    if args.get("x-queue-type") != "quorum":
        return None
    dlx = args.get("x-dead-letter-exchange")
    dead_letter_exchange = dlx if isinstance(dlx, str) and dlx else None
    raw = args.get("x-delivery-limit")
    limit = _as_int(raw)
    from_default = False
    if raw is None:
        if broker_major is None or broker_major < 4:
            return None
        limit, from_default = BROKER_DEFAULT_DELIVERY_LIMIT, True
    if limit is None or limit < 0:
        return None
    if limit >= max_retries + SAFE_REDELIVERIES:
        return None
    where = (
        f"dead-letters them to exchange {dead_letter_exchange!r} instead of parking them"
        if dead_letter_exchange
        else "drops them without a trace"
    )
    origin = (
        f"RabbitMQ {broker_major}.x gives quorum queues a default delivery limit of {limit}"
        if from_default
        else f"it is declared with x-delivery-limit={limit}"
    )
    message = (
        f"quorum queue {queue!r} has a delivery limit of {limit} ({origin}): a message "
        f"redelivered more than {limit} times, after consumer crashes, lost connections or "
        f"hand-overs into the delay chain that were not confirmed, is removed by the broker, "
        f"which {where}. Delayed retries do not count toward it (each one is a new message), "
        f"but with max_retries={max_retries} the limit leaves little room for redeliveries. "
        f"Fix: declare the queue with x-delivery-limit of at least "
        f"{max_retries + SAFE_REDELIVERIES} (or -1 on RabbitMQ 4.0+ to turn it off) and a "
        "dead-letter exchange"
    )
    return DeliveryLimitRisk(
        queue=queue,
        limit=limit,
        from_broker_default=from_default,
        dead_letter_exchange=dead_letter_exchange,
        message=message,
    )


def warn_about_delivery_limit(
    *,
    queue: str,
    arguments: Mapping[str, Any] | None,
    max_retries: int,
    server_properties: Mapping[str, Any] | None = None,
) -> DeliveryLimitRisk | None:
    """Log a warning when :func:`check_delivery_limit` finds a risk; return the risk."""
    risk = check_delivery_limit(
        queue=queue,
        arguments=arguments,
        max_retries=max_retries,
        broker_major=broker_major_version(server_properties),
    )
    if risk is not None:
        log.warning("%s", risk.message)
    return risk
