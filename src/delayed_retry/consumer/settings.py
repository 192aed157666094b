"""Options into settings, once for every front end: the decorator (and ``consume``), FastStream's
``DelayedRetry`` and :class:`~delayed_retry.RetryRouter`.

The options themselves (names, types, defaults, help) are defined in
:mod:`delayed_retry.consumer.options`. Each front end calls one function here
when it is configured: :func:`retry_options` (a consumer's retries) or
:func:`router_settings`; both check and build what every front end shares in
:func:`chain_settings`, so a bad option fails alike everywhere, before the first message.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.handover import DEFAULT_TIMING, HandOverTiming, RequeueBackoff
from delayed_retry.consumer.hold import HeldUntilDue
from delayed_retry.consumer.hooks import FailureHooks
from delayed_retry.consumer.immediate import Pauses
from delayed_retry.consumer.options import ReturnTo, RouterOptions, SubscriberOptions, with_defaults
from delayed_retry.durations import to_seconds
from delayed_retry.errors import ConfigurationError
from delayed_retry.observability.instrumentation import Instrumentation
from delayed_retry.observability.otel import default_instrumentation
from delayed_retry.recovery.crash_guard import CrashGuard
from delayed_retry.recovery.hold import Hold, check_hold
from delayed_retry.recovery.immediate import ImmediateRetries
from delayed_retry.recovery.policy import DEFAULT_RETRY, RetryPolicy
from delayed_retry.recovery.strategies import retry_strategy
from delayed_retry.recovery.throttle import Throttle

__all__ = [
    "ChainSettings",
    "RetryOptions",
    "RouterSettings",
    "chain_settings",
    "retry_options",
    "router_settings",
]


@dataclass(frozen=True, kw_only=True)
class ChainSettings:
    """What every front end that sends failures through the delay chain runs with."""

    policy: RetryPolicy
    topology: DelayTopology
    publish_timeout: float
    instrumentation: Instrumentation


@dataclass(frozen=True, kw_only=True)
class RetryOptions(ChainSettings):
    """Everything a :class:`~delayed_retry.consumer.handler.RetryingHandler` is configured with.

    Built by :func:`retry_options` from a front end's checked options; a front end
    with its own needs (FastStream's acking) changes fields with ``dataclasses.replace``.
    """

    queue: str | None
    parking_queue: str | None
    requeue_backoff: RequeueBackoff = field(
        default_factory=RequeueBackoff, compare=False, repr=False
    )
    """Messages requeued in a row, unhandled: the pause before the next requeue."""
    return_to: ReturnTo
    hold: Hold | None
    held: HeldUntilDue = field(default_factory=HeldUntilDue, compare=False, repr=False)
    """The messages this handler holds until due right now (shared by its per-queue copies)."""
    ack_on_success: bool = True
    """Whether a handler that returns is acked here. ``False`` leaves that to the caller: a
    framework that acks after publishing the handler's result (FastStream)."""
    immediate: ImmediateRetries | None = None
    """Immediate retries before a failure goes on to the policy; ``None``: none."""
    pauses: Pauses = field(default_factory=Pauses, compare=False, repr=False)
    """The messages this handler is pausing between immediate runs right now."""
    hooks: FailureHooks | None = None
    """``on_retry`` / ``on_park``, called after each confirmed hand-over."""
    dead_letter_queue: str | None = None
    """Where the consumed queue's broker dead-letters past its delivery limit, when its
    arguments say so (:func:`~delayed_retry.rabbitmq.work_queues.work_queue_arguments`): declared
    with the queue's binding, so the broker has somewhere to put what no consumer could take."""
    throttle: Throttle | None = None
    """When to stop taking messages after a run of failures, and how to probe (``None``: never)."""
    crash_guard: CrashGuard | None = None
    """How many times a message may take its consumer down before it is parked (``None``: off)."""
    timing: HandOverTiming = DEFAULT_TIMING
    """How long an unconfirmed hand-over is tried and how long a message is kept before it
    is requeued: the defaults, unless a consumer must give up sooner."""
    outbox: bool
    """Whether the handler's publishes through ``current_outbox()`` are held until it succeeds
    (:mod:`delayed_retry.consumer.outbox`)."""
    ordering: Ordering | None = None
    """Order per key across retries (:mod:`delayed_retry.consumer.ordering`); ``None``: none."""


@dataclass(frozen=True, kw_only=True)
class Ordering:
    """What ``ordered_by=`` runs with: the key of a message, and how long past its due time a
    key waits for a message that does not come back from the chain."""

    ordered_by: Callable[[AbstractIncomingMessage], str | None]
    release_after: float


@dataclass(frozen=True, kw_only=True)
class RouterSettings(ChainSettings):
    """What a :class:`~delayed_retry.RetryRouter` runs with: its queues and its prefetch."""

    queues: tuple[str, ...]
    prefetch: int


S = TypeVar("S", bound=ChainSettings)


def chain_settings(settings: type[S], o: Mapping[str, Any], **own: Any) -> S:
    """Check the options every front end shares and build ``settings`` with them and ``own``.

    ``o`` are a front end's options with their defaults (:func:`with_defaults`); an
    exception class given as ``retry`` means ``retry_if_exception_type`` of it
    (:func:`~delayed_retry.recovery.strategies.retry_strategy`).
    """
    topology, instrumentation = o["topology"], o["instrumentation"]
    if not isinstance(topology, DelayTopology):
        raise ConfigurationError(f"topology={topology!r} must be a DelayTopology")
    if instrumentation is not None and not callable(getattr(instrumentation, "attempt", None)):
        raise ConfigurationError(
            f"instrumentation={instrumentation!r} is not an Instrumentation; pass "
            "delayed_retry.NoInstrumentation() or an object with attempt() and scheduling()"
        )
    retry: Any = DEFAULT_RETRY if o.get("retry") is None else retry_strategy(o["retry"])
    policy = RetryPolicy(max_retries=o["max_retries"], wait=o["wait"], retry=retry, stop=o["stop"])
    timeout = to_seconds(o["publish_timeout"], name="publish_timeout")
    return settings(
        policy=policy,
        topology=topology,
        publish_timeout=timeout or DEFAULT_PUBLISH_TIMEOUT,
        instrumentation=instrumentation or default_instrumentation(),
        **own,
    )


def retry_options(
    given: Mapping[str, object], *, accepted: type[SubscriberOptions], caller: str
) -> RetryOptions:
    """Check the options a consumer's front end was ``given`` and build its :class:`RetryOptions`.

    For the decorator (:class:`~delayed_retry.consumer.options.HandlerOptions`)
    and the FastStream middleware (:class:`~delayed_retry.consumer.options.SubscriberOptions`),
    once when configured; ``caller`` names the front end in the error for an unknown option.
    """
    o = with_defaults(accepted, given, caller=caller)
    queue: str | None = o.get("queue")
    return_to, parking_queue = o["return_to"], o["parking_queue"]
    if return_to not in ("queue", "exchange"):
        raise ConfigurationError(
            f"return_to={return_to!r} must be 'queue' (the failing queue) or 'exchange' "
            "(the exchange and routing key the message was delivered with)"
        )
    if parking_queue is not None and (not parking_queue or parking_queue.startswith("amq.")):
        raise ConfigurationError(f"parking_queue={parking_queue!r} is not a usable queue name")
    _check_instance("throttle", o["throttle"], Throttle, "Throttle(consecutive=5, probe_every=1.0)")
    _check_instance("crash_guard", o["crash_guard"], CrashGuard, "CrashGuard(max_crashes=3)")
    if not isinstance(o["outbox"], bool):
        raise ConfigurationError(f"outbox={o['outbox']!r} must be True or False")
    immediate = ImmediateRetries(times=o["immediate_retries"], wait=o["immediate_wait"])
    hooks = FailureHooks(on_retry=o["on_retry"], on_park=o["on_park"])
    settings = chain_settings(
        RetryOptions,
        o,
        queue=queue,
        parking_queue=parking_queue,
        return_to=return_to,
        hold=o["hold"],
        immediate=immediate if immediate.times else None,
        hooks=hooks if hooks.any else None,
        throttle=o["throttle"],
        crash_guard=o["crash_guard"],
        outbox=o["outbox"],
        ordering=_ordering(o),
    )
    if queue is not None:
        settings.topology.check_destination(queue)
    check_hold(settings.hold, settings.topology)
    return settings


def router_settings(
    queues: Iterable[str], given: Mapping[str, object], *, caller: str
) -> RouterSettings:
    """Check the ``queues`` and options a :class:`~delayed_retry.RetryRouter` was given and
    build its :class:`RouterSettings`; ``caller`` names it in the error for an unknown option."""
    o = with_defaults(RouterOptions, given, caller=caller)
    if isinstance(queues, str):
        raise ConfigurationError(f"queues={queues!r} must be a list of queue names, not one string")
    names = tuple(dict.fromkeys(queues))
    if not names:
        raise ConfigurationError(
            "RetryRouter needs at least one queue (queues=[...] or --queue Q): it only "
            "ever sends messages to the queues it was started with"
        )
    prefetch = o["prefetch"]
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
        raise ConfigurationError(f"prefetch={prefetch!r} must be a positive int")
    settings = chain_settings(RouterSettings, o, queues=names, prefetch=prefetch)
    for name in names:
        settings.topology.check_destination(name)
    return settings


def _check_instance(name: str, value: object, kind: type, example: str) -> None:
    """Refuse an option that must be ``kind`` or ``None``, showing ``example``."""
    if value is not None and not isinstance(value, kind):
        raise ConfigurationError(
            f"{name}={value!r} must be a delayed_retry.{kind.__name__}, e.g. {example}, or None"
        )


def _ordering(o: Mapping[str, Any]) -> Ordering | None:
    """The :class:`Ordering` of ``ordered_by=``, checked; ``None`` without it."""
    ordered_by = o.get("ordered_by")
    if ordered_by is None:
        return None
    if not callable(ordered_by):
        raise ConfigurationError(
            f"ordered_by={ordered_by!r} must be a function of the message returning its key "
            "(a str), e.g. ordered_by=lambda m: m.headers['customer']"
        )
    release_after = to_seconds(o["ordered_release_after"], name="ordered_release_after")
    if not release_after or release_after < 1:
        raise ConfigurationError(
            f"ordered_release_after={release_after!r} must be at least 1 second: it is how long "
            "past its due time a key waits for a message that does not come back"
        )
    _refuse_reordering(o)
    return Ordering(ordered_by=ordered_by, release_after=release_after)


def _refuse_reordering(o: Mapping[str, Any]) -> None:
    """Refuse ``ordered_by`` with an option that puts messages out of their key's order."""
    reorders = {
        "throttle": "puts messages back at the tail of the queue, behind later ones",
        "crash_guard": "puts a message held while stopping back at the tail of the queue",
    }
    for name, why in reorders.items():
        if o.get(name) is not None:
            raise ConfigurationError(
                f"ordered_by= cannot be combined with {name}=: it {why}, out of its key's "
                f"order; drop one of them"
            )
    if o["return_to"] != "queue":
        raise ConfigurationError(
            "ordered_by= needs return_to='queue': a retry must come back to the queue whose "
            "consumer keeps its key waiting"
        )
