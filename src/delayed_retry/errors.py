"""One exception hierarchy for delayed-retry.

Two kinds live here. Errors the library raises to the caller
(:class:`ConfigurationError`, :class:`DelayOutOfRangeError`,
:class:`NotFoundError`, :class:`TopologyMismatchError`, :class:`PublishError`)
all derive from :class:`DelayedRetryError`. Control-flow signals a *handler* raises to steer
what happens to the message it got (:class:`RetryAfter`, :class:`ParkMessage`)
derive from :class:`HandlerSignal`.
"""

from __future__ import annotations

from datetime import timedelta

__all__ = [
    "AccessRefusedError",
    "ConfigurationError",
    "DelayOutOfRangeError",
    "DelayedRetryError",
    "HandlerCancelledError",
    "HandlerSignal",
    "MessageCrashedError",
    "NotFoundError",
    "ParkMessage",
    "PublishError",
    "PublishNotConfirmedError",
    "PublishTimeoutError",
    "ReadsCountedError",
    "RetryAfter",
    "ServiceUnavailableError",
    "TopologyMismatchError",
    "parking_queue_not_found",
    "queue_not_found",
]


class DelayedRetryError(Exception):
    """Base class of every error delayed-retry raises."""


class ConfigurationError(DelayedRetryError, ValueError):
    """An option or argument is invalid; raised at start-up, not at the first failure."""


class DelayOutOfRangeError(ConfigurationError):
    """A delay is negative, not a number, or longer than the delay chain can hold."""


class NotFoundError(ConfigurationError):
    """A queue, exchange, file or other object the caller named does not exist.

    The name is well formed but nothing by that name is there (in this vhost,
    or at this path): the message names the object, says to check the name and
    how the object comes to exist. Word missing queues with
    :func:`queue_not_found` and :func:`parking_queue_not_found`, so every
    command says it the same way. It is a :class:`ConfigurationError` for code
    that catches those; the command line exits 1 for it (the broker is not as
    the command needs), not 2 (the command line itself is wrong).
    """


def queue_not_found(name: str, *, so: str = "") -> str:
    """The words for a missing work queue ``name`` (one that consumers read).

    ``so`` says what cannot be done without it (``"nothing can be scheduled
    for it"``). Its consumer creates such a queue, or ``declare --create``.
    """
    consequence = f", so {so}" if so else ""
    return (
        f"queue {name!r} does not exist in this vhost{consequence}; check the name and the "
        "vhost in the URL, or create it: its consumer declares it, or run "
        f"'delayed-retry declare --create --bind {name}' with the chain's options"
    )


def parking_queue_not_found(name: str) -> str:
    """The words for a missing parking queue ``name`` (``<queue>.parking`` by default).

    A parking queue is created when its work queue is bound to the chain, so
    the fix names that queue when the name shows it.
    """
    queue = name.removesuffix(".parking") if name.endswith(".parking") else "QUEUE"
    return (
        f"parking queue {name!r} does not exist in this vhost; check the queue name "
        "(--queue, --parking-queue) and the vhost in the URL. A queue's parking queue is "
        "created when the queue is bound to the chain: by its consumer, or by "
        f"'delayed-retry declare --bind {queue}' with the chain's options"
    )


class AccessRefusedError(ConfigurationError):
    """The broker refused the user an operation (``ACCESS_REFUSED``): a permission is missing.

    The message names what was refused and the permission to grant. It is a
    :class:`ConfigurationError` for code that catches those; the command line
    exits 1 for it (the broker is not as the command needs; the command is right).
    """


class ServiceUnavailableError(ConfigurationError):
    """A service the caller configured the library to rely on does not answer.

    Raised at start-up when, say, the web view must find its parking queues through the
    management API and the API cannot be read: the message names the address and the fix.
    It is a :class:`ConfigurationError` for code that catches those; the command line exits
    1 for it (the broker is not as the command needs; the command is right).
    """


class TopologyMismatchError(DelayedRetryError):
    """An exchange or queue exists on the broker with arguments other than the topology's.

    delayed-retry never deletes or re-declares anything by itself: the message
    names the object and the difference so an operator can decide.
    """


class ReadsCountedError(DelayedRetryError):
    """Reading a queue further could bring a message to the broker's delivery limit.

    RabbitMQ 4.x quorum queues count returns toward a delivery limit (20 unless
    set), past which the message is dead-lettered or dropped: an operation that
    reads and gives back stops before that, and says which message and queue.
    """


class PublishError(DelayedRetryError):
    """A publish was not confirmed by the broker; the message was not handed over."""


class PublishNotConfirmedError(PublishError):
    """The broker answered a publish with a nack, or returned it as unroutable."""


class PublishTimeoutError(PublishError):
    """No publisher confirm arrived in time. The publish may or may not have landed."""


class MessageCrashedError(DelayedRetryError):
    """A message's handling ended with its consumer gone (the process died or lost its
    connection) too many times: the crash guard parked it, reason ``crashed``."""


class HandlerCancelledError(DelayedRetryError):
    """A handler raised ``CancelledError`` although its task was not being cancelled.

    Recorded as the failure that is retried or parked, like any other: a handler's
    stray cancellation must not pass for a shutdown.
    """


class HandlerSignal(Exception):
    """Base of the exceptions a handler raises to choose its message's fate."""


class RetryAfter(HandlerSignal):
    """Raise from a handler to retry the message after exactly ``delay``.

    Use it when the failure says how long to wait, such as an HTTP 429 with a
    ``Retry-After`` header. It still counts as a retry: past ``max_retries`` the
    message is parked.
    """

    def __init__(self, delay: float | timedelta, reason: str = "") -> None:
        super().__init__(reason or f"retry requested after {delay}")
        self.delay = delay
        self.reason = reason


class ParkMessage(HandlerSignal):
    """Raise from a handler to park the message now, without further retries.

    Use it for failures no retry can fix: a message that fails validation, a
    reference to an entity that does not exist.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
