"""FastStream's RabbitTelemetryMiddleware and the library's telemetry together: one trace."""

from __future__ import annotations

import asyncio

import pytest
from faststream.rabbit import RabbitBroker
from faststream.rabbit.opentelemetry import RabbitTelemetryMiddleware
from opentelemetry.trace import SpanKind
from tenacity import wait_fixed

from delayed_retry.faststream import CurrentRetryState, DelayedRetry
from tests.faststream.test_middleware_broker import queue_of, running
from tests.support.chain import Scenario
from tests.support.telemetry import Telemetry

pytestmark = pytest.mark.broker


async def test_one_trace_per_message_and_its_retries_without_duplicate_spans(
    quorum: Scenario, rabbitmq_url: str, telemetry: Telemetry
) -> None:
    retrier = DelayedRetry(
        topology=quorum.topology,
        max_retries=2,
        wait=wait_fixed(0.3),
        instrumentation=telemetry.instrumentation,
    )
    faststream_tracing = RabbitTelemetryMiddleware(tracer_provider=telemetry.tracer_provider)
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[faststream_tracing, retrier])
    queue = queue_of(quorum, "traced")
    done = asyncio.Event()

    @broker.subscriber(queue)
    async def handle(body: str, state: CurrentRetryState) -> None:
        if state.attempt == 1:
            raise RuntimeError("fails once")
        done.set()

    async with running(broker):
        await broker.publish("job", queue.name)
        await asyncio.wait_for(done.wait(), 15)

    spans = telemetry.spans()
    assert len({s.context.trace_id for s in spans if s.context is not None}) == 1, [
        (s.name, s.kind) for s in spans
    ]
    process = [s for s in spans if s.kind is SpanKind.CONSUMER and "process" in s.name]
    # One consumer span per attempt (FastStream's, carrying the library's attributes).
    assert len(process) == 2, [(s.name, dict(s.attributes or {})) for s in process]
    attempts = [(s.attributes or {}).get("delayed_retry.attempt") for s in process]
    assert sorted(map(str, attempts)) == ["1", "2"]
    retries = [s for s in spans if s.kind is SpanKind.PRODUCER and s.parent is not None]
    assert any(s.parent.span_id == process[0].context.span_id for s in retries if s.parent)


async def test_each_immediate_rerun_is_a_child_span_of_faststreams_consumer_span(
    quorum: Scenario, rabbitmq_url: str, telemetry: Telemetry
) -> None:
    retrier = DelayedRetry(
        topology=quorum.topology,
        immediate_retries=2,
        max_retries=2,
        wait=wait_fixed(0.3),
        instrumentation=telemetry.instrumentation,
    )
    faststream_tracing = RabbitTelemetryMiddleware(tracer_provider=telemetry.tracer_provider)
    broker = RabbitBroker(rabbitmq_url, logger=None, middlewares=[faststream_tracing, retrier])
    queue = queue_of(quorum, "traced-immediate")
    done = asyncio.Event()

    @broker.subscriber(queue)
    async def handle(body: str, state: CurrentRetryState) -> None:
        if state.immediate_retries < 2:
            raise RuntimeError(f"run {state.immediate_retries + 1}")
        done.set()

    async with running(broker):
        await broker.publish("job", queue.name)
        await asyncio.wait_for(done.wait(), 15)
        await quorum.wait_for_depth(queue.name, 0)

    spans = telemetry.spans()
    assert len({s.context.trace_id for s in spans if s.context is not None}) == 1
    process = [s for s in spans if s.kind is SpanKind.CONSUMER and "process" in s.name]
    assert len(process) == 3, [(s.name, dict(s.attributes or {})) for s in process]
    reruns = [s for s in process if (s.attributes or {}).get("delayed_retry.immediate_retry")]
    (first,) = [s for s in process if s not in reruns]
    numbers = [(s.attributes or {}).get("delayed_retry.immediate_retry") for s in reruns]
    assert sorted(str(n) for n in numbers) == ["1", "2"]
    assert all(s.parent is not None and s.parent.span_id == first.context.span_id for s in reruns)
    outcomes = sorted(str((s.attributes or {}).get("delayed_retry.outcome")) for s in process)
    assert outcomes == ["immediate-retry", "immediate-retry", "success"]
