"""Delivery limits: whether a queue's limit can remove messages before the retry policy parks
them, and what to do about it. Pure functions, used as start-up checks of the queues a
retrying consumer reads.

Use :func:`check_delivery_limit` on a consumed queue's declared arguments and
:func:`kept_queue_risk` on a parking or unroutable queue that exists without
:data:`~delayed_retry.chain.topology.DELIVERY_LIMIT`. What counts toward a limit on each RabbitMQ
version, and why :data:`SAFE_DELIVERY_LIMIT`: docs/reliability.md, "Delivery limits".
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delayed_retry.rabbitmq.versions import broker_major_version
from delayed_retry.rabbitmq.work_queues import (
    WORK_QUEUE_DELIVERY_LIMIT,
    dead_letter_target,
    work_queue_policy_command,
)

__all__ = [
    "BROKER_DEFAULT_DELIVERY_LIMIT",
    "SAFE_DELIVERY_LIMIT",
    "DeliveryLimitRisk",
    "check_delivery_limit",
    "kept_classic_queue_risk",
    "kept_queue_risk",
    "undecodable_risk",
    "warn_about_delivery_limit",
]

log = logging.getLogger(__name__)

BROKER_DEFAULT_DELIVERY_LIMIT = 20
"""The delivery limit RabbitMQ 4.0+ applies to quorum queues that set none."""

SAFE_DELIVERY_LIMIT = 100
"""The smallest delivery limit not reported: about 50 minutes of failed hand-overs
(one give-back per 30 s) plus crashes, per message."""


@dataclass(frozen=True, kw_only=True)
class DeliveryLimitRisk:
    """A delivery limit that may remove messages before the retry policy parks them."""

    queue: str
    limit: int
    from_broker_default: bool
    dead_letter_exchange: str | None
    message: str


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
    max_retries: int | None = None,
    broker_major: int | None = None,
) -> DeliveryLimitRisk | None:
    """The risk a queue's delivery limit poses to retried messages, or ``None`` if there is none.

    ``arguments`` are the queue's ``x-*`` arguments as declared (``None`` when
    unknown, e.g. after a passive declare; a ``delivery-limit`` policy cannot be
    seen from a client either). ``broker_major`` is the broker's major version,
    which decides whether the default limit of 20 applies. A limit is a risk
    when it is finite and below :data:`SAFE_DELIVERY_LIMIT`. ``max_retries``
    is accepted for the message only: delayed retries never count toward it.
    """
    args: Mapping[str, Any] = arguments if isinstance(arguments, Mapping) else {}
    if args.get("x-queue-type") != "quorum":
        return None
    if dead_letter_target(args) is not None:
        # work_queue_arguments: what passes the limit is kept in a dead-letter queue with
        # the broker's record, by design (the defence against undecodable messages).
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
    if limit >= SAFE_DELIVERY_LIMIT:
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
    retries = f" (with max_retries={max_retries})" if max_retries is not None else ""
    message = (
        f"quorum queue {queue!r} has a delivery limit of {limit} ({origin}): a message "
        f"returned to it more than {limit} times is removed by the broker, which {where}. "
        f"Delayed retries{retries} never count toward it (each one is a new message); "
        "what counts is every hand-over into the delay chain that stays unconfirmed for "
        "30 s (the message is nacked back: one delivery per 30 s of broker trouble), every "
        "consumer crash or lost connection, and every message given back after an internal "
        f"error. Fix: declare the queue with x-delivery-limit of at least {SAFE_DELIVERY_LIMIT} "
        "(or -1 on RabbitMQ 4.0+ only, where it turns the limit off; 3.10 reads -1 as 'drop "
        "at the first return') and a dead-letter exchange"
    )
    return DeliveryLimitRisk(
        queue=queue,
        limit=limit,
        from_broker_default=from_default,
        dead_letter_exchange=dead_letter_exchange,
        message=message,
    )


def kept_queue_risk(*, queue: str, broker_major: int | None) -> str:
    """Why a queue delayed-retry keeps or consumes, declared without a delivery limit, may lose
    messages.

    Used when such a queue exists from before delayed-retry set
    ``x-delivery-limit`` on it (the broker refuses to change a queue's
    arguments). Returns the warning to log, naming the queue and the fix.
    """
    from delayed_retry.chain.topology import DELIVERY_LIMIT

    if broker_major is not None and broker_major >= 4:
        danger = (
            f"RabbitMQ {broker_major}.x gives it a delivery limit of "
            f"{BROKER_DEFAULT_DELIVERY_LIMIT}, and every peek (basic.get returned unacked) "
            "counts: a message kept there is dropped after about 20 peeks"
        )
    else:
        danger = (
            "RabbitMQ 3.x sets no limit, but 4.0-4.2 apply one of 20 that every peek counts "
            "toward, so upgrading the broker would put kept messages at risk"
        )
    return (
        f"queue {queue!r} exists with other x-delivery-limit arguments than delayed-retry "
        f"declares ({DELIVERY_LIMIT}); {danger}. Fix: move its messages elsewhere "
        f"(shovel or replay), delete {queue!r} and let the next consumer declare it again, "
        f"or set a policy with delivery-limit {DELIVERY_LIMIT} on it"
    )


def kept_classic_queue_risk(*, queue: str) -> str:
    """Why a classic queue where delayed-retry declares a quorum one is a risk, and the fix.

    Used when a parking, unroutable, rejected, forward or inbox queue exists as
    a classic queue (made by hand, by another tool, or by a chain of the same
    prefix declared with ``queue_type="classic"``).
    RabbitMQ 3.x accepts the quorum declaration and keeps the classic queue;
    4.3 refuses it. Either way the queue is used as it is.
    """
    return (
        f"queue {queue!r} exists as a classic queue, where delayed-retry declares a quorum "
        "queue (replicated, and with a delivery limit no return can reach); it is used as it "
        "is, but its messages live on one node only. Fix: move its messages elsewhere "
        f"(replay or shovel), delete {queue!r} and let the next consumer declare it again"
    )


def warn_about_delivery_limit(
    *,
    queue: str,
    arguments: Mapping[str, Any] | None,
    max_retries: int | None = None,
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


def _setting(
    arguments: Mapping[str, Any], policy: Mapping[str, Any], key: str
) -> tuple[object, object]:
    """(argument ``x-<key>``, policy ``<key>``) of a queue, either ``None`` when unset."""
    return arguments.get(f"x-{key}"), policy.get(key)


def undecodable_risk(
    *,
    queue: str,
    queue_type: str | None,
    arguments: Mapping[str, Any] | None,
    policy: Mapping[str, Any] | None,
    broker_major: int | None = None,
) -> str | None:
    """Why a message the AMQP client cannot decode would stall ``queue``, or ``None``.

    Such a message (docs/reliability.md lists them) drops the consumer's
    connection at each delivery, before any consumer code sees it; only the
    broker can move it aside: a quorum queue's delivery limit with a
    dead-letter target (:func:`~delayed_retry.rabbitmq.work_queues.work_queue_arguments`).
    ``queue_type``, ``arguments`` and ``policy`` (the effective policy
    definition) are what the management API reports of the queue. Returns the
    warning to show, naming the queue, what happens and the fix.
    """
    args: Mapping[str, Any] = arguments if isinstance(arguments, Mapping) else {}
    pol: Mapping[str, Any] = policy if isinstance(policy, Mapping) else {}
    kind = queue_type or args.get("x-queue-type") or "classic"
    stall = (
        "a message the AMQP client cannot decode (a timestamp past the year 9999, text that "
        "is not UTF-8 where AMQP wants it) drops the consumer's connection at every delivery "
        "and is delivered again first"
    )
    if kind != "quorum":
        return (
            f"queue {queue!r} is a {kind} queue, which has no delivery limit: {stall}, for ever, "
            "so nothing behind it is handled. Fix: consume a quorum queue declared with "
            f"work_queue_arguments({queue!r}) (delayed-retry declare --bind NEW_QUEUE --create), "
            "and move the traffic to it"
        )
    fix = f"Fix: {work_queue_policy_command(queue)}"
    arg_limit, pol_limit = _setting(args, pol, "delivery-limit")
    limits = [v for v in (_as_int(arg_limit), _as_int(pol_limit)) if v is not None and v >= 0]
    if not limits:
        if broker_major is not None and broker_major >= 4:
            limit_text = f"RabbitMQ {broker_major}.x's default delivery limit of 20"
            limit = BROKER_DEFAULT_DELIVERY_LIMIT
        else:
            return (
                f"quorum queue {queue!r} has no delivery limit: {stall}, for ever on RabbitMQ "
                f"3.x, so nothing behind it is handled (4.0+ drop it after 20). {fix}"
            )
    else:
        # The broker applies the lower of argument and policy.
        limit = min(limits)
        limit_text = f"its delivery limit of {limit}"
    arg_dlx, pol_dlx = _setting(args, pol, "dead-letter-exchange")
    dlx = arg_dlx if arg_dlx is not None else pol_dlx
    if not isinstance(dlx, str):
        return (
            f"quorum queue {queue!r} has no dead-letter exchange: {stall}, until "
            f"{limit_text} drops it without a trace (and so any message returned that often). "
            f"{fix}"
        )
    if limit > SAFE_DELIVERY_LIMIT:
        return (
            f"quorum queue {queue!r} dead-letters only past {limit_text}: {stall}, and holds up "
            f"everything behind it for {limit} reconnects (5 s each by aio-pika's default) "
            f"before the broker moves it aside. Fix: a limit of about "
            f"{WORK_QUEUE_DELIVERY_LIMIT}: {work_queue_policy_command(queue)}"
        )
    return None
