"""Helpers for the telemetry and alert tests: the SDK in memory, topology clean-up, waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiormq
from aio_pika.abc import AbstractChannel, AbstractRobustConnection
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, MetricsData
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from delayed_retry import DelayTopology
from delayed_retry.observability.otel import OpenTelemetryInstrumentation


@dataclass
class Telemetry:
    """An SDK tracer and meter provider recording in memory, and the instrumentation on them."""

    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    instrumentation: OpenTelemetryInstrumentation

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def metrics(self) -> dict[str, list[Any]]:
        """Data points by metric name."""
        data: MetricsData | None = self.reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        if data is None:
            return out
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out

    def shutdown(self) -> None:
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def make_telemetry() -> Telemetry:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    return Telemetry(
        exporter=exporter,
        reader=reader,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        instrumentation=OpenTelemetryInstrumentation(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            propagator=TraceContextTextMapPropagator(),
        ),
    )


async def delete_everything(
    connection: AbstractRobustConnection, topology: DelayTopology, queues: list[str]
) -> None:
    """Delete the topology's queues and exchanges and ``queues`` (with their parking queues)."""
    channel = await connection.channel()
    names = [spec.name for spec in topology.queues()]
    for q in queues:
        names += [q, topology.default_parking_queue(q)]
    underlay = await channel.get_underlay_channel()
    for name in names:
        with contextlib.suppress(aiormq.exceptions.AMQPError):
            await underlay.queue_delete(name)
    for ex in topology.exchanges():
        with contextlib.suppress(aiormq.exceptions.AMQPError):
            await underlay.exchange_delete(ex.name)
    with contextlib.suppress(Exception):
        await channel.close()


async def depth(connection: AbstractRobustConnection, name: str) -> int:
    """Ready messages in queue ``name`` (a passive declare on a channel of its own)."""
    channel: AbstractChannel = await connection.channel()
    try:
        queue = await channel.declare_queue(name, passive=True)
        result = queue.declaration_result.message_count
        return int(result or 0)
    finally:
        await channel.close()


async def wait_until(
    check: Callable[[], Awaitable[bool]], *, timeout: float = 15.0, what: str = "condition"
) -> None:
    """Poll ``check`` until it is true; fail after ``timeout`` seconds."""

    async def loop() -> None:
        while not await check():
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(loop(), timeout)
    except TimeoutError:
        raise AssertionError(f"timed out after {timeout} s waiting for {what}") from None


@contextlib.asynccontextmanager
async def cleaned(
    connection: AbstractRobustConnection, topology: DelayTopology, queues: list[str]
) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await delete_everything(connection, topology, queues)
