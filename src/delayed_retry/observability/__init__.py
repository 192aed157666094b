"""Observability: what the middleware reports, and how it reaches OpenTelemetry.

- :mod:`~delayed_retry.observability.instrumentation`: the protocol the
  middleware reports through, and :class:`NoInstrumentation`. No OpenTelemetry.
- :mod:`~delayed_retry.observability.otel`: the OpenTelemetry implementation,
  and the default instrumentation built from it.
- :mod:`~delayed_retry.observability.spans`: span names, attributes and
  trace-context propagation through message headers.
- :mod:`~delayed_retry.observability.metrics`: counters and histograms of attempts.
- :mod:`~delayed_retry.observability.gauges`: :class:`ChainMonitor`, gauges
  of queue depths read from the broker.
"""
