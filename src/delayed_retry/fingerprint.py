"""Failure fingerprints: which parked messages failed *the same way*. Pure functions.

Use :func:`fingerprint` (or :func:`fingerprint_headers` on a parked message's
headers) wherever failures are grouped: the parking-lot commands, the web
view, the alert grouping and the Spark report all call it, so a group has
the same key everywhere.

Two failures are the same when they have the same exception type, were raised
by the same function, and their messages differ only in values. Values are
found the way log-template miners such as Drain and error trackers such as
Sentry find them: numbers, UUIDs, hex ids, quoted strings, e-mail addresses,
URLs, IP addresses and timestamps become placeholders, so
``gateway did not answer in 10 s (order 105)`` and ``… (order 106)`` share the
template ``gateway did not answer in <num> s (order <num>)``; a word with a
digit in it (``a1``, ``msg42``, ``http2``) becomes ``<id>``, as in Drain. Line numbers are
left out of the frame on purpose: a deploy that moves code must not split a
group.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from delayed_retry.headers import (
    X_EXCEPTION_MESSAGE,
    X_EXCEPTION_TRACEBACK,
    X_EXCEPTION_TYPE,
    X_LAST_ERROR,
)

__all__ = [
    "Fingerprint",
    "fingerprint",
    "fingerprint_headers",
    "message_template",
    "raising_frame",
]

MAX_TEMPLATE_CHARS = 500
"""Templates are cut here: past a few hundred characters a message no longer tells groups apart."""

# Order matters: wider shapes first, so a URL's digits do not become <num> inside it.
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.\-]*://[^\s'\"<>()\[\]{}]+"), "<url>"),
    (re.compile(r"\b[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+\b"), "<email>"),
    (
        re.compile(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b"
        ),
        "<uuid>",
    ),
    (
        re.compile(
            r"\b\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?"
            r"(?:Z|[+\-]\d{2}:?\d{2})?)?\b"
        ),
        "<time>",
    ),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b"), "<time>"),
    (re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?\b"), "<ip>"),
    (re.compile(r"'[^'\n]{0,200}'|\"[^\"\n]{0,200}\""), "<str>"),
    (re.compile(r"\b0[xX][0-9a-fA-F]+\b"), "<hex>"),
    # A long run of hex digits with at least one digit and one letter: ids, hashes.
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "<hex>"),
    # Numbers not glued to a word before them (10s becomes <num>s) …
    (re.compile(r"(?<![\w<])[-+]?\d+(?:\.\d+)?"), "<num>"),
    # … then any other word with a digit in it (a1, msg42, order_105): Drain's rule.
    (re.compile(r"\b(?=\w*\d)\w+\b"), "<id>"),
)
_SPACE = re.compile(r"\s+")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line \d+, in (?P<func>\S+)', re.MULTILINE)


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """The group a failure belongs to; ``str()`` gives its short stable :attr:`key`."""

    key: str
    exception_type: str
    frame: str
    template: str

    def __str__(self) -> str:
        return self.key

    def label(self) -> str:
        """One line for a person: ``TimeoutError in gateway.py:call: gateway did not …``."""
        where = f" in {self.frame}" if self.frame else ""
        what = f": {self.template}" if self.template else ""
        return f"{self.exception_type or 'unknown'}{where}{what}"


def message_template(message: str) -> str:
    """``message`` with its values replaced by placeholders (``<num>``, ``<uuid>``, ``<str>`` …)."""
    text = message
    for pattern, placeholder in _RULES:
        text = pattern.sub(placeholder, text)
    text = _SPACE.sub(" ", text).strip()
    return text[:MAX_TEMPLATE_CHARS]


def raising_frame(traceback: str | None) -> str:
    """The innermost frame of a formatted traceback as ``file.py:function`` (``""`` if none).

    Only the file's base name and the function are kept: the directory
    differs between machines and the line number between deploys.
    """
    if not traceback:
        return ""
    frames = list(_FRAME.finditer(traceback))
    if not frames:
        return ""
    last = frames[-1]
    path = last.group("file").replace("\\", "/")
    return f"{path.rsplit('/', 1)[-1]}:{last.group('func')}"


def fingerprint(
    *, exception_type: str | None, message: str | None, traceback: str | None = None
) -> Fingerprint:
    """The :class:`Fingerprint` of one failure: type, raising frame and message template."""
    kind = (exception_type or "").strip()
    frame = raising_frame(traceback)
    template = message_template(message or "")
    digest = hashlib.sha1(f"{kind}\0{frame}\0{template}".encode(), usedforsecurity=False)
    return Fingerprint(
        key=digest.hexdigest()[:12], exception_type=kind, frame=frame, template=template
    )


def _text(value: Any) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def fingerprint_headers(headers: Mapping[str, Any] | None) -> Fingerprint:
    """The :class:`Fingerprint` of a parked message, from its failure record headers.

    Reads ``x-exception-type``, ``x-exception-message`` and
    ``x-exception-traceback``; a message that carries only
    ``x-retry-last-error`` (``Type: message``) is read from that.
    """
    headers = headers or {}
    kind = _text(headers.get(X_EXCEPTION_TYPE))
    message = _text(headers.get(X_EXCEPTION_MESSAGE))
    if kind is None and message is None:
        last = _text(headers.get(X_LAST_ERROR))
        if last:
            kind, _, message = last.partition(": ")
    return fingerprint(
        exception_type=kind,
        message=message,
        traceback=_text(headers.get(X_EXCEPTION_TRACEBACK)),
    )
