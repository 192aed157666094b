"""Parked messages as the web view shows them: record, key, group, filter. Pure.

A :class:`ParkedRecord` is one message read from a parking queue. Its
``key`` is the ``message_id`` when the message has one, else a digest of its
body and parking time, so every message can be selected. :class:`ParkedFilter`
holds the page's filters; it is parsed from the query string or a JSON
object with :meth:`ParkedFilter.from_mapping`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from delayed_retry.errors import ConfigurationError
from delayed_retry.headers import X_EXCEPTION_TRACEBACK
from delayed_retry.parking import ParkedMessage, parse_parked

__all__ = ["ParkedFilter", "ParkedRecord", "fingerprint", "parse_age", "read_record"]

_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_AGE_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}


def parse_age(text: str, *, name: str) -> timedelta:
    """``90s``, ``15m``, ``1h``, ``2d`` (or plain seconds) into a :class:`timedelta`."""
    match = _AGE.match(text)
    if not match:
        raise ConfigurationError(
            f"filter {name}={text[:40]!r} is not a duration; write it like 90s, 15m, 1h or 2d"
        )
    return timedelta(seconds=float(match.group(1)) * _AGE_UNITS[match.group(2)])


_TEMPLATE_RULES = (
    (re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), "<email>"),
    (re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.I), "<url>"),
    (
        re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.I),
        "<uuid>",
    ),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"\b0x[0-9a-f]+\b|\b[0-9a-f]{12,}\b", re.I), "<hex>"),
    (re.compile(r"\d+(?:\.\d+)?"), "<n>"),
)


def _template(message: str) -> str:
    for pattern, placeholder in _TEMPLATE_RULES:
        message = pattern.sub(placeholder, message)
    return message


def fingerprint(
    exception_type: str | None, exception_message: str | None, traceback: str | None
) -> tuple[str, str]:
    """A failure's group: ``(id, label)``; same exception type, raising frame and template."""
    frame = ""
    if traceback:
        frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', traceback)
        if frames:
            path, function = frames[-1]
            frame = f"{path.rsplit('/', 1)[-1]}:{function}"
    template = _template(exception_message or "")
    label = (
        f"{exception_type or 'no exception'}: {template}"
        if template
        else (exception_type or "no exception")
    )
    digest = hashlib.sha256(f"{exception_type}\0{frame}\0{template}".encode()).hexdigest()[:16]
    return digest, label


@dataclass(frozen=True, kw_only=True)
class ParkedRecord:
    """One parked message: its record, headers and body, its key and its failure group."""

    key: str
    parked: ParkedMessage
    headers: Mapping[str, Any]
    body: bytes
    body_size: int
    content_type: str | None
    group: str
    group_label: str
    traceback: str | None


def message_key(message_id: str | None, body: bytes, headers: Mapping[str, Any]) -> str:
    """The key selecting a message: its ``message_id``, else a digest of body and record."""
    if message_id:
        return message_id
    seed = repr(sorted((k, repr(v)) for k, v in headers.items())).encode() + b"\0" + body
    return "sha256:" + hashlib.sha256(seed).hexdigest()[:24]


def read_record(
    headers: Mapping[str, Any] | None,
    *,
    message_id: str | None,
    body: bytes,
    exchange: str | None,
    routing_key: str | None,
    content_type: str | None,
    keep_body: int = 65_536,
) -> ParkedRecord:
    """The :class:`ParkedRecord` of a delivery from a parking queue."""
    h: Mapping[str, Any] = headers if isinstance(headers, Mapping) else {}
    parked = parse_parked(
        h, message_id=message_id, body=body, exchange=exchange, routing_key=routing_key
    )
    tb = h.get(X_EXCEPTION_TRACEBACK)
    traceback = tb if isinstance(tb, str) else None
    group, label = fingerprint(parked.exception_type, parked.exception_message, traceback)
    return ParkedRecord(
        key=message_key(message_id, body, h),
        parked=parked,
        headers=dict(h),
        body=body[:keep_body],
        body_size=len(body),
        content_type=content_type,
        group=group,
        group_label=label,
        traceback=traceback,
    )


def _text_param(data: Mapping[str, Any], name: str) -> str | None:
    value = data.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigurationError(f"filter {name}={value!r} must be text")
    return value.strip() or None


@dataclass(frozen=True, kw_only=True)
class ParkedFilter:
    """The page's filters; every one set must match.

    ``exception`` is a case-insensitive substring of the exception type;
    ``reason`` the exact parking reason; ``older_than``/``newer_than`` the age
    since parking; ``header`` is ``name=value`` (or ``name`` alone: present);
    ``text`` a substring of the body; ``group`` a failure group id.
    """

    exception: str | None = None
    reason: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    header: str | None = None
    text: str | None = None
    group: str | None = None

    _FIELDS = ("exception", "reason", "older_than", "newer_than", "header", "text", "group")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ParkedFilter:
        """Parse a query string or JSON object; unknown names are refused."""
        unknown = sorted(set(data) - set(cls._FIELDS))
        if unknown:
            raise ConfigurationError(
                f"unknown filter {', '.join(unknown)}; use {', '.join(cls._FIELDS)}"
            )
        older = _text_param(data, "older_than")
        newer = _text_param(data, "newer_than")
        return cls(
            exception=_text_param(data, "exception"),
            reason=_text_param(data, "reason"),
            older_than=parse_age(older, name="older_than") if older else None,
            newer_than=parse_age(newer, name="newer_than") if newer else None,
            header=_text_param(data, "header"),
            text=_text_param(data, "text"),
            group=_text_param(data, "group"),
        )

    def to_mapping(self) -> dict[str, str]:
        """The filters that are set, as text (the query string of a link)."""
        out: dict[str, str] = {}
        for name in self._FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            out[name] = f"{value.total_seconds():g}s" if isinstance(value, timedelta) else value
        return out

    @property
    def empty(self) -> bool:
        """Whether no filter is set (everything matches)."""
        return not self.to_mapping()

    def matches(self, record: ParkedRecord, *, now: datetime) -> bool:
        """Whether ``record`` passes every filter that is set."""
        p = record.parked
        if self.exception and self.exception.lower() not in (p.exception_type or "").lower():
            return False
        if self.reason and self.reason != p.reason:
            return False
        if self.group and self.group != record.group:
            return False
        if self.older_than is not None or self.newer_than is not None:
            if p.parked_at is None:
                return False
            age = now - p.parked_at
            if self.older_than is not None and age < self.older_than:
                return False
            if self.newer_than is not None and age > self.newer_than:
                return False
        if self.header:
            name, sep, wanted = self.header.partition("=")
            if name.strip() not in record.headers:
                return False
            if sep and str(record.headers[name.strip()]) != wanted.strip():
                return False
        return not (self.text and self.text.encode() not in record.body)
