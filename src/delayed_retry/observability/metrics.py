"""OpenTelemetry metric instruments of delayed-retry, and what each attempt records.

Every instrument's name, unit and attributes, and its Prometheus name:
docs/reference/metrics.md. The queue-depth gauges need a broker connection and live in
:mod:`delayed_retry.observability.gauges`.
"""

from __future__ import annotations

from datetime import datetime

from opentelemetry import metrics
from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider

from delayed_retry.durations import utcnow
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.headers.text import exception_name
from delayed_retry.observability.spans import (
    ATTR_OUTCOME,
    ATTR_PUBLISH_KIND,
    ATTR_REASON,
    ERROR_TYPE,
    INSTRUMENTATION_NAME,
    MESSAGING_DESTINATION_NAME,
    instrumentation_version,
)

__all__ = [
    "ATTEMPTS",
    "DELAY",
    "PARKED",
    "RESOLUTION",
    "RETRIES",
    "SUCCESSES_AFTER_RETRY",
    "THROTTLED",
    "THROTTLE_TRIPS",
    "RetryMetrics",
    "meter_for",
]

ATTEMPTS = "delayed_retry.attempts"
RETRIES = "delayed_retry.retries"
SUCCESSES_AFTER_RETRY = "delayed_retry.successes_after_retry"
PARKED = "delayed_retry.parked"
DELAY = "delayed_retry.delay"
RESOLUTION = "delayed_retry.resolution.duration"
THROTTLED = "delayed_retry.throttled"
"""Consumers of a queue whose throttle has tripped, now (recorded by
:mod:`delayed_retry.consumer.throttle`)."""
THROTTLE_TRIPS = "delayed_retry.throttle.trips"
"""How often a queue's consumer tripped its throttle."""

_UNITS_AND_DESCRIPTIONS: dict[str, tuple[str, str]] = {
    ATTEMPTS: ("{attempt}", "Handling attempts, by queue and outcome."),
    RETRIES: ("{message}", "Retries scheduled into the delay chain, by queue and exception type."),
    SUCCESSES_AFTER_RETRY: (
        "{message}",
        "Messages handled successfully after at least one failure.",
    ),
    PARKED: ("{message}", "Messages parked, by queue, exception type and reason."),
    DELAY: ("s", "Delays chosen for retries and scheduled messages."),
    RESOLUTION: ("s", "Time from a message's first failure to its success or parking."),
}
"""The unit and description of each instrument of :class:`RetryMetrics`, by name."""

# Delays span milliseconds to days: explicit buckets from 10 ms to 7 days.
DELAY_BUCKETS = (
    0.01,
    0.1,
    0.5,
    1.0,
    5.0,
    15.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    4 * 3600.0,
    86400.0,
    7 * 86400.0,
)


def meter_for(provider: MeterProvider | None) -> Meter:
    """The delayed-retry meter of ``provider``, or of the global provider when ``None``."""
    return metrics.get_meter(INSTRUMENTATION_NAME, instrumentation_version(), provider)


def _counter(meter: Meter, name: str) -> Counter:
    """The counter ``name`` on ``meter``, with its unit and description."""
    unit, description = _UNITS_AND_DESCRIPTIONS[name]
    return meter.create_counter(name, unit=unit, description=description)


def _delay_histogram(meter: Meter, name: str) -> Histogram:
    """The histogram ``name`` on ``meter``, in seconds, with the :data:`DELAY_BUCKETS`."""
    unit, description = _UNITS_AND_DESCRIPTIONS[name]
    return meter.create_histogram(
        name, unit=unit, description=description, explicit_bucket_boundaries_advisory=DELAY_BUCKETS
    )


class RetryMetrics:
    """The counters and histograms; one per instrumentation, cheap to record into."""

    def __init__(self, meter: Meter) -> None:
        self.attempts = _counter(meter, ATTEMPTS)
        self.retries = _counter(meter, RETRIES)
        self.successes_after_retry = _counter(meter, SUCCESSES_AFTER_RETRY)
        self.parked = _counter(meter, PARKED)
        self.delay = _delay_histogram(meter, DELAY)
        self.resolution = _delay_histogram(meter, RESOLUTION)

    def record_attempt(
        self,
        state: RetryState,
        *,
        queue: str,
        outcome: str,
        delay: float | None,
        exc: BaseException | None,
        reason: str | None,
        now: datetime | None = None,
    ) -> None:
        """Record how one attempt ended."""
        base = {MESSAGING_DESTINATION_NAME: queue}
        self.attempts.add(1, {**base, ATTR_OUTCOME: outcome})
        if outcome == "retry":
            self.retries.add(1, {**base, ERROR_TYPE: exception_name(exc)})
            if delay is not None:
                self.delay.record(delay, {**base, ATTR_PUBLISH_KIND: "retry"})
        elif outcome == "success" and state.first_failure_at is not None:
            self.successes_after_retry.add(1, base)
            self._resolved(state, base, "success", now)
        elif outcome == "parked":
            self.parked.add(
                1, {**base, ERROR_TYPE: exception_name(exc), ATTR_REASON: reason or "unknown"}
            )
            self._resolved(state, base, "parked", now)

    def _resolved(
        self, state: RetryState, base: dict[str, str], outcome: str, now: datetime | None
    ) -> None:
        start = state.first_failure_at
        elapsed = 0.0 if start is None else ((now or utcnow()) - start).total_seconds()
        self.resolution.record(max(elapsed, 0.0), {**base, ATTR_OUTCOME: outcome})

    def record_schedule(self, *, queue: str, delay: float) -> None:
        """Record a :func:`~delayed_retry.publish_delayed` delay."""
        self.delay.record(
            max(delay, 0.0), {MESSAGING_DESTINATION_NAME: queue, ATTR_PUBLISH_KIND: "schedule"}
        )
