"""Where the library's lines about one delivery go: its own loggers, or the framework's.

A framework that logs every delivery in a form of its own (FastStream's ``| queue | id -``
lines, through the logger the application gave it) sets :data:`DELIVERY_LOG` for the
delivery, so the library's lines about that message (retried, parked) read like the
framework's, in the same place, instead of bare text on a logger nobody configured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextvars import ContextVar

__all__ = ["DELIVERY_LOG", "log_delivery"]

DELIVERY_LOG: ContextVar[Callable[[int, str], None] | None] = ContextVar(
    "delayed_retry_delivery_log", default=None
)
"""The writer of the delivery being handled (level, text), or ``None``: the package's loggers."""


def log_delivery(logger: logging.Logger, level: int, message: str, *args: object) -> None:
    """Log a line about the delivery being handled, where :data:`DELIVERY_LOG` says."""
    write = DELIVERY_LOG.get()
    if write is None:
        logger.log(level, message, *args)
    else:
        write(level, message % args if args else message)
