"""Follow a retried message in one trace, count it, and get an alert when one gives up.

Two payments are consumed with ``@with_delayed_retry``: one fails twice and
then succeeds, the other keeps failing and is parked. The example prints the
trace (every attempt is a span of the trace the publish started), the metric
values, the queue depths the gauges report, and the alert ``ParkingAlerts``
delivers for the parked one. It finishes by itself.

Run it with a broker of your own: ``RABBITMQ_URL=amqp://guest:guest@localhost:5672/
python examples/tracing_and_alerts.py``; without ``RABBITMQ_URL`` it starts a
throwaway RabbitMQ node and removes it at the end.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage
from opentelemetry import propagate
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from tenacity import wait_fixed

from delayed_retry import (
    Alert,
    CallbackSink,
    ChainMonitor,
    DelayTopology,
    LoggingSink,
    OpenTelemetryInstrumentation,
    ParkingAlerts,
    SinkRetry,
    consume,
    declare_topology,
    with_delayed_retry,
)
from harness import broker_url

PREFIX = "delayed-retry-example"
QUEUE = f"{PREFIX}.payments"


class GatewayDown(Exception):
    """The payment gateway did not answer."""


def print_trace(spans: Sequence[ReadableSpan]) -> None:
    """Each span under its parent, with the attributes that tell the story."""
    children: dict[int | None, list[ReadableSpan]] = {}
    ids = {s.context.span_id for s in spans if s.context}
    for span in sorted(spans, key=lambda s: s.start_time or 0):
        parent = span.parent.span_id if span.parent and span.parent.span_id in ids else None
        children.setdefault(parent, []).append(span)

    def show(span: ReadableSpan, depth: int) -> None:
        attrs = span.attributes or {}
        notes = [
            f"{key.split('.')[-1]}={attrs[key]!s}"
            for key in (
                "delayed_retry.attempt",
                "delayed_retry.outcome",
                "delayed_retry.delay",
                "delayed_retry.publish.kind",
                "error.type",
            )
            if key in attrs
        ]
        links = f" links→{len(span.links)}" if span.links else ""
        kind = span.kind.name.lower()
        print(f"  {'  ' * depth}{span.name} [{kind}] {' '.join(notes)}{links}")
        for child in children.get(span.context.span_id if span.context else None, []):
            show(child, depth + 1)

    for root in children.get(None, []):
        show(root, 0)


def print_metrics(reader: InMemoryMetricReader) -> None:
    data = reader.get_metrics_data()
    if data is None:
        return
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if not metric.name.startswith("delayed_retry."):
                    continue
                for point in metric.data.data_points:
                    attrs = ", ".join(
                        f"{k}={v!s}" for k, v in sorted((point.attributes or {}).items())
                    )
                    value: Any = getattr(point, "value", None)
                    if value is None:
                        value = f"count={point.count} sum={point.sum:.3f}"  # type: ignore[union-attr]
                    if value in (0, None):
                        continue
                    print(f"  {metric.name} {{{attrs}}} {value}")


async def run(url: str) -> int:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = OpenTelemetryInstrumentation(
        tracer_provider=tracer_provider, meter_provider=meter_provider
    )
    topology = DelayTopology(prefix=PREFIX, levels=20)
    connection = await aio_pika.connect_robust(url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(QUEUE, durable=True)
        await queue.purge()
        await declare_topology(channel, topology, queues=[QUEUE])
        parking_name = topology.default_parking_queue(QUEUE)
        await (await channel.declare_queue(parking_name, passive=True)).purge()
        await (await channel.declare_queue(topology.alerts_queue, passive=True)).purge()

        healed = asyncio.Event()
        alerted: asyncio.Queue[Alert] = asyncio.Queue()

        @with_delayed_retry(
            max_retries=2, wait=wait_fixed(0.3), topology=topology, instrumentation=telemetry
        )
        async def pay(message: AbstractIncomingMessage) -> None:
            retries = message.headers.get("x-retry", 0)
            if message.message_id == "pay-doomed" or not isinstance(retries, int) or retries < 2:
                raise GatewayDown(f"gateway timeout for {message.message_id}")
            healed.set()

        tag = await consume(queue, pay)

        # The producer side: a span of its own whose context travels in the headers.
        tracer = tracer_provider.get_tracer("checkout")
        for message_id in ("pay-heals", "pay-doomed"):
            headers: dict[str, Any] = {}
            with tracer.start_as_current_span(f"checkout {message_id}", kind=SpanKind.PRODUCER):
                propagate.inject(headers)
                await channel.default_exchange.publish(
                    aio_pika.Message(b'{"amount": 42}', message_id=message_id, headers=headers),
                    routing_key=QUEUE,
                )

        alerts = ParkingAlerts(
            connection,
            sinks=[CallbackSink(alerted.put), LoggingSink()],
            topology=topology,
            window=1.0,
            sink_retry=SinkRetry(attempts=3),
        )
        monitor = ChainMonitor(
            url=url,
            topology=topology,
            parking_queues=[parking_name],
            interval=1.0,
            meter_provider=meter_provider,
        )
        async with alerts, monitor:
            await asyncio.wait_for(healed.wait(), 30)
            alert = await asyncio.wait_for(alerted.get(), 30)
            await monitor.refresh()
            print("\nAlert delivered by ParkingAlerts:")
            print("  " + alert.text().replace("\n", "\n  "))
            print("\nSpans (one trace per payment; every attempt is a span in it):")
            print_trace(spans.get_finished_spans())
            print("\nMetrics:")
            print_metrics(reader)
        await queue.cancel(tag)
        await (await channel.declare_queue(parking_name, passive=True)).purge()
    tracer_provider.shutdown()
    meter_provider.shutdown()
    trace_ids = {s.context.trace_id for s in spans.get_finished_spans() if s.context}
    print(f"\n{len(trace_ids)} traces, {len(spans.get_finished_spans())} spans; done.")
    return 0


def main() -> int:
    with broker_url() as url:
        return asyncio.run(run(url))


if __name__ == "__main__":
    sys.exit(main())
