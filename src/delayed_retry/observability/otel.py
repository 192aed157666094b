"""OpenTelemetry implementation of :class:`~delayed_retry.Instrumentation`.

Pass an :class:`OpenTelemetryInstrumentation` with explicit providers to
``@with_delayed_retry(instrumentation=...)`` and ``publish_delayed`` when the
application does not use the global providers (tests do this with the SDK's
in-memory exporter and reader). Without one, the middleware uses
:func:`default_instrumentation`: this class on the
global providers, a no-op until an SDK is configured.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aio_pika.abc import AbstractIncomingMessage
from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider, NoOpMeterProvider
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import TracerProvider

from delayed_retry.headers.names import X_TRACE_ORIGIN
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.observability.instrumentation import Instrumentation, Outcome, PublishKind
from delayed_retry.observability.metrics import RetryMetrics, meter_for
from delayed_retry.observability.spans import (
    HEADER_GETTER,
    HEADER_SETTER,
    W3C,
    AttemptSpan,
    attempt_span,
    global_propagator,
    producer_span,
    publish_attributes,
    tracer_for,
)

__all__ = ["OpenTelemetryInstrumentation", "default_instrumentation"]

try:  # the API's stand-in until an SDK is set; not exported, hence the guard
    from opentelemetry.metrics._internal import _ProxyMeterProvider

    _QUIET_METERS: tuple[type, ...] = (NoOpMeterProvider, _ProxyMeterProvider)
except ImportError:  # pragma: no cover - another API version: never assume quiet
    _QUIET_METERS = ()
_QUIET_TRACERS: tuple[type, ...] = (trace.NoOpTracerProvider, trace.ProxyTracerProvider)

RECHECK_SECONDS = 1.0
"""How often a quiet instrumentation looks again whether an SDK has been set up."""


@dataclass(eq=False)
class _Scope:
    """One attempt: its span, and the metrics recorded when it finishes."""

    owner: OpenTelemetryInstrumentation
    span: AttemptSpan
    message: AbstractIncomingMessage
    state: RetryState
    finished: bool = False

    @contextmanager
    def publishing(
        self, headers: dict[str, Any], *, kind: PublishKind, exchange: str, routing_key: str
    ) -> Iterator[None]:
        if X_TRACE_ORIGIN not in headers:
            origin = self._origin()
            if origin is not None:
                headers[X_TRACE_ORIGIN] = origin
        attrs = publish_attributes(
            exchange=exchange,
            routing_key=routing_key,
            kind=kind,
            queue=self.span.queue,
            message_id=self.message.message_id,
            conversation_id=self.message.correlation_id,
        )
        with producer_span(
            self.owner.tracer, self.owner.propagator, headers, attrs, exchange=exchange
        ):
            yield

    def _origin(self) -> str | None:
        """``traceparent`` of the first failing delivery: the one it arrived with, or its span."""
        carrier: dict[str, Any] = {}
        incoming = self.owner.propagator.extract(self.message.headers or {}, getter=HEADER_GETTER)
        if trace.get_current_span(incoming).get_span_context().is_valid:
            W3C.inject(carrier, context=incoming, setter=HEADER_SETTER)
        elif self.span.span.get_span_context().is_valid:
            W3C.inject(
                carrier, context=trace.set_span_in_context(self.span.span), setter=HEADER_SETTER
            )
        value = carrier.get("traceparent")
        return value if isinstance(value, str) else None

    def finish(
        self,
        outcome: Outcome,
        *,
        delay: float | None = None,
        exc: BaseException | None = None,
        reason: str | None = None,
    ) -> None:
        if self.finished:
            return
        self.finished = True
        self.span.finish(outcome, delay=delay, exc=exc, reason=reason)
        self.owner.metrics.record_attempt(
            self.state,
            queue=self.span.queue,
            outcome=outcome,
            delay=delay,
            exc=exc,
            reason=reason,
        )


class OpenTelemetryInstrumentation:
    """Spans and metrics for every handling attempt, retry, parking and scheduled publish.

    Use it like opentelemetry-python-contrib's instrumentations: give
    ``tracer_provider``, ``meter_provider`` and ``propagator`` explicitly, or
    leave them out to use the global ones (looked up when the instrumentation
    is made; the API's proxies follow an SDK configured later). No
    monkeypatching: the middleware calls it.
    """

    def __init__(
        self,
        *,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self.tracer = tracer_for(tracer_provider)
        self.metrics = RetryMetrics(meter_for(meter_provider))
        self._propagator = propagator
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._on = False
        self._quiet_until = 0.0

    @property
    def meter_provider(self) -> MeterProvider | None:
        """The meter provider given, or ``None`` for the global one (other instruments share it)."""
        return self._meter_provider

    def enabled(self) -> bool:
        """Whether spans or metrics are recorded now.

        False while both providers are the API's no-ops (no SDK configured yet):
        the middleware then skips this instrumentation entirely, so a message
        costs no telemetry work at all. Checked per message, so an SDK set up
        later is picked up (within :data:`RECHECK_SECONDS`; looking the global
        providers up reads the environment, too slow for every message). Trace
        context in the headers still travels on retries, since the retry copy
        keeps the original headers.
        """
        if self._on:  # a provider, once set, is never unset
            return True
        now = time.monotonic()
        if now < self._quiet_until:
            return False
        tracers = self._tracer_provider or trace.get_tracer_provider()
        meters = self._meter_provider or metrics.get_meter_provider()
        self._on = not (isinstance(tracers, _QUIET_TRACERS) and isinstance(meters, _QUIET_METERS))
        self._quiet_until = now + RECHECK_SECONDS
        return self._on

    @property
    def propagator(self) -> TextMapPropagator:
        """The propagator given, or the global one at the time of use."""
        return self._propagator or global_propagator()

    @contextmanager
    def attempt(
        self, message: AbstractIncomingMessage, state: RetryState, *, queue: str
    ) -> Iterator[_Scope]:
        with attempt_span(self.tracer, self.propagator, message, state, queue=queue) as span:
            yield _Scope(self, span, message, state)

    @contextmanager
    def scheduling(
        self, headers: dict[str, Any], *, queue: str, exchange: str, routing_key: str, delay: float
    ) -> Iterator[None]:
        attrs = publish_attributes(
            exchange=exchange, routing_key=routing_key, kind="schedule", queue=queue, delay=delay
        )
        with producer_span(self.tracer, self.propagator, headers, attrs, exchange=exchange):
            yield
        self.metrics.record_schedule(queue=queue, delay=delay)


_default: Instrumentation | None = None


def default_instrumentation() -> Instrumentation:
    """The instrumentation used when none is given: OpenTelemetry on the global providers.

    Made once and cached. The API's global providers are proxies, so spans and
    metrics start flowing when an SDK is configured, even later; until then
    it costs only the API's no-op.
    """
    global _default
    if _default is None:
        _default = OpenTelemetryInstrumentation()
    return _default
