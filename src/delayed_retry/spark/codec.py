"""AMQP headers as JSON text and back, losslessly enough to archive and re-publish. Pure.

Plain JSON values stay as they are. Others are tagged objects of one key:
``{"$bytes": "<base64>"}``, ``{"$datetime": "<ISO 8601>"}``,
``{"$decimal": "<text>"}``, ``{"$repr": "<repr>"}`` (anything else, kept
as text). A header that is not a mapping archives as ``{}``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["headers_from_json", "headers_to_json", "message_key"]

_MAX_DEPTH = 16


def _encode(value: object, depth: int) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$repr": repr(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": base64.b64encode(bytes(value)).decode("ascii")}
    if isinstance(value, datetime):
        return {"$datetime": value.isoformat()}
    if isinstance(value, Decimal):
        return {"$decimal": str(value)}
    if depth >= _MAX_DEPTH:
        return {"$repr": repr(value)[:1000]}
    if isinstance(value, Mapping):
        return {str(k): _encode(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encode(v, depth + 1) for v in value]
    return {"$repr": repr(value)[:1000]}


def headers_to_json(headers: object) -> str:
    """``headers`` as deterministic JSON text (sorted keys); ``{}`` when not a mapping."""
    if not isinstance(headers, Mapping):
        return "{}"
    return json.dumps(_encode(headers, 0), sort_keys=True, ensure_ascii=False)


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, inner),) = value.items()
        if tag == "$bytes" and isinstance(inner, str):
            return base64.b64decode(inner)
        if tag == "$datetime" and isinstance(inner, str):
            try:
                return datetime.fromisoformat(inner)
            except ValueError:
                return inner
        if tag == "$decimal" and isinstance(inner, str):
            try:
                return Decimal(inner)
            except InvalidOperation:
                return inner
        if tag == "$repr" and isinstance(inner, str):
            return inner
    return {k: _decode(v) for k, v in value.items()}


def headers_from_json(text: str | None) -> dict[str, Any]:
    """The headers archived as ``text``; ``{}`` for empty, invalid or non-object JSON."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    decoded = _decode(value)
    return decoded if isinstance(decoded, dict) else {}


def message_key(exchange: str, routing_key: str, headers_json: str, body: bytes) -> str:
    """A stable key of one archived message: duplicates of it (a redelivery) share it."""
    digest = hashlib.sha256()
    for part in (exchange.encode(), routing_key.encode(), headers_json.encode(), body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()
