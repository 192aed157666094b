"""The page's filters and labels, on top of :mod:`delayed_retry.parking.lot`. Pure.

The web view and its JSON API name filters ``exception``, ``reason``,
``older_than``, ``newer_than``, ``header``, ``text`` and ``group``;
:func:`filter_from_mapping` turns them into the parking lot's
:class:`~delayed_retry.parking.lot.ParkedFilter` (the one the command line
uses too), and :func:`filter_to_mapping` back into a query string.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from delayed_retry.durations import parse_duration
from delayed_retry.errors import ConfigurationError
from delayed_retry.parking.fingerprint import Fingerprint, fill_template, fingerprint, masked_values
from delayed_retry.parking.lot import ParkedFilter, ParkedRecord

__all__ = [
    "FILTER_FIELDS",
    "CommonValues",
    "filter_from_mapping",
    "filter_to_mapping",
    "group_fingerprint",
    "group_label",
]

FILTER_FIELDS = ("exception", "reason", "older_than", "newer_than", "header", "text", "group")
"""The filter names of the page's query string and of the API's ``filter`` object."""


def _text_param(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigurationError(f"filter {name}={value!r} must be text")
    return value.strip() or None


def filter_from_mapping(data: Mapping[str, Any]) -> ParkedFilter:
    """The :class:`ParkedFilter` a query string or JSON object describes; unknown names refused.

    ``exception`` is the exception type (qualified, or its last part);
    ``header`` is ``name=text`` (the value contains text) or ``name`` (present);
    ``text`` a substring of the body; ``group`` a failure group's fingerprint.
    """
    unknown = sorted(set(data) - set(FILTER_FIELDS))
    if unknown:
        raise ConfigurationError(
            f"unknown filter {', '.join(unknown)}; use {', '.join(FILTER_FIELDS)}"
        )
    older = _text_param(data, "older_than")
    newer = _text_param(data, "newer_than")
    header = _text_param(data, "header")
    headers: tuple[tuple[str, str], ...] = ()
    if header:
        name, _, text = header.partition("=")
        if not name.strip():
            raise ConfigurationError(f"header filter {header!r} needs a name: write name=text")
        headers = ((name.strip(), text.strip()),)
    return ParkedFilter(
        exception_type=_text_param(data, "exception"),
        reason=_text_param(data, "reason"),
        older_than=timedelta(seconds=parse_duration(older, name="older_than")) if older else None,
        newer_than=timedelta(seconds=parse_duration(newer, name="newer_than")) if newer else None,
        headers=headers,
        body_contains=_text_param(data, "text"),
        fingerprint=_text_param(data, "group"),
    )


def filter_to_mapping(where: ParkedFilter) -> dict[str, str]:
    """The page's names for the criteria set in ``where`` (``ids`` are not shown)."""
    out: dict[str, str] = {}
    if where.exception_type:
        out["exception"] = where.exception_type
    if where.reason:
        out["reason"] = where.reason
    if where.older_than is not None:
        out["older_than"] = f"{where.older_than.total_seconds():g}s"
    if where.newer_than is not None:
        out["newer_than"] = f"{where.newer_than.total_seconds():g}s"
    if where.headers:
        name, text = where.headers[0]
        out["header"] = f"{name}={text}" if text else name
    if where.body_contains:
        out["text"] = where.body_contains
    if where.fingerprint:
        out["group"] = where.fingerprint
    return out


def group_fingerprint(record: ParkedRecord) -> Fingerprint:
    """The failure group of ``record`` as the page names it (a record without an exception
    type is named by its parking reason)."""
    return fingerprint(
        exception_type=record.exception_type or record.reason,
        message=record.exception_message,
        traceback=record.traceback,
    )


def group_label(record: ParkedRecord) -> str:
    """How a failure group reads on the page: the fingerprint's one-line label."""
    return group_fingerprint(record).label()


MAX_VALUE_CHARS = 120
"""A masked value longer than this is counted by its start."""


@dataclass
class CommonValues:
    """The values behind a failure group's placeholders, counted to name the most common.

    The grouping masks quoted values and numbers (``KeyError: <str>``), which
    hides the key a person needs at 3 a.m.; this shows it back
    (``KeyError: 'customer_id'``) without changing the group. A placeholder
    whose messages all differ there (an order number, an id) stays masked.
    """

    counts: list[Counter[str]] = field(default_factory=list)

    def add(self, message: str | None) -> None:
        """Count the masked values of one message of the group."""
        for i, value in enumerate(masked_values(message or "")):
            if i == len(self.counts):
                self.counts.append(Counter())
            self.counts[i][value[:MAX_VALUE_CHARS]] += 1

    def common(self, *, group_size: int) -> list[tuple[str, int] | None]:
        """For each placeholder, its most common value and count, or ``None`` to keep it
        masked (every message differs there)."""
        out: list[tuple[str, int] | None] = []
        for counter in self.counts:
            value, count = counter.most_common(1)[0]
            out.append((value, count) if count > 1 or group_size == 1 else None)
        return out

    def label(self, group: Fingerprint, *, group_size: int) -> tuple[str, str]:
        """The group's label with the most common values filled in, and a note saying so
        (empty when nothing was filled in)."""
        common = self.common(group_size=group_size)
        shown = [c for c in common if c is not None]
        if not shown:
            return group.label(), ""
        filled = fill_template(group.template, [c[0] if c else None for c in common])
        label = replace(group, template=filled).label()
        if group_size == 1:
            return label, "the values of its one message"
        note = "most common: " + ", ".join(f"{v} in {n} of {group_size}" for v, n in shown)
        return label, note
