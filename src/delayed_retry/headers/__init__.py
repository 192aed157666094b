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
import X_RETRY``); the library imports each from its module. What this module
offers is what those modules export (their ``__all__``), written once there.
"""

# The names are listed once, in each module's __all__; this module adds none of its own.
from delayed_retry.headers import names, parking_record, retry_state, text, values
from delayed_retry.headers.names import *  # noqa: F403
from delayed_retry.headers.parking_record import *  # noqa: F403
from delayed_retry.headers.retry_state import *  # noqa: F403
from delayed_retry.headers.text import *  # noqa: F403
from delayed_retry.headers.values import *  # noqa: F403

__all__ = [
    *names.__all__,
    *retry_state.__all__,
    *parking_record.__all__,
    *values.__all__,
    *text.__all__,
]
