"""One exception hierarchy for delayed-retry.

Two kinds live here. Errors the library raises to the caller
(:class:`ConfigurationError`, :class:`DelayOutOfRangeError`,
:class:`TopologyMismatchError`, :class:`PublishError`) all derive from
:class:`DelayedRetryError`. Control-flow signals a *handler* raises to steer
what happens to the message it got (:class:`RetryAfter`, :class:`ParkMessage`)
derive from :class:`HandlerSignal`.
"""

from __future__ import annotations

from datetime import timedelta

__all__ = [
    "ConfigurationError",
    "DelayOutOfRangeError",
    "DelayedRetryError",
    "HandlerSignal",
    "ParkMessage",
    "PublishError",
    "PublishNotConfirmedError",
    "PublishTimeoutError",
    "RetryAfter",
    "TopologyMismatchError",
]


class DelayedRetryError(Exception):
    """Base class of every error delayed-retry raises."""


class ConfigurationError(DelayedRetryError, ValueError):
    """An option or argument is invalid; raised at start-up, not at the first failure."""


class DelayOutOfRangeError(ConfigurationError):
    """A delay is negative, not a number, or longer than the delay chain can hold."""


class TopologyMismatchError(DelayedRetryError):
    """An exchange or queue exists on the broker with arguments other than the topology's.

    delayed-retry never deletes or re-declares anything by itself: the message
    names the object and the difference so an operator can decide.
    """


class PublishError(DelayedRetryError):
    """A publish was not confirmed by the broker; the message was not handed over."""


class PublishNotConfirmedError(PublishError):
    """The broker answered a publish with a nack, or returned it as unroutable."""


class PublishTimeoutError(PublishError):
    """No publisher confirm arrived in time. The publish may or may not have landed."""


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
