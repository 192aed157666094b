"""A retrying handler's settings: :class:`RetryOptions`, and :func:`retry_options`, which checks
the options a front end was given and builds them.

The options themselves (names, types, defaults, help) are defined once in
:mod:`delayed_retry.consumer.options`; this module turns them into the settings a
:class:`~delayed_retry.consumer.handler.RetryingHandler` runs with, refusing a bad
one when the front end is configured, not at the first failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.consumer.handover import DEFAULT_TIMING, HandOverTiming, RequeueBackoff
from delayed_retry.consumer.hooks import FailureHooks
from delayed_retry.consumer.immediate import Pauses
from delayed_retry.consumer.options import ReturnTo, SubscriberOptions, with_defaults
from delayed_retry.consumer.until_due import HeldUntilDue
from delayed_retry.crashes import CrashGuard
from delayed_retry.durations import to_seconds
from delayed_retry.errors import ConfigurationError
from delayed_retry.hold import Hold, check_hold
from delayed_retry.immediate import ImmediateRetries
from delayed_retry.observability.instrumentation import Instrumentation
from delayed_retry.observability.otel import default_instrumentation
from delayed_retry.policy import RetryPolicy
from delayed_retry.throttle import Throttle
from delayed_retry.topology import DelayTopology

__all__ = ["RetryOptions", "retry_options"]


@dataclass(frozen=True, kw_only=True)
class RetryOptions:
    """Everything a :class:`~delayed_retry.consumer.handler.RetryingHandler` is configured with.

    Built by :func:`retry_options` from a front end's checked options; a front end
    with its own needs (FastStream's acking) changes fields with ``dataclasses.replace``.
    """

    queue: str | None
    policy: RetryPolicy
    topology: DelayTopology
    parking_queue: str | None
    publish_timeout: float
    instrumentation: Instrumentation
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
    arguments say so (:func:`~delayed_retry.work_queues.work_queue_arguments`): declared with
    the queue's binding, so the broker has somewhere to put what no consumer could take."""
    throttle: Throttle | None = None
    """When to stop taking messages after a run of failures, and how to probe (``None``: never)."""
    crash_guard: CrashGuard | None = None
    """How many times a message may take its consumer down before it is parked (``None``: off)."""
    timing: HandOverTiming = DEFAULT_TIMING
    """How long an unconfirmed hand-over is tried and how long a message is kept before it
    is requeued: the defaults, unless a consumer must give up sooner."""


def retry_options(
    given: Mapping[str, object], *, accepted: type[SubscriberOptions], caller: str
) -> RetryOptions:
    """Check the options a front end was ``given`` and build its :class:`RetryOptions`.

    Every front end that retries a consumer's failures (the decorator with
    :class:`~delayed_retry.consumer.options.HandlerOptions`, the FastStream
    middleware with :class:`~delayed_retry.consumer.options.SubscriberOptions`)
    checks its options here, once when it is configured, so a bad option fails
    the same way, with the same message;
    ``caller`` names the front end in the error for an unknown option.
    """
    o = with_defaults(accepted, given, caller=caller)
    queue: str | None = o.get("queue")
    topology = o["topology"]
    return_to = o["return_to"]
    parking_queue = o["parking_queue"]
    instrumentation = o["instrumentation"]
    hold = o["hold"]
    throttle, crash_guard = o["throttle"], o["crash_guard"]
    if return_to not in ("queue", "exchange"):
        raise ConfigurationError(
            f"return_to={return_to!r} must be 'queue' (the failing queue) or 'exchange' "
            "(the exchange and routing key the message was delivered with)"
        )
    if not isinstance(topology, DelayTopology):
        raise ConfigurationError(f"topology={topology!r} must be a DelayTopology")
    if queue is not None:
        topology.check_destination(queue)
    if parking_queue is not None and (not parking_queue or parking_queue.startswith("amq.")):
        raise ConfigurationError(f"parking_queue={parking_queue!r} is not a usable queue name")
    if instrumentation is not None and not callable(getattr(instrumentation, "attempt", None)):
        raise ConfigurationError(
            f"instrumentation={instrumentation!r} is not an Instrumentation; pass "
            "delayed_retry.NoInstrumentation() or an object with attempt() and scheduling()"
        )
    check_hold(hold, topology)
    if throttle is not None and not isinstance(throttle, Throttle):
        raise ConfigurationError(
            f"throttle={throttle!r} must be a delayed_retry.Throttle, e.g. "
            "Throttle(consecutive=5, probe_every=1.0), or None"
        )
    if crash_guard is not None and not isinstance(crash_guard, CrashGuard):
        raise ConfigurationError(
            f"crash_guard={crash_guard!r} must be a delayed_retry.CrashGuard, e.g. "
            "CrashGuard(max_crashes=3), or None"
        )
    immediate = ImmediateRetries(times=o["immediate_retries"], wait=o["immediate_wait"])
    hooks = FailureHooks(on_retry=o["on_retry"], on_park=o["on_park"])
    policy_kwargs: dict[str, Any] = {
        "max_retries": o["max_retries"],
        "wait": o["wait"],
        "stop": o["stop"],
    }
    if o["retry"] is not None:
        policy_kwargs["retry"] = o["retry"]
    return RetryOptions(
        queue=queue,
        policy=RetryPolicy(**policy_kwargs),
        topology=topology,
        parking_queue=parking_queue,
        publish_timeout=to_seconds(o["publish_timeout"], name="publish_timeout")
        or DEFAULT_PUBLISH_TIMEOUT,
        instrumentation=instrumentation or default_instrumentation(),
        return_to=return_to,
        hold=hold,
        immediate=immediate if immediate.times else None,
        hooks=hooks if hooks.any else None,
        throttle=throttle,
        crash_guard=crash_guard,
    )
