"""``--metrics-port``: the OpenTelemetry metrics of a service, exported for Prometheus.

Installs an SDK ``MeterProvider`` with the Prometheus reader as the global provider, so the
library's ``delayed_retry.*`` instruments are exported, and adds the service's own
(``delayed_retry.service.*``), read from its counters at each scrape, each with the
attribute ``service``. The list of series: docs/reference/metrics.md. Needs the ``service``
extra (``opentelemetry-sdk``, ``opentelemetry-exporter-prometheus``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from delayed_retry.cli import output
from delayed_retry.cli.service_http import Reply

__all__ = [
    "CONSUMERS_RESTORED",
    "HELD_UNTIL_DUE",
    "MESSAGES",
    "READY",
    "RECONNECTS",
    "ServiceMetrics",
]

MESSAGES = "delayed_retry.service.messages"
HELD_UNTIL_DUE = "delayed_retry.service.held_until_due"
READY = "delayed_retry.service.ready"
RECONNECTS = "delayed_retry.service.reconnects"
CONSUMERS_RESTORED = "delayed_retry.service.consumers_restored"

_DESCRIPTIONS = {
    MESSAGES: "Messages this service handled, by outcome.",
    HELD_UNTIL_DUE: "Messages held now because they left the chain a little early.",
    READY: "1 while the readiness probe answers 200.",
    RECONNECTS: "Times the connection to the broker was lost and made again.",
    CONSUMERS_RESTORED: "Consumers found in place again after their channel reopened.",
}
"""What each of the service's own series says of itself (its HELP line)."""

_MODULES = ("opentelemetry.sdk.metrics", "opentelemetry.exporter.prometheus", "prometheus_client")


class ServiceMetrics:
    """The global meter provider of a service process, and its ``/metrics`` page.

    Make one per process, before the service starts: it replaces the global
    meter provider (OpenTelemetry allows that once per process).
    """

    def __init__(
        self,
        *,
        service: str,
        counts: Callable[[], Mapping[str, int]],
        held: Callable[[], int],
        ready: Callable[[], bool],
        reconnects: Callable[[], int] = lambda: 0,
        restored: Callable[[], int] = lambda: 0,
    ) -> None:
        output.require_extra("service", _MODULES, what="--metrics-port")
        from opentelemetry import metrics
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from opentelemetry.metrics import CallbackOptions, Observation
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.resources import Resource
        from prometheus_client import REGISTRY

        self._registry = REGISTRY
        attrs = {"service": service}
        self.provider = MeterProvider(
            metric_readers=[PrometheusMetricReader()],
            resource=Resource.create({"service.name": f"delayed-retry-{service}"}),
        )
        metrics.set_meter_provider(self.provider)
        meter = self.provider.get_meter("delayed_retry.service")

        def messages(_: CallbackOptions) -> Iterable[Observation]:
            return [Observation(n, {**attrs, "outcome": k}) for k, n in counts().items()]

        def one(read: Callable[[], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
            return lambda _: [Observation(read(), attrs)]

        for create, name, callback, unit in (
            (meter.create_observable_counter, MESSAGES, messages, "{message}"),
            (meter.create_observable_gauge, HELD_UNTIL_DUE, one(held), "{message}"),
            (meter.create_observable_gauge, READY, one(lambda: 1 if ready() else 0), ""),
            (meter.create_observable_counter, RECONNECTS, one(reconnects), "{reconnect}"),
            (meter.create_observable_counter, CONSUMERS_RESTORED, one(restored), "{consumer}"),
        ):
            create(name, callbacks=[callback], unit=unit, description=_DESCRIPTIONS[name])

    def page(self) -> Reply:
        """The Prometheus text exposition of every metric of the process."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        registry: Any = self._registry
        return Reply(status=200, body=generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

    def shutdown(self) -> None:
        """Stop the provider (its reader unregisters from the Prometheus registry)."""
        self.provider.shutdown()
