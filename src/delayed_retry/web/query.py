"""Reading a request's query string: the parked-message filter and bounded whole numbers.

Use these in a handler instead of reading ``request.query`` by hand, so that a bad value is
a :class:`~delayed_retry.errors.ConfigurationError` naming the field and its range.
"""

from __future__ import annotations

from collections.abc import Mapping

from delayed_retry.errors import ConfigurationError
from delayed_retry.parking.lot import ParkedFilter
from delayed_retry.web.records import FILTER_FIELDS, filter_from_mapping

__all__ = ["filter_from_query", "query_int"]


def filter_from_query(query: Mapping[str, str]) -> ParkedFilter:
    """The filter the query's filter fields describe (the others are ignored)."""
    return filter_from_mapping({k: query[k] for k in FILTER_FIELDS if k in query})


def query_int(query: Mapping[str, str], name: str, default: int, *, high: int) -> int:
    """``name`` as a whole number from 0 to ``high``; ``default`` when absent or empty."""
    raw = query.get(name, "")
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{name}={raw[:20]!r} must be a whole number") from None
    if not 0 <= value <= high:
        raise ConfigurationError(f"{name}={value} must be between 0 and {high}")
    return value
