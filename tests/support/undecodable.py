"""Values a test publisher sends that pamqp encodes but cannot decode again.

No patching: pamqp encodes a ``datetime`` through its ``timestamp()`` and a
``str`` through its ``encode()``, so subclasses that answer differently put on
the wire exactly what a producer writing microseconds, or a client that does
not check UTF-8, would send.
"""

from __future__ import annotations

import datetime

__all__ = ["MicrosecondStamp", "NotUtf8", "microseconds_now"]


class MicrosecondStamp(datetime.datetime):
    """A datetime that pamqp encodes in microseconds since the epoch, as some producers do."""

    def timestamp(self) -> float:
        return super().timestamp() * 1_000_000


class NotUtf8(str):
    """A string that pamqp encodes as bytes that are not UTF-8 (as a lax client would)."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        return b"\xff\xfe" + str(self).encode(encoding, errors)


def microseconds_now() -> MicrosecondStamp:
    """Now, to be sent as a timestamp in microseconds (the year 58,000 and more to pamqp)."""
    now = datetime.datetime.now(datetime.UTC)
    return MicrosecondStamp.fromtimestamp(now.timestamp(), datetime.UTC)
