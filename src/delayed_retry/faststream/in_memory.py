"""``DelayedRetry`` under FastStream's in-memory ``TestRabbitBroker``: the policy, no chain.

The test client calls handlers without a broker, so there is no chain to send
a retry through and no parking queue. What a handler test needs is the
decision: would this failure be retried (after how long) or parked (why)?
The middleware runs the handler with its retry state readable as usual,
asks the same :class:`~delayed_retry.recovery.policy.RetryPolicy`, records the
:class:`InMemoryDecision` on the middleware and, as with a real broker, does
not raise the failure to FastStream. A later attempt is tested by publishing
with the retry headers it would carry (``x-retry``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from faststream.exceptions import HandlerException
from faststream.rabbit.testing import PatchedMessage

from delayed_retry.consumer.retry_state import retry_state, retry_state_scope
from delayed_retry.durations import utcnow
from delayed_retry.recovery.immediate import ImmediateRetries
from delayed_retry.recovery.policy import RetryPolicy

if TYPE_CHECKING:
    from faststream import StreamMessage
    from faststream._internal.basic_types import AsyncFuncAny

__all__ = ["InMemoryDecision", "is_in_memory", "run_in_memory"]


@dataclass(frozen=True, kw_only=True)
class InMemoryDecision:
    """What the retry policy decided for one failure under the in-memory test client."""

    queue: str
    attempt: int
    action: Literal["retry", "park"]
    delay: float
    """Seconds before the retry (0 for a park)."""
    reason: str | None
    """Why it would be parked (``max-retries``, ``not-retryable``, ``park-requested`` …)."""
    error: BaseException
    immediate_retries: int = 0
    """Immediate retries the handler made before this decision."""


def is_in_memory(raw: object) -> bool:
    """Whether ``raw`` was made by FastStream's ``TestRabbitBroker`` (no broker behind it)."""
    return isinstance(raw, PatchedMessage)


async def run_in_memory(
    call_next: AsyncFuncAny,
    msg: StreamMessage[Any],
    queue: str,
    policy: RetryPolicy,
    immediate: ImmediateRetries | None = None,
) -> tuple[Any, InMemoryDecision | None]:
    """Run the handler; return its result, or the policy's decision on its failure.

    With ``immediate``, a failure runs the handler again first, as on a broker.
    """
    raw = msg.raw_message
    started, paused, runs = time.monotonic(), 0.0, 0
    while True:
        with retry_state_scope(raw, queue, immediate_retries=runs):
            try:
                return await call_next(msg), None
            except HandlerException:
                raise  # FastStream's own signals: the test client settles them
            except Exception as exc:
                state = replace(retry_state(raw, queue=queue), immediate_retries=runs)
                failure = exc
        pause = (
            None
            if immediate is None
            else immediate.next_pause(
                policy,
                state,
                failure,
                now=utcnow(),
                running_for=time.monotonic() - started,
                paused=paused,
            )
        )
        if pause is None:
            break
        await asyncio.sleep(pause)
        paused += pause
        runs += 1
    decision = policy.decide(state, failure, now=utcnow())
    return None, InMemoryDecision(
        queue=queue,
        attempt=state.attempt,
        action=decision.action,
        delay=decision.delay,
        reason=decision.reason,
        error=failure,
        immediate_retries=runs,
    )
