"""The retry state of the message a handler is running: read lazily, visible to the handler.

A wrapped handler (or anything it calls) asks :func:`current_retry_state` for
the attempt, the first failure and the original route of the message it is
handling; :func:`retry_state` reads the same from any message. The state is
parsed from the headers only when something asks: a message that succeeds on
its first attempt parses none.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from collections.abc import Iterator
from dataclasses import replace

from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.headers.retry_state import RetryState, parse_retry_state

__all__ = [
    "CURRENT_STATE",
    "LazyRetryState",
    "current_retry_state",
    "retry_state",
    "retry_state_scope",
]

log = logging.getLogger(__name__)


class LazyRetryState:
    """The retry state of one delivery, read from its headers only when something asks.

    A message that succeeds on its first attempt never needs it: the success
    path parses no headers. Header problems are logged when the state is read.
    """

    __slots__ = ("_message", "_queue", "_rerun", "_state")

    def __init__(self, message: AbstractIncomingMessage, queue: str) -> None:
        self._message = message
        self._queue = queue
        self._state: RetryState | None = None
        self._rerun: RetryState | None = None

    def rerun(self) -> None:
        """One more immediate retry of this delivery: the state says so from now on."""
        state = self._rerun or self.get()
        self._rerun = replace(state, immediate_retries=state.immediate_retries + 1)

    def get(self) -> RetryState:
        if self._rerun is not None:
            return self._rerun
        if self._state is None:
            message = self._message
            self._state = state = parse_retry_state(
                message.headers,
                exchange=message.exchange,
                routing_key=message.routing_key,
                queue=self._queue,
            )
            for problem in state.problems:
                log.warning("message %s on queue %r: %s", message.message_id, self._queue, problem)
        return self._state


CURRENT_STATE: contextvars.ContextVar[LazyRetryState | None] = contextvars.ContextVar(
    "delayed_retry_state", default=None
)
"""The state of the delivery the running task handles; set around each handler run."""


def current_retry_state() -> RetryState | None:
    """The retry state of the message being handled by this task, inside a wrapped handler."""
    cell = CURRENT_STATE.get()
    return None if cell is None else cell.get()


@contextlib.contextmanager
def retry_state_scope(
    message: AbstractIncomingMessage, queue: str, *, immediate_retries: int = 0
) -> Iterator[None]:
    """Make :func:`current_retry_state` answer for ``message`` inside the block.

    For a front end that runs a handler without a broker to hand failures to
    (FastStream's in-memory test client); :class:`~delayed_retry.RetryingHandler`
    does the same around every attempt. The headers are read only if something asks.
    ``immediate_retries``: how many this run of the delivery follows.
    """
    cell = LazyRetryState(message, queue)
    for _ in range(immediate_retries):
        cell.rerun()
    token = CURRENT_STATE.set(cell)
    try:
        yield
    finally:
        CURRENT_STATE.reset(token)


def retry_state(message: AbstractIncomingMessage, *, queue: str | None = None) -> RetryState:
    """Read the retry state of any message (attempt, first failure, original exchange …)."""
    return parse_retry_state(
        message.headers, exchange=message.exchange, routing_key=message.routing_key, queue=queue
    )
