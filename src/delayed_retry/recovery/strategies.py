"""Which of tenacity's strategies mean here what they mean in tenacity. Pure.

A handler's failures are retried, never its return values: result predicates
are refused when a handler is decorated, with what to do instead. An exception
class given as ``retry`` means ``retry_if_exception_type`` (:func:`retry_strategy`).
The other differences are listed in ``docs/tenacity.md``.
"""

from __future__ import annotations

from collections.abc import Iterator

import tenacity
from tenacity.retry import retry_base

from delayed_retry.errors import ConfigurationError

__all__ = [
    "RESULT_PREDICATES",
    "refuse_exception_classes",
    "refuse_result_predicates",
    "retry_strategy",
]

RESULT_PREDICATES: tuple[type[retry_base], ...] = (
    tenacity.retry_if_result,
    tenacity.retry_if_not_result,
)
"""tenacity ``retry`` strategies that look at a returned value, never at an exception."""


def _leaves(retry: object) -> Iterator[object]:
    """``retry`` and every strategy combined into it with ``|`` and ``&``."""
    yield retry
    if isinstance(retry, tenacity.retry_any | tenacity.retry_all):
        for inner in retry.retries:
            yield from _leaves(inner)


def refuse_result_predicates(retry: object) -> None:
    """Raise :class:`ConfigurationError` if ``retry`` is, or combines, a result predicate.

    A message is retried only when its handler raises; what a handler returns
    is passed on (FastStream publishes it) or dropped, and never reaches
    ``retry``. With ``retry_if_result`` every failure would look "not
    retryable" and park at once.
    """
    for leaf in _leaves(retry):
        if isinstance(leaf, RESULT_PREDICATES):
            raise ConfigurationError(
                f"retry={retry!r} uses {type(leaf).__name__}, which looks at the handler's "
                "return value, but a message is retried only when its handler raises (a "
                "return value is the handler's answer, never a failure); raise an exception "
                "(or RetryAfter) when the result means 'try again' and choose it with "
                "retry_if_exception_type or retry_if_exception"
            )


def _exception_classes(retry: object) -> tuple[type[BaseException], ...] | None:
    """The exception classes ``retry`` names (one class or a tuple of them), or ``None``.

    A tuple that holds anything else, or nothing, is refused: it names no exceptions.
    """
    if isinstance(retry, type) and issubclass(retry, BaseException):
        return (retry,)
    if not isinstance(retry, tuple):
        return None
    if retry and all(isinstance(c, type) and issubclass(c, BaseException) for c in retry):
        return retry
    raise ConfigurationError(
        f"retry={retry!r} is a tuple but not of exception classes; pass the exceptions to "
        "retry, e.g. retry=(ConnectionError, TimeoutError), or a tenacity retry_if_* strategy"
    )


def retry_strategy(retry: object) -> object:
    """The tenacity ``retry`` strategy an option's ``retry=`` value means.

    An exception class or a tuple of them means ``retry_if_exception_type`` of
    them, as a tenacity user expects; anything else is passed on as given, for
    :class:`~delayed_retry.RetryPolicy` to check. Every front end's options go
    through it (:func:`~delayed_retry.consumer.settings.chain_settings`).
    """
    classes = _exception_classes(retry)
    if classes is None:
        return retry
    return tenacity.retry_if_exception_type(classes[0] if len(classes) == 1 else classes)


def refuse_exception_classes(retry: object) -> None:
    """Raise :class:`ConfigurationError` if ``retry`` is an exception class or a tuple of them.

    For :class:`~delayed_retry.RetryPolicy`, which takes tenacity strategies only:
    a class is callable, so it would pass for one and retry every exception.
    """
    classes = _exception_classes(retry)
    if classes is not None:
        names = ", ".join(c.__name__ for c in classes)
        raise ConfigurationError(
            f"retry={retry!r} names exception classes, not a tenacity strategy; use "
            f"tenacity.retry_if_exception_type({names if len(classes) == 1 else f'({names})'}) "
            "(the options of with_delayed_retry and DelayedRetry take the classes as they are)"
        )
