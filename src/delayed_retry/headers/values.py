"""Header values made safe to re-publish: what pamqp can encode, the broker's own removed.

aio-pika hands header values back as pamqp reads them, and some of them do
not survive a re-publish: ``bytes`` raise on encode, a float is re-encoded
in 32 bits, AMQP's decimal is narrow, integers beyond 64 bits have no type.
Every copy the library publishes of a received message goes through
:func:`sanitize_headers`, which keeps each value's meaning where it can and
spells it out as text where it cannot.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from delayed_retry.headers.names import is_broker_header
from delayed_retry.headers.text import TRUNCATED, utf8

__all__ = ["MAX_HEADER_DEPTH", "MAX_HEADER_STRING_CHARS", "header_int", "sanitize_headers"]

MAX_HEADER_STRING_CHARS = 32_000
"""Longest string header value kept whole; a longer one keeps this many characters."""
MAX_HEADER_DEPTH = 8
"""Nesting of tables and arrays kept; deeper values become their ``repr`` text."""


def header_int(value: object) -> int | None:
    """A header's integer, or ``None`` for anything else: ``True`` is not a count.

    Use it for every count or epoch read from headers: Python's ``bool`` is an
    ``int``, and a producer's ``true`` must not read as 1.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    return None


def _float32_exact(value: float) -> bool:
    try:
        return bool(struct.unpack("f", struct.pack("f", value))[0] == value)
    except (OverflowError, struct.error):
        return False


def _key(key: object) -> str:
    return utf8(str(key)[:128])


def _amqp_decimal(value: Decimal) -> bool:
    """Whether AMQP's decimal (an octet scale, a signed 32-bit mantissa) holds ``value``.

    The same arithmetic as pamqp's encoder, kept here so this module stays pure.
    """
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int):  # NaN, Infinity
        return False
    if exponent > 0:
        scale, mantissa = 0, int(value)
    else:
        scale, mantissa = -exponent, int(value.scaleb(-exponent))
    return 0 <= scale <= 255 and -(1 << 31) <= mantissa < 1 << 31


def _sanitize_value(value: object, depth: int) -> Any:
    """A header value pamqp can encode, keeping its meaning where possible."""
    if value is None or isinstance(value, bool | bytearray):
        return value
    if isinstance(value, datetime):
        # AMQP timestamps are unsigned seconds since the epoch (pamqp reads a naive
        # datetime as UTC): spell earlier moments out as text.
        aware = value if value.utcoffset() is not None else value.replace(tzinfo=UTC)
        return value if aware.timestamp() >= 0 else value.isoformat()
    if isinstance(value, int):
        return value if -(1 << 63) <= value < 1 << 63 else str(value)
    if isinstance(value, float):
        # pamqp encodes floats as 32-bit: keep those that survive, spell the rest out.
        if math.isfinite(value) and _float32_exact(value):
            return value
        return repr(value)
    if isinstance(value, Decimal):
        return value if _amqp_decimal(value) else str(value)
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, str):
        if len(value) > MAX_HEADER_STRING_CHARS:
            return utf8(value[:MAX_HEADER_STRING_CHARS]) + TRUNCATED
        return utf8(value)
    if depth >= MAX_HEADER_DEPTH:
        return utf8(repr(value)[:1000])
    if isinstance(value, Mapping):
        return {_key(k): _sanitize_value(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_sanitize_value(v, depth + 1) for v in value]
    return utf8(repr(value)[:1000])


def sanitize_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """Headers safe to re-publish: broker death headers removed, values made encodable.

    ``bytes`` become ``bytearray`` (AMQP byte arrays), floats that 32-bit
    encoding would change become their ``repr`` text, integers beyond 64 bits
    and undecodable Decimals become text, and nesting deeper than
    :data:`MAX_HEADER_DEPTH` becomes text.
    """
    if not isinstance(headers, Mapping):
        return {}
    return {
        _key(k): _sanitize_value(v, 0) for k, v in headers.items() if not is_broker_header(str(k))
    }
