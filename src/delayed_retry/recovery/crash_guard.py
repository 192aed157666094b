"""CrashGuard: how many times a message may take its consumer down before it is parked. Pure.

A message whose handling kills the process (out of memory, a crash in a C
extension, ``os._exit``) never reaches the code that retries or parks: the
broker delivers it again, to the next process, which dies too. The crash
guard counts such deliveries in the message itself (``x-retry-crashes``) and
parks the message as ``crashed`` before its handler runs again, once the
count reaches ``max_crashes``. :mod:`delayed_retry.consumer.crash_guard` acts
on it; this module holds the option and the count's reading.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delayed_retry.errors import ConfigurationError
from delayed_retry.headers.names import X_RETRY_CRASHES

__all__ = ["MAX_CRASH_COUNT", "CrashGuard", "crashes_of"]

MAX_CRASH_COUNT = 1_000_000
"""A count above this is not believed (a header written by someone else): read as 0."""


@dataclass(frozen=True, kw_only=True)
class CrashGuard:
    """Park a message as ``crashed`` after its consumer went away ``max_crashes`` times holding it.

    Use it on a consumer whose handler can take its process down (native
    extensions, memory-hungry messages): instead of a message that kills every
    process it reaches for ever (classic queues) or is dropped without a
    record by a quorum queue's delivery limit (RabbitMQ 4.x), it is parked
    with its record and the alert fires. It counts every delivery the broker
    marks ``redelivered``: a crash, and also a connection lost while the
    message was held. The library's own give-backs are never counted.
    """

    max_crashes: int = 3

    def __post_init__(self) -> None:
        n = self.max_crashes
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigurationError(
                f"CrashGuard max_crashes={n!r} must be a whole number of at least 1 (the "
                "deliveries that may end with the consumer gone before the message is parked)"
            )


def crashes_of(headers: Mapping[str, Any] | None) -> int:
    """The crash count a message carries (``x-retry-crashes``); 0 when absent or unusable."""
    if not isinstance(headers, Mapping):
        return 0
    value = headers.get(X_RETRY_CRASHES)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_CRASH_COUNT:
        return 0
    return value
