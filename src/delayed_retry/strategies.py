"""Which of tenacity's strategies mean here what they mean in tenacity. Pure.

tenacity retries a function call, delayed-retry a message: the handler's
failures are retried, its return values never are. Strategies that only make
sense for return values are refused when a handler is decorated, with a
message saying what to do instead, rather than found out at the first failure
(where they would park every message as ``not-retryable``). The remaining
differences are listed in ``docs/tenacity.md``.
"""

from __future__ import annotations

from collections.abc import Iterator

import tenacity
from tenacity.retry import retry_base

from delayed_retry.errors import ConfigurationError

__all__ = ["RESULT_PREDICATES", "refuse_result_predicates"]

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
