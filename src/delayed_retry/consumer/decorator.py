"""``@with_delayed_retry``: retries for aio-pika consumers, through the delay chain.

The decorator checks its options when it decorates and wraps the handler in a
:class:`~delayed_retry.consumer.handler.RetryingHandler`, which runs each
delivery; :func:`~delayed_retry.consumer.consume.consume` starts consuming a
queue with it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import ParamSpec, Unpack, overload

from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.consumer.options import HandlerOptions
from delayed_retry.consumer.settings import retry_options
from delayed_retry.errors import ConfigurationError

__all__ = ["with_delayed_retry"]

P = ParamSpec("P")


@overload
def with_delayed_retry(fn: Callable[P, Awaitable[object]], /) -> RetryingHandler[P]: ...


@overload
def with_delayed_retry(
    **options: Unpack[HandlerOptions],
) -> Callable[[Callable[P, Awaitable[object]]], RetryingHandler[P]]: ...


def with_delayed_retry(
    fn: Callable[P, Awaitable[object]] | None = None,
    /,
    **options: Unpack[HandlerOptions],
) -> RetryingHandler[P] | Callable[[Callable[P, Awaitable[object]]], RetryingHandler[P]]:
    """Wrap an aio-pika consumer handler with delayed retries and parking.

    Use it on any handler that may fail for reasons that pass: it acks on
    success, and on failure sends the message through the delay chain back to
    ``queue`` after the backoff, or parks it once retries are spent. Works with and
    without parentheses. Its options (:class:`~delayed_retry.consumer.options.HandlerOptions`)
    are keyword-only and checked when decorating: an unknown name is a ``TypeError``,
    a bad value a :class:`~delayed_retry.ConfigurationError`.
    """
    settings = retry_options(options, accepted=HandlerOptions, caller="with_delayed_retry()")

    def decorate(func: Callable[P, Awaitable[object]]) -> RetryingHandler[P]:
        if not (
            inspect.iscoroutinefunction(func)
            or inspect.iscoroutinefunction(getattr(func, "__call__", None))  # noqa: B004
        ):
            raise ConfigurationError(
                f"@with_delayed_retry needs an async function (async def), got {func!r}; "
                "aio-pika awaits the consumer callback"
            )
        return RetryingHandler(func, settings)

    return decorate(fn) if fn is not None else decorate
