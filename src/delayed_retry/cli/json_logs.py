"""``--log-format json``: one JSON object per log line, for log collectors.

Each line has ``time`` (UTC, ISO 8601), ``level``, ``logger`` and
``message``, plus ``exception`` when one is logged and any ``extra=``
fields a caller passed under :data:`FIELDS_ATTR`.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

__all__ = ["FIELDS_ATTR", "JsonFormatter"]

FIELDS_ATTR = "fields"
"""``logger.info(..., extra={"fields": {...}})`` adds these keys to the JSON line."""


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON; use it for any handler of a service."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, FIELDS_ATTR, None)
        if isinstance(fields, dict):
            line.update(fields)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)
