"""The retry state of the message being handled, for FastStream's dependency injection."""

from __future__ import annotations

from typing import Annotated

from faststream import Depends

from delayed_retry.consumer.retry_state import current_retry_state
from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.retry_state import RetryState

__all__ = ["CurrentRetryState", "retry_state_dependency"]


async def retry_state_dependency() -> RetryState:
    """The retry state of the message this handler is handling (attempt, first failure …).

    Async, so that it runs in the handler's own task, where the middleware set it.
    """
    state = current_retry_state()
    if state is None:
        raise ConfigurationError(
            "CurrentRetryState was asked for outside a DelayedRetry middleware; add "
            "DelayedRetry(...) to the middlewares of the broker or router of this subscriber"
        )
    return state


CurrentRetryState = Annotated[RetryState, Depends(retry_state_dependency, cast=False)]
"""A handler parameter annotated with this gets the message's
:class:`~delayed_retry.RetryState`: ``async def handle(body: str, state: CurrentRetryState)``."""
