"""Failure fingerprints: which parked messages failed *the same way*. Pure.

Use :func:`fingerprint` (or :func:`fingerprint_headers` on a parked message) wherever
failures are grouped (the Spark report, the alert grouping, the parking commands, the web
view), so one failure gets one key everywhere. The key is the exception type, the raising
frame (file and function, not the line) and the message with its variable parts masked;
which parts, and why: docs/parking.md, "Failure groups".
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Fingerprint",
    "fill_template",
    "fingerprint",
    "fingerprint_headers",
    "masked_values",
    "message_template",
    "raising_frame",
]

# Header names, spelled here so this module imports nothing of the package (it is shared
# by the Spark executors, which only need this file); they equal those in headers/names.py.
_X_EXCEPTION_TYPE = "x-exception-type"
_X_EXCEPTION_MESSAGE = "x-exception-message"
_X_EXCEPTION_TRACEBACK = "x-exception-traceback"
_X_LAST_ERROR = "x-retry-last-error"

UNKNOWN_TYPE = "unknown"
"""Exception type of a record that names none."""

MAX_TEMPLATE_INPUT = 2_000
"""Characters of a message that are templated; the rest is cut (records are bounded anyway)."""

KEY_LENGTH = 12
"""Hex digits of :attr:`Fingerprint.key` (48 bits: collisions are negligible per archive)."""

_HEX = "[0-9a-fA-F]"
# (placeholder, pattern), applied in this order. Each pattern matches at least one
# character that is not part of a placeholder, and no placeholder matches any pattern,
# so templating reaches a fixed point (see message_template).
_MASKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (
        "<url>",
        re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()\[\]{}]*[^\s'\"<>()\[\]{}.,;:!?]"),
    ),
    ("<email>", re.compile(r"(?<![\w.+-])[\w.+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+")),
    ("<str>", re.compile(r"(?<!\w)'[^'\n]*'(?!\w)|(?<!\w)\"[^\"\n]*\"(?!\w)")),
    (
        "<uuid>",
        re.compile(rf"(?<!\w){_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}(?!\w)"),
    ),
    (
        "<time>",
        re.compile(
            r"(?<!\w)\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?)?"
            r"(?:Z|[+-]\d{2}:?\d{2})?(?![\w:])"
            r"|(?<![\w:])\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?(?![\w:])"
        ),
    ),
    ("<ip>", re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{1,5})?(?![\w.])")),
    (
        "<ip>",
        re.compile(
            rf"(?<![\w:])(?:{_HEX}{{1,4}}:){{7}}{_HEX}{{1,4}}(?![\w:])"
            rf"|(?<![\w:])(?:{_HEX}{{1,4}}(?::{_HEX}{{1,4}})*)?::"
            rf"(?:{_HEX}{{1,4}}(?::{_HEX}{{1,4}})*)?(?![\w:])"
        ),
    ),
    ("<hex>", re.compile(rf"(?<!\w)0[xX]{_HEX}+(?!\w)")),
    # A bare hex id (a digest, an object id): 8+ hex digits with a digit and a letter in it.
    ("<hex>", re.compile(rf"(?<!\w)(?={_HEX}*\d)(?={_HEX}*[a-fA-F]){_HEX}{{8,}}(?!\w)")),
    # Any run of digits, also one glued to letters: ``a1`` and ``a2`` are ids of one group
    # far more often than ``http1`` and ``http2`` are different failures.
    ("<num>", re.compile(r"\d+(?:\.\d+)*")),
)
_SPACE = re.compile(r"\s+")

# `  File "/srv/app/orders/handler.py", line 42, in handle`
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+, in (?P<func>\S+)\s*$', re.MULTILINE)
_PACKAGE_ROOTS = ("site-packages/", "dist-packages/")


@dataclass(frozen=True, kw_only=True)
class Fingerprint:
    """One way of failing: the stable short :attr:`key` and what it was made of.

    Two records with the same ``key`` have the same exception type, raising
    frame and message template; the key is the same on every machine and
    in every run, so it can be stored, filtered on and compared across
    reports.
    """

    key: str
    exception_type: str
    template: str
    frame: str | None = None

    def label(self) -> str:
        """One line for a person: ``Type: template`` (and the frame when known)."""
        text = f"{self.exception_type}: {self.template}" if self.template else self.exception_type
        return f"{text} [{self.frame}]" if self.frame else text


def message_template(message: str) -> str:
    """``message`` with its variable parts replaced by placeholders, whitespace collapsed.

    Placeholders: ``<url>``, ``<email>``, ``<str>`` (a quoted value),
    ``<uuid>``, ``<time>``, ``<ip>``, ``<hex>``, ``<num>``. Idempotent:
    templating a template changes nothing.
    """
    text = _SPACE.sub(" ", message[:MAX_TEMPLATE_INPUT]).strip()
    # A replacement can expose a new token boundary (``1'x'`` -> ``<num>'x'``), so repeat
    # until nothing changes; every round masks at least one raw character, so it ends.
    while True:
        before = text
        for placeholder, pattern in _MASKS:
            text = pattern.sub(placeholder, text)
        if text == before:
            return text


_PLACEHOLDER = re.compile(r"<(?:url|email|str|uuid|time|ip|hex|num)>")


def masked_values(message: str) -> tuple[str, ...]:
    """The parts of ``message`` its template masks, in order; ``()`` when none or unreadable.

    Use it to show what a group's placeholders stand for (``KeyError: 'sku'``
    gives ``("'sku'",)``) without changing the grouping: the template, and so
    the fingerprint, stay as they are.
    """
    text = _SPACE.sub(" ", message[:MAX_TEMPLATE_INPUT]).strip()
    pieces = _PLACEHOLDER.split(message_template(message))
    if len(pieces) == 1:
        return ()
    match = re.fullmatch("(.+?)".join(re.escape(p) for p in pieces), text, flags=re.DOTALL)
    return match.groups() if match is not None else ()


def fill_template(template: str, values: Sequence[str | None]) -> str:
    """``template`` with its placeholders replaced by ``values`` in order (``None`` keeps one)."""
    given = iter(values)

    def one(match: re.Match[str]) -> str:
        value = next(given, None)
        return match[0] if value is None else value

    return _PLACEHOLDER.sub(one, template)


def _short_path(path: str) -> str:
    path = path.replace("\\", "/")
    for root in _PACKAGE_ROOTS:
        at = path.rfind(root)
        if at >= 0:
            return path[at + len(root) :]
    # Outside an installed package: the last two parts survive a move of the checkout.
    return "/".join(path.rsplit("/", 2)[-2:])


def raising_frame(traceback_text: str | None) -> str | None:
    """``path in function`` of the innermost frame of a Python traceback text, or ``None``.

    The path is cut to what is the same on every machine: from the package
    root (after ``site-packages/``) or else its last two parts. The line
    number is left out on purpose, as Sentry does, so that editing the file
    does not split the group. With chained exceptions the last traceback is
    the one of the exception that was raised.
    """
    if not traceback_text:
        return None
    last: re.Match[str] | None = None
    for last in _FRAME.finditer(traceback_text):  # noqa: B007 - the last match is wanted
        pass
    if last is None:
        return None
    return f"{_short_path(last['path'])} in {last['func']}"


def fingerprint(
    *,
    exception_type: str | None,
    message: str | None,
    frame: str | None = None,
    traceback: str | None = None,
) -> Fingerprint:
    """The fingerprint of one failure.

    ``frame`` is the raising frame when the caller knows it; otherwise it is
    read from ``traceback`` (a formatted Python traceback) when given. A
    missing type becomes ``"unknown"`` and a missing message an empty
    template, so every record gets a fingerprint.
    """
    kind = (exception_type or "").strip() or UNKNOWN_TYPE
    template = message_template(message or "")
    where = frame if frame is not None else raising_frame(traceback)
    digest = hashlib.sha256(
        "\x1f".join((kind, where or "", template)).encode("utf-8", "surrogatepass")
    ).hexdigest()
    return Fingerprint(key=digest[:KEY_LENGTH], exception_type=kind, template=template, frame=where)


def _text(value: object) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return None


def split_last_error(last_error: str) -> tuple[str | None, str]:
    """``("Type", "message")`` from an ``x-retry-last-error`` value ``Type: message``."""
    kind, sep, rest = last_error.partition(": ")
    if sep and kind and " " not in kind:
        return kind, rest
    return None, last_error


def fingerprint_headers(headers: Mapping[str, Any] | None) -> Fingerprint:
    """The fingerprint of a parked message, from its failure record headers.

    Reads ``x-exception-type``, ``x-exception-message`` and
    ``x-exception-traceback`` (the parking record); when those are missing
    (a message still in the chain, or one put in a parking queue by something
    other than this library's parking) it falls back to ``x-retry-last-error``
    (``Type: message``). Values may be
    ``str`` or ``bytes``; anything else is ignored.
    """
    headers = headers or {}
    kind = _text(headers.get(_X_EXCEPTION_TYPE))
    message = _text(headers.get(_X_EXCEPTION_MESSAGE))
    last_error = _text(headers.get(_X_LAST_ERROR))
    if last_error is not None and (kind is None or message is None):
        last_kind, last_message = split_last_error(last_error)
        kind = kind if kind is not None else last_kind
        message = message if message is not None else last_message
    return fingerprint(
        exception_type=kind,
        message=message,
        traceback=_text(headers.get(_X_EXCEPTION_TRACEBACK)),
    )
