"""Delay ⇄ bits ⇄ routing key, for the binary chain of delay levels. Pure functions.

A delay of ``n`` units is written as ``levels`` binary digits, highest level
first, followed by the destination queue: with 4 levels, 5 units to queue
``orders`` is ``0.1.0.1.orders``. Level ``k`` holds a message for ``2**k``
units when its digit is 1; the 0 digits are passed over (each level's
exchange binds the queue of the next 1 digit below it directly). The key
always has exactly ``levels`` digit words, so a destination may contain dots
and the key never grows across retries.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

__all__ = [
    "MAX_ROUTING_KEY_BYTES",
    "DecodedKey",
    "bits_of",
    "decode_routing_key",
    "delivery_binding_key",
    "entry_level",
    "level_binding_key",
    "drained_binding_key",
    "skip_binding_key",
    "max_destination_bytes",
    "routing_key",
    "units_for_ms",
    "validate_destination",
]

MAX_ROUTING_KEY_BYTES = 255
"""AMQP 0-9-1 routing keys are short strings: at most 255 bytes."""


class DecodedKey(NamedTuple):
    """A routing key of the delay chain, read back."""

    units: int
    destination: str


def units_for_ms(delay_ms: int, unit_ms: int) -> int:
    """Units of ``unit_ms`` covering ``delay_ms``, rounded up so nothing arrives early."""
    if delay_ms < 0:
        raise ValueError(f"delay_ms={delay_ms} is negative")
    if unit_ms < 1:
        raise ValueError(f"unit_ms={unit_ms} must be at least 1")
    return -(-delay_ms // unit_ms)


def bits_of(units: int, levels: int) -> list[int]:
    """The binary digits of ``units``, highest level first, ``levels`` of them."""
    if units < 0 or units >= 1 << levels:
        raise ValueError(f"{units} units do not fit in {levels} levels (max {(1 << levels) - 1})")
    return [(units >> level) & 1 for level in range(levels - 1, -1, -1)]


def entry_level(units: int) -> int:
    """The level a message enters the chain at: its highest 1 bit, or 0 for no delay."""
    return max(units.bit_length() - 1, 0)


def max_destination_bytes(levels: int) -> int:
    """How long a destination queue name may be, in UTF-8 bytes, for ``levels`` levels."""
    return MAX_ROUTING_KEY_BYTES - 2 * levels


@functools.lru_cache(maxsize=1024)
def validate_destination(destination: str, levels: int) -> None:
    """Raise ``ValueError`` when ``destination`` cannot be carried in a chain routing key.

    Cached: every retry checks its queue again, and the answer never changes.
    """
    if not destination:
        raise ValueError("destination queue name is empty")
    if destination.startswith("amq."):
        raise ValueError(f"destination {destination!r} is a server-named or reserved queue")
    words = destination.split(".")
    if "*" in words or "#" in words:
        raise ValueError(
            f"destination {destination!r} contains a '*' or '#' word, which topic routing "
            "would read as a wildcard; rename the queue"
        )
    size = len(destination.encode())
    if size > max_destination_bytes(levels):
        raise ValueError(
            f"destination {destination!r} is {size} bytes; with {levels} levels a queue name "
            f"may have at most {max_destination_bytes(levels)} bytes"
        )


def routing_key(units: int, levels: int, destination: str) -> str:
    """The chain routing key for a delay of ``units`` to ``destination``."""
    validate_destination(destination, levels)
    if units < 0 or units >= 1 << levels:
        bits_of(units, levels)  # raises the one error message for this
    # The digits of bits_of, spelled by format(): one call instead of a list per retry.
    return ".".join(format(units, f"0{levels}b")) + "." + destination


def decode_routing_key(key: str, levels: int) -> DecodedKey:
    """Read a chain routing key back into units and destination; ``ValueError`` if malformed."""
    words = key.split(".")
    if len(words) <= levels:
        raise ValueError(f"routing key {key!r} has fewer than {levels + 1} words")
    digits, destination = words[:levels], ".".join(words[levels:])
    if any(d not in ("0", "1") for d in digits):
        raise ValueError(f"routing key {key!r} has a digit word other than 0 or 1")
    units = 0
    for digit in digits:
        units = units << 1 | int(digit)
    validate_destination(destination, levels)
    return DecodedKey(units, destination)


def level_binding_key(level: int, levels: int, bit: int) -> str:
    """Binding key on level ``level``'s exchange that matches digit ``bit`` of that level."""
    if not 0 <= level < levels:
        raise ValueError(f"level {level} is outside 0..{levels - 1}")
    return "*." * (levels - 1 - level) + f"{bit}.#"


def skip_binding_key(source: int, target: int, levels: int) -> str:
    """Binding key on level ``source``'s exchange for the queue of level ``target <= source``.

    It matches the keys whose digits ``source`` … ``target + 1`` are 0 and whose
    digit ``target`` is 1: the exchange passes the zeros over in one routing
    step instead of one exchange per level. With ``target == source`` it is
    :func:`level_binding_key` for a 1.
    """
    if not 0 <= target <= source < levels:
        raise ValueError(f"levels {source} → {target} are not a way down within 0..{levels - 1}")
    return "*." * (levels - 1 - source) + "0." * (source - target) + "1.#"


def drained_binding_key(source: int, levels: int) -> str:
    """Binding key on level ``source``'s exchange matching keys with no 1 at or below it.

    Such a message has waited out its whole delay: it goes to the delivery
    exchange. For level 0 it is :func:`level_binding_key` for a 0.
    """
    if not 0 <= source < levels:
        raise ValueError(f"level {source} is outside 0..{levels - 1}")
    return "*." * (levels - 1 - source) + "0." * (source + 1) + "#"


def delivery_binding_key(levels: int, destination: str) -> str:
    """Binding key on the delivery exchange for ``destination``: any digits, then its name."""
    validate_destination(destination, levels)
    return "*." * levels + destination
