"""The parking record: the headers a parked message carries, saying why it was parked.

A parked message keeps its own headers and its failure headers
(:func:`~delayed_retry.headers.retry_state.failure_headers`), and adds the
reason, the time, and the exception's type, message and traceback, bounded.
``parking list``, the alerts, the web view and the Spark archive read them.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from delayed_retry.durations import to_epoch_ms
from delayed_retry.headers.names import (
    X_DUE_AT,
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TRACEBACK,
    X_EXCEPTION_TYPE,
    X_HEADER_PROBLEMS,
    X_PARKED_AT,
    X_PARKED_REASON,
)
from delayed_retry.headers.retry_state import RetryState, failure_headers
from delayed_retry.headers.text import (
    MAX_ERROR_CHARS,
    MAX_TRACEBACK_CHARS,
    bounded,
    exception_name,
    exception_text,
)

__all__ = ["parking_headers"]


def parking_headers(
    headers: Mapping[str, Any] | None,
    state: RetryState,
    exc: BaseException,
    *,
    now: datetime,
    reason: str,
    runs: int | None = None,
) -> dict[str, Any]:
    """The parking record: failure headers plus reason, time, exception type, message, traceback."""
    out = failure_headers(headers, state, exc, now=now, retries=state.retries, runs=runs)
    out.pop(X_DUE_AT, None)
    out[X_PARKED_REASON] = reason
    out[X_PARKED_AT] = to_epoch_ms(now)
    out[X_EXCEPTION_TYPE] = exception_name(exc)
    out[X_EXCEPTION_MESSAGE] = bounded(exception_text(exc), MAX_ERROR_CHARS)
    trace = "".join(tb.format_exception(exc))
    out[X_EXCEPTION_TRACEBACK] = bounded(trace, MAX_TRACEBACK_CHARS, keep_end=True)
    if state.problems:
        out[X_HEADER_PROBLEMS] = bounded("; ".join(state.problems), MAX_ERROR_CHARS)
    return out
