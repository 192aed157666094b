"""Where alerts go: a Python callback, the logging module, a webhook.

A sink's ``send`` raises when the alert was not delivered;
:func:`deliver` retries it (tenacity) and :class:`~delayed_retry.alerts.ParkingAlerts`
acks the parked messages only once every sink has succeeded.
"""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt
from tenacity.wait import wait_base, wait_exponential

from delayed_retry.alerts.grouping import Alert
from delayed_retry.durations import Duration, to_seconds
from delayed_retry.errors import ConfigurationError, DelayedRetryError

__all__ = [
    "DEFAULT_SINK_RETRY",
    "AlertSink",
    "AlertSinkError",
    "CallbackSink",
    "LoggingSink",
    "SinkRetry",
    "WebhookSink",
    "deliver",
]

log = logging.getLogger(__name__)


class AlertSinkError(DelayedRetryError):
    """A sink could not deliver an alert (after its retries)."""


@runtime_checkable
class AlertSink(Protocol):
    """Anything with ``async send(alert)``, raising when the alert was not delivered."""

    async def send(self, alert: Alert) -> None: ...


@dataclass(frozen=True, kw_only=True)
class SinkRetry:
    """How often a failing sink is tried for one alert, and how long to wait between tries."""

    attempts: int = 5
    wait: wait_base = field(default_factory=lambda: wait_exponential(multiplier=0.5, max=30))

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError(f"SinkRetry attempts={self.attempts!r} must be at least 1")


DEFAULT_SINK_RETRY = SinkRetry()
"""Five tries, 0.5 s doubling up to 30 s between them."""


async def deliver(sink: AlertSink, alert: Alert, *, retry: SinkRetry = DEFAULT_SINK_RETRY) -> None:
    """Send ``alert`` to ``sink``, retrying; raises :class:`AlertSinkError` when all tries fail."""
    try:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(retry.attempts),
            wait=retry.wait,
            retry=retry_if_exception_type(Exception),
            reraise=True,
            before_sleep=lambda rs: log.warning(
                "alert sink %r failed (try %d of %d): %r; trying again",
                sink,
                rs.attempt_number,
                retry.attempts,
                rs.outcome.exception() if rs.outcome else None,
            ),
        ):
            with attempt:
                await sink.send(alert)
    except Exception as exc:
        raise AlertSinkError(
            f"alert sink {sink!r} failed {retry.attempts} time(s), last with {exc!r}"
        ) from exc


class CallbackSink:
    """Calls ``fn(alert)``: sync or async. Use it to route alerts into your own code."""

    def __init__(self, fn: Callable[[Alert], Awaitable[object] | object]) -> None:
        if not callable(fn):
            raise ConfigurationError(f"CallbackSink needs a callable, got {fn!r}")
        self.fn = fn

    def __repr__(self) -> str:
        return f"CallbackSink({getattr(self.fn, '__qualname__', self.fn)!r})"

    async def send(self, alert: Alert) -> None:
        result = self.fn(alert)
        if inspect.isawaitable(result):
            await result


class LoggingSink:
    """Logs each alert (default: WARNING on ``delayed_retry.alerts``), for log-based alerting."""

    def __init__(self, *, logger: logging.Logger | None = None, level: int = logging.WARNING):
        self.logger = logger or logging.getLogger("delayed_retry.alerts")
        self.level = level

    def __repr__(self) -> str:
        return f"LoggingSink(logger={self.logger.name!r})"

    async def send(self, alert: Alert) -> None:
        self.logger.log(self.level, "%s", alert.text(), extra={"alert": alert.to_json()})


def _aiohttp() -> ModuleType:
    try:
        import aiohttp
    except ImportError as exc:  # the optional extra is missing
        raise ConfigurationError(
            "WebhookSink needs aiohttp, which is not installed; install it with "
            "pip install 'delayed-retry[webhook]'"
        ) from exc
    return aiohttp


class WebhookSink:
    """POSTs each alert as JSON to ``url``; ``slack=True`` sends a Slack-compatible payload.

    Any answer other than 2xx, a timeout or a connection error counts as a
    failure (retried by :func:`deliver`). Needs the ``webhook`` extra.
    """

    def __init__(
        self,
        url: str,
        *,
        slack: bool = False,
        timeout: Duration = 10.0,
        headers: dict[str, str] | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"WebhookSink url={url!r} must start with http:// or https://")
        self._aiohttp = _aiohttp()
        self.url = url
        self.slack = slack
        self.timeout = to_seconds(timeout, name="WebhookSink timeout")
        self.headers = dict(headers or {})

    def __repr__(self) -> str:
        return f"WebhookSink({self.url.split('?')[0]!r}, slack={self.slack})"

    def payload(self, alert: Alert) -> dict[str, Any]:
        """The JSON body sent for ``alert``."""
        return alert.to_slack() if self.slack else alert.to_json()

    async def send(self, alert: Alert) -> None:
        aiohttp: Any = self._aiohttp
        body = json.dumps(self.payload(alert)).encode()
        headers = {"Content-Type": "application/json", **self.headers}
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(self.url, data=body, headers=headers) as response,
        ):
            if not 200 <= response.status < 300:
                text = (await response.text())[:200]
                raise AlertSinkError(
                    f"webhook {self.url.split('?')[0]!r} answered {response.status}: {text!r}"
                )
