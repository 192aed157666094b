"""The retry options, each written once: its name, type (the annotation), default and help
(the :class:`Option` in it).

:func:`~delayed_retry.with_delayed_retry` takes :class:`HandlerOptions`, FastStream's
``DelayedRetry`` :class:`SubscriberOptions`, :class:`~delayed_retry.RetryRouter` and the
``router`` command :class:`RouterOptions`; :mod:`delayed_retry.consumer.settings` turns
them into settings. How to add one: ``docs/development.md``.
"""

import difflib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypedDict, get_args, get_origin, get_type_hints

from aio_pika.abc import AbstractIncomingMessage
from tenacity.retry import retry_base
from tenacity.stop import stop_base
from tenacity.wait import wait_base

from delayed_retry.amqp.publish import DEFAULT_PUBLISH_TIMEOUT
from delayed_retry.chain.topology import DEFAULT_TOPOLOGY, DelayTopology
from delayed_retry.consumer.hooks import FailureHook
from delayed_retry.durations import Duration
from delayed_retry.observability.instrumentation import Instrumentation
from delayed_retry.recovery.crash_guard import CrashGuard
from delayed_retry.recovery.hold import DEFAULT_HOLD, Hold
from delayed_retry.recovery.policy import DEFAULT_MAX_RETRIES, DEFAULT_WAIT
from delayed_retry.recovery.throttle import Throttle

__all__ = [
    "ChainOptions",
    "HandlerOptions",
    "Option",
    "ReturnTo",
    "RouterOptions",
    "SubscriberOptions",
    "option_specs",
    "with_defaults",
]

ReturnTo = Literal["queue", "exchange"]


@dataclass(frozen=True)
class Option:
    """The default and help text of one option, carried in its ``Annotated`` type."""

    default: object
    help: str
    shown: str | None = None
    """The default as the documentation shows it, when its ``repr`` would not say it."""

    @property
    def default_text(self) -> str:
        """The default for a reader: :attr:`shown`, else its ``repr``."""
        return self.shown if self.shown is not None else repr(self.default)


class ChainOptions(TypedDict, total=False):
    """The options of every front end that sends failures through the delay chain."""

    max_retries: Annotated[
        int,
        Option(
            DEFAULT_MAX_RETRIES,
            "delayed retries after the first failure; then the message parks",
        ),
    ]
    wait: Annotated[
        wait_base,
        Option(
            DEFAULT_WAIT,
            "a tenacity wait strategy; the default waits 1 s, 2 s, 4 s … 1 h, plus up to 1 s "
            "of jitter",
            shown="DEFAULT_WAIT",
        ),
    ]
    stop: Annotated[
        stop_base | None,
        Option(
            None,
            "an extra tenacity stop_*; stop_after_delay(86400) parks a message failing for a "
            "day, counted from its first failure across retries and processes",
        ),
    ]
    topology: Annotated[
        DelayTopology,
        Option(
            DEFAULT_TOPOLOGY,
            "the DelayTopology (prefix, levels, unit, queue type)",
            shown="DEFAULT_TOPOLOGY",
        ),
    ]
    publish_timeout: Annotated[
        Duration,
        Option(
            DEFAULT_PUBLISH_TIMEOUT,
            "how long to wait for a publisher confirm (seconds or timedelta)",
        ),
    ]
    instrumentation: Annotated[
        Instrumentation | None,
        Option(
            None,
            "telemetry; None: OpenTelemetry through the global providers, a no-op until an "
            "SDK is configured; NoInstrumentation() turns it off",
        ),
    ]


class SubscriberOptions(ChainOptions, total=False):
    """The options of a consumer's retries: FastStream's ``DelayedRetry`` takes these."""

    retry: Annotated[
        retry_base | type[BaseException] | tuple[type[BaseException], ...] | None,
        Option(
            None,
            "a tenacity retry_if_* choosing which exceptions are retried; the others park at "
            "once. An exception class or a tuple of them means retry_if_exception_type(...) "
            "(None: every Exception)",
        ),
    ]
    parking_queue: Annotated[
        str | None,
        Option(None, "where parked messages go (None: <queue>.parking)"),
    ]
    return_to: Annotated[
        ReturnTo,
        Option(
            "queue",
            "'queue' sends a retry back to the failing queue only; 'exchange' sends it back "
            "to the exchange and routing key it was delivered with, through a forward queue, "
            "so every queue bound there for that key gets it again: choose it only where "
            "that key reaches the failing queue alone, and run a Forwarder for that exchange",
        ),
    ]
    hold: Annotated[
        Hold | None,
        Option(
            DEFAULT_HOLD,
            "how a retry leaves the chain just before its due time and waits in the handler "
            "for the rest, for a lateness of about a millisecond and fewer broker hops; None "
            "turns it off: the chain rounds every delay up and the handler holds nothing",
            shown="DEFAULT_HOLD",
        ),
    ]
    immediate_retries: Annotated[
        int,
        Option(
            0,
            "runs of the handler again at once, in this process, before a failure counts as "
            "one delayed retry (0..10); for glitches that pass in milliseconds. Exceptions "
            "retry rejects, RetryAfter and ParkMessage are not run again",
        ),
    ]
    immediate_wait: Annotated[
        wait_base | None,
        Option(
            None,
            "a tenacity wait between those runs; the pauses of one delivery are capped at "
            "IMMEDIATE_WAIT_LIMIT (10 s) in all",
        ),
    ]
    on_retry: Annotated[
        FailureHook | None,
        Option(
            None,
            "a plain or async callable told of each retry (a FailureEvent) once it is handed "
            "over; bounded, logged if it fails, never changes the message's fate",
        ),
    ]
    on_park: Annotated[FailureHook | None, Option(None, "the same, for each parking")]
    throttle: Annotated[
        Throttle | None,
        Option(
            None,
            "a Throttle: after a run of failures (a dependency down) the consumer stops taking "
            "messages, puts back those it was sent, and handles one at a time at the probe "
            "interval until one succeeds; None: never",
        ),
    ]
    crash_guard: Annotated[
        CrashGuard | None,
        Option(
            None,
            "a CrashGuard: a message whose consumer went away while handling it max_crashes "
            "times (the process died, or lost its connection) is parked as crashed before its "
            "handler runs again; None: off",
        ),
    ]
    outbox: Annotated[
        bool,
        Option(
            False,
            "hold what the handler publishes through current_outbox() until it returns, then "
            "publish it with confirms before the ack; a failed run's publishes are dropped. "
            "Each gets message_id <incoming id>:outbox:<n> unless it has one: a crash between "
            "those publishes and the ack repeats them with the same ids",
        ),
    ]


class HandlerOptions(SubscriberOptions, total=False):
    """The options of :func:`~delayed_retry.with_delayed_retry`."""

    ordered_by: Annotated[
        Callable[[AbstractIncomingMessage], str | None] | None,
        Option(
            None,
            "a function of the message giving its key: while a message of a key waits in the "
            "chain for a retry, later messages of that key wait behind it and run in order once "
            "it succeeds or parks (docs/ordering.md). The queue must be single-active-consumer "
            "(declare_ordered_queues); None: no order",
        ),
    ]
    ordered_release_after: Annotated[
        Duration,
        Option(
            300.0,
            "with ordered_by: how long past its due time a key waits for a message that does "
            "not come back from the chain (purged or discarded) before its key is released",
        ),
    ]

    queue: Annotated[
        str | None,
        Option(
            None,
            "the queue this handler consumes; retries return there. Leave it out only when "
            "consuming with consume(queue, handler), which sets it",
        ),
    ]


class RouterOptions(ChainOptions, total=False):
    """The options of :class:`~delayed_retry.RetryRouter` besides its queues."""

    prefetch: Annotated[int, Option(32, "rejected messages handled at once")]


@functools.cache
def option_specs(options: type) -> Mapping[str, Option]:
    """Each option of a class above with its :class:`Option`, in the order they are written."""
    specs: dict[str, Option] = {}
    for name, hint in get_type_hints(options, include_extras=True).items():
        found = [m for m in get_args(hint)[1:] if isinstance(m, Option)]
        if get_origin(hint) is not Annotated or len(found) != 1:
            raise TypeError(f"option {options.__name__}.{name} must be Annotated with one Option")
        specs[name] = found[0]
    return specs


def with_defaults(options: type, given: Mapping[str, object], *, caller: str) -> dict[str, Any]:
    """``given`` with the default of every option it leaves out; call it once per front end.

    An unknown name is a ``TypeError`` naming ``caller`` (as Python's own for an
    unexpected keyword), the closest option and every accepted one.
    """
    specs = option_specs(options)
    for name in given:
        if name not in specs:
            close = difflib.get_close_matches(name, specs, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(
                f"{caller} got an unexpected keyword argument {name!r}{hint} "
                f"(its options: {', '.join(specs)})"
            )
    return {name: given.get(name, spec.default) for name, spec in specs.items()}
