"""Text the library writes for people: valid UTF-8, bounded, exceptions spelled one way.

Use these wherever a failure or a body becomes text in a header, a log line,
a span or a report: :func:`exception_name` is the one spelling of an
exception type (the ``x-exception-type`` header, the ``error.type`` span
attribute and the metrics' labels all use it).
"""

from __future__ import annotations

import base64

__all__ = [
    "MAX_ERROR_CHARS",
    "MAX_TRACEBACK_CHARS",
    "TRUNCATED",
    "bounded",
    "describe_exception",
    "encode_body_preview",
    "exception_name",
    "exception_text",
    "header_text",
    "utf8",
]

MAX_ERROR_CHARS = 2_000
"""Longest exception text (``Type: message``, or the message alone) a header carries."""
MAX_TRACEBACK_CHARS = 8_000
"""Longest traceback a parking record carries (the innermost frames are kept)."""
TRUNCATED = "…[truncated]"
"""What marks text that was cut."""


def utf8(text: str) -> str:
    """``text`` as UTF-8 can carry it: lone surrogates (from ``surrogateescape``) replaced."""
    if text.isascii():  # most header text: no surrogate possible, no encoding needed
        return text
    try:
        text.encode()
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace").decode()
    return text


def header_text(value: object) -> str | None:
    """A header value as text: a string as it is, bytes decoded as UTF-8 (bad bytes replaced),
    ``None`` for anything else (a missing header, a number, a table)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return None


def bounded(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` in at most ``limit`` characters, marked where cut; ``keep_end`` keeps its end."""
    text = utf8(text)  # an OSError's message may carry lone surrogates from a file name
    if len(text) <= limit:
        return text
    if keep_end:
        return TRUNCATED + text[-(limit - len(TRUNCATED)) :]
    return text[: limit - len(TRUNCATED)] + TRUNCATED


def exception_name(exc: BaseException | None) -> str:
    """Qualified name of ``exc``'s type, ``builtins`` left out; ``"unknown"`` for ``None``.

    The one spelling of an exception type: the ``x-exception-type`` header,
    the ``error.type`` span attribute and the metrics' labels all use it.
    """
    if exc is None:
        return "unknown"
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def exception_text(exc: BaseException) -> str:
    """``str(exc)``, or a placeholder when the exception's ``__str__`` itself fails."""
    try:
        return str(exc)
    except Exception as err:
        return f"<str() of {exception_name(exc)} raised {type(err).__name__}>"


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` of ``exc``, bounded."""
    return bounded(f"{exception_name(exc)}: {exception_text(exc)}", MAX_ERROR_CHARS)


def encode_body_preview(body: bytes, limit: int = 200) -> str:
    """A printable preview of a body: UTF-8 text when it is, base64 otherwise."""
    chunk = body[:limit]
    try:
        return chunk.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(chunk).decode("ascii")
