"""The headers delayed-retry reads and writes, by idea; this module re-exports them.

- :mod:`~delayed_retry.headers.names`: every ``x-*`` header name the library
  reads or writes, and which of them the broker owns (never re-published).
- :mod:`~delayed_retry.headers.retry_state`: the retry state a message
  carries (:class:`RetryState`, :func:`parse_retry_state`) and the headers of
  the copy that goes on.
- :mod:`~delayed_retry.headers.parking_record`: the headers of a parked message.
- :mod:`~delayed_retry.headers.values`: header values made safe to re-publish.
- :mod:`~delayed_retry.headers.text`: bounded text, exceptions spelled one way,
  body previews.

All pure. Import a name from here in your own code (``from delayed_retry.headers
import X_RETRY``); the library imports each from its module.
"""

from delayed_retry.headers.names import (
    BROKER_HEADERS,
    BROKER_READ_COUNTERS,
    X_ACQUIRED_COUNT,
    X_CLAIMED_QUEUE,
    X_DEATH,
    X_DELAY,
    X_DELIVERY_COUNT,
    X_DUE_AT,
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TRACEBACK,
    X_EXCEPTION_TYPE,
    X_FIRST_FAILURE_AT,
    X_FORWARD_ROUTING_KEY,
    X_HEADER_PROBLEMS,
    X_IMMEDIATE_RUNS,
    X_LAST_ERROR,
    X_LAST_FAILURE_AT,
    X_MIGRATED_FROM,
    X_ORIGINAL_EXCHANGE,
    X_ORIGINAL_ROUTING_KEY,
    X_PARKED_AT,
    X_PARKED_NOTE,
    X_PARKED_REASON,
    X_PARKED_REFRESHED_AT,
    X_QUEUE,
    X_REDRIVE_ID,
    X_REPLAY_CANARY,
    X_REPLAYED,
    X_REPLAYED_AT,
    X_REPLAYED_BY,
    X_RETRY,
    X_RETRY_CRASHES,
    X_SCHEDULE_ID,
    X_THROTTLE_EVENT,
    X_THROTTLE_TRIGGER,
    X_THROTTLED_AT,
    X_TRACE_ORIGIN,
    is_broker_header,
    split_read_counters,
)
from delayed_retry.headers.parking_record import (
    parking_headers,
)
from delayed_retry.headers.retry_state import (
    MAX_IMMEDIATE_HISTORY,
    MAX_RETRY_COUNT,
    RetryState,
    failure_headers,
    forwarded_headers,
    parse_retry_state,
    read_epoch_ms,
    scheduled_headers,
)
from delayed_retry.headers.text import (
    MAX_ERROR_CHARS,
    MAX_TRACEBACK_CHARS,
    describe_exception,
    encode_body_preview,
    exception_name,
    exception_text,
)
from delayed_retry.headers.values import (
    MAX_HEADER_DEPTH,
    MAX_HEADER_STRING_CHARS,
    sanitize_headers,
)

__all__ = [
    # every header name, and which the broker owns
    "X_RETRY",
    "X_DUE_AT",
    "X_FIRST_FAILURE_AT",
    "X_LAST_FAILURE_AT",
    "X_LAST_ERROR",
    "X_ORIGINAL_EXCHANGE",
    "X_ORIGINAL_ROUTING_KEY",
    "X_QUEUE",
    "X_PARKED_REASON",
    "X_PARKED_AT",
    "X_PARKED_REFRESHED_AT",
    "X_EXCEPTION_TYPE",
    "X_EXCEPTION_MESSAGE",
    "X_EXCEPTION_TRACEBACK",
    "X_REPLAYED",
    "X_REPLAYED_AT",
    "X_REPLAYED_BY",
    "X_REPLAY_CANARY",
    "X_DELAY",
    "X_FORWARD_ROUTING_KEY",
    "X_CLAIMED_QUEUE",
    "X_TRACE_ORIGIN",
    "X_REDRIVE_ID",
    "X_SCHEDULE_ID",
    "X_PARKED_NOTE",
    "X_HEADER_PROBLEMS",
    "X_MIGRATED_FROM",
    "X_IMMEDIATE_RUNS",
    "X_RETRY_CRASHES",
    "X_THROTTLE_EVENT",
    "X_THROTTLE_TRIGGER",
    "X_THROTTLED_AT",
    "X_DEATH",
    "X_DELIVERY_COUNT",
    "X_ACQUIRED_COUNT",
    "BROKER_HEADERS",
    "BROKER_READ_COUNTERS",
    "is_broker_header",
    "split_read_counters",
    # the retry state a message carries
    "MAX_IMMEDIATE_HISTORY",
    "MAX_RETRY_COUNT",
    "RetryState",
    "failure_headers",
    "forwarded_headers",
    "parse_retry_state",
    "read_epoch_ms",
    "scheduled_headers",
    # the parking record
    "parking_headers",
    # header values safe to re-publish
    "MAX_HEADER_DEPTH",
    "MAX_HEADER_STRING_CHARS",
    "sanitize_headers",
    # text for people
    "MAX_ERROR_CHARS",
    "MAX_TRACEBACK_CHARS",
    "describe_exception",
    "encode_body_preview",
    "exception_name",
    "exception_text",
]
