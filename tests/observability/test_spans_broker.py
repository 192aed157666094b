"""Spans of every attempt and hand-over, against a real broker and the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import (
    Getter,
    Setter,
    TextMapPropagator,
    default_getter,
    default_setter,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from tenacity import wait_fixed

from delayed_retry import DelayTopology, consume, publish_delayed, with_delayed_retry
from delayed_retry.headers import (
    X_TRACE_ORIGIN,
)
from delayed_retry.observability.otel import OpenTelemetryInstrumentation, default_instrumentation
from delayed_retry.observability.spans import (
    HeaderGetter,
)
from tests.support.failures import Flaky
from tests.support.telemetry import Telemetry

pytestmark = pytest.mark.broker


def consumer_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    found = [s for s in spans if s.kind is SpanKind.CONSUMER]
    return sorted(found, key=lambda s: s.attributes["delayed_retry.attempt"])  # type: ignore[arg-type,index,return-value]


async def publish_traced(
    channel: aio_pika.abc.AbstractChannel,
    telemetry: Telemetry,
    queue: str,
    *,
    message_id: str,
    correlation_id: str | None = None,
) -> trace.SpanContext:
    """Publish as an instrumented producer does: a PRODUCER span, its context in the headers."""
    tracer = telemetry.tracer_provider.get_tracer("test-producer")
    headers: dict[str, object] = {}
    with tracer.start_as_current_span("publish orders", kind=SpanKind.PRODUCER) as span:
        TraceContextTextMapPropagator().inject(headers)
        await channel.default_exchange.publish(
            aio_pika.Message(
                b'{"order": 1}',
                message_id=message_id,
                correlation_id=correlation_id,
                headers=headers,  # type: ignore[arg-type]
            ),
            routing_key=queue,
        )
    return span.get_span_context()


async def test_retries_are_spans_of_the_publishers_trace_with_links_and_attributes(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, telemetry: Telemetry
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(f"{unique}.q", durable=True)
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @with_delayed_retry(
        max_retries=3,
        wait=wait_fixed(0.05),
        topology=topology,
        instrumentation=telemetry.instrumentation,
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        # The handler runs inside the attempt's span: its own spans are children.
        assert trace.get_current_span().get_span_context().is_valid
        state = message.headers.get("x-retry", 0)
        assert isinstance(state, int)
        if state < 2:
            raise Flaky(f"not yet ({state})")
        done.set_result(None)

    await consume(queue, handle)
    origin = await publish_traced(
        channel, telemetry, queue.name, message_id="m-1", correlation_id="conv-7"
    )
    await asyncio.wait_for(done, 15)

    async def three_consumer_spans() -> list[ReadableSpan]:
        while len(consumer_spans(telemetry.spans())) < 3:
            await asyncio.sleep(0.02)
        return consumer_spans(telemetry.spans())

    attempts = await asyncio.wait_for(three_consumer_spans(), 10)
    spans = telemetry.spans()
    producers = sorted(
        (s for s in spans if s.kind is SpanKind.PRODUCER and s.name != "publish orders"),
        key=lambda s: s.start_time or 0,
    )
    assert [s.attributes["delayed_retry.outcome"] for s in attempts] == [  # type: ignore[index]
        "retry",
        "retry",
        "success",
    ]
    # One trace: the original publish, every attempt and every retry publish.
    assert {s.context.trace_id for s in [*attempts, *producers]} == {origin.trace_id}
    first, second, third = attempts
    assert first.parent is not None and first.parent.span_id == origin.span_id
    assert len(producers) == 2
    # Attempt n+1 is a child of the retry publish that attempt n made.
    assert second.parent is not None and second.parent.span_id == producers[0].context.span_id
    assert third.parent is not None and third.parent.span_id == producers[1].context.span_id
    assert producers[0].parent is not None
    assert producers[0].parent.span_id == first.context.span_id
    # Later attempts link back to the publish of the first failing delivery.
    for span in (second, third):
        assert [(link.context.span_id, link.attributes) for link in span.links] == [
            (origin.span_id, {"delayed_retry.link": "first-failure"})
        ]
    assert not first.links

    attrs = first.attributes or {}
    assert attrs["messaging.system"] == "rabbitmq"
    assert attrs["messaging.destination.name"] == queue.name
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.message.id"] == "m-1"
    assert attrs["messaging.message.conversation_id"] == "conv-7"
    assert attrs["delayed_retry.attempt"] == 1
    assert attrs["delayed_retry.delay"] == pytest.approx(0.05)
    assert str(attrs["error.type"]).endswith("Flaky")
    assert first.name == f"process {queue.name}"
    assert first.status.status_code is StatusCode.ERROR
    exceptions = [e for e in first.events if e.name == "exception"]
    assert len(exceptions) == 1
    assert exceptions[0].attributes["exception.message"] == "not yet (0)"  # type: ignore[index]
    assert third.status.status_code is StatusCode.UNSET
    assert not [e for e in third.events if e.name == "exception"]
    assert (third.attributes or {})["delayed_retry.attempt"] == 3

    retry_publish = producers[0].attributes or {}
    assert retry_publish["delayed_retry.publish.kind"] == "retry"
    assert retry_publish["messaging.operation.type"] == "send"
    # A retry due within the hold's limit enters at the delivery exchange (no hop).
    assert retry_publish["messaging.destination.name"] == topology.delivery_exchange
    assert retry_publish["messaging.message.id"] == "m-1"
    assert retry_publish["delayed_retry.queue"] == queue.name


async def test_parking_is_a_producer_span_and_the_attempt_records_why(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, telemetry: Telemetry
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(f"{unique}.q", durable=True)
    attempts = 0

    @with_delayed_retry(
        max_retries=1,
        wait=wait_fixed(0.02),
        topology=topology,
        instrumentation=telemetry.instrumentation,
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        nonlocal attempts
        attempts += 1
        raise Flaky("always")

    await consume(queue, handle)
    parking = await channel.declare_queue(f"{unique}.q.parking", passive=True)
    await channel.default_exchange.publish(
        aio_pika.Message(b"x", message_id="p-1"), routing_key=queue.name
    )
    parked = await asyncio.wait_for(_first(parking), 15)
    assert parked.message_id == "p-1"
    # The parked copy carries the context of the park publish, for whoever reads it next.
    park_context = TraceContextTextMapPropagator().extract(parked.headers, getter=HeaderGetter())
    park_span_context = trace.get_current_span(park_context).get_span_context()
    # No publisher context came in: the origin is the first attempt's own span.
    assert X_TRACE_ORIGIN in parked.headers

    async def settled() -> list[ReadableSpan]:
        while True:
            spans = consumer_spans(telemetry.spans())
            if len(spans) == 2 and "delayed_retry.outcome" in (spans[1].attributes or {}):
                return spans
            await asyncio.sleep(0.02)

    first, last = await asyncio.wait_for(settled(), 10)
    assert (last.attributes or {})["delayed_retry.outcome"] == "parked"
    assert (last.attributes or {})["delayed_retry.reason"] == "max-retries"
    assert last.status.status_code is StatusCode.ERROR
    park = [
        s
        for s in telemetry.spans()
        if (s.attributes or {}).get("delayed_retry.publish.kind") == "park"
    ]
    assert len(park) == 1
    assert park[0].kind is SpanKind.PRODUCER
    assert (park[0].attributes or {})["messaging.destination.name"] == topology.parking_exchange
    assert park[0].context.span_id == park_span_context.span_id
    assert park[0].context.trace_id == first.context.trace_id
    assert [link.context.span_id for link in last.links] == [first.context.span_id]


async def _first(queue: aio_pika.abc.AbstractQueue) -> AbstractIncomingMessage:
    async with queue.iterator() as it:
        async for message in it:
            await message.ack()
            return message
    raise AssertionError("queue iterator ended")


async def test_publish_delayed_is_a_producer_span_and_the_delivery_its_child(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, telemetry: Telemetry
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(f"{unique}.q", durable=True)
    got: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    @with_delayed_retry(topology=topology, instrumentation=telemetry.instrumentation)
    async def handle(message: AbstractIncomingMessage) -> None:
        got.set_result(None)

    await consume(queue, handle)
    tracer = telemetry.tracer_provider.get_tracer("test-app")
    with tracer.start_as_current_span("checkout") as app_span:
        await publish_delayed(
            channel,
            aio_pika.Message(b"later", message_id="s-1"),
            queue=queue.name,
            delay=0.2,
            topology=topology,
            instrumentation=telemetry.instrumentation,
        )
    await asyncio.wait_for(got, 15)

    async def consumer_span() -> ReadableSpan:
        while not consumer_spans(telemetry.spans()):
            await asyncio.sleep(0.02)
        return consumer_spans(telemetry.spans())[0]

    consumer = await asyncio.wait_for(consumer_span(), 10)
    schedule = [
        s
        for s in telemetry.spans()
        if (s.attributes or {}).get("delayed_retry.publish.kind") == "schedule"
    ]
    assert len(schedule) == 1
    assert schedule[0].kind is SpanKind.PRODUCER
    assert schedule[0].parent is not None
    assert schedule[0].parent.span_id == app_span.get_span_context().span_id
    assert (schedule[0].attributes or {})["delayed_retry.delay"] == pytest.approx(0.2, abs=0.01)
    assert consumer.parent is not None
    assert consumer.parent.span_id == schedule[0].context.span_id
    assert (consumer.attributes or {})["delayed_retry.outcome"] == "success"


async def test_without_an_sdk_nothing_is_recorded_and_trace_context_passes_through(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(f"{unique}.q", durable=True)
    inst = OpenTelemetryInstrumentation(
        tracer_provider=trace.NoOpTracerProvider(),
        propagator=TraceContextTextMapPropagator(),
    )
    seen: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()

    @with_delayed_retry(
        max_retries=1, wait=wait_fixed(0.02), topology=topology, instrumentation=inst
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        await seen.put(message)
        if message.headers.get("x-retry") is None:
            assert not trace.get_current_span().is_recording()
            raise Flaky("once")

    await consume(queue, handle)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await channel.default_exchange.publish(
        aio_pika.Message(b"x", headers={"traceparent": traceparent}), routing_key=queue.name
    )
    first = await asyncio.wait_for(seen.get(), 10)
    retried = await asyncio.wait_for(seen.get(), 10)
    assert first.headers["traceparent"] == traceparent
    # A no-op tracer starts no span, so the incoming context is what travels on.
    assert retried.headers["traceparent"] == traceparent


def test_default_instrumentation_is_opentelemetry_on_the_global_providers_and_cached() -> None:
    first = default_instrumentation()
    assert isinstance(first, OpenTelemetryInstrumentation)
    assert default_instrumentation() is first


def test_header_getter_reads_bytes_and_ignores_other_types() -> None:
    getter = HeaderGetter()
    assert getter.get({"traceparent": b"00-ab"}, "traceparent") == ["00-ab"]
    assert getter.get({"traceparent": 5}, "traceparent") is None
    assert getter.get({}, "traceparent") is None
    assert getter.keys({"a": 1}) == ["a"]


async def test_next_to_the_aio_pika_instrumentation_there_is_one_consumer_span_per_attempt(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, telemetry: Telemetry
) -> None:
    # In the dev extra; imported here so that only this test needs it.
    from opentelemetry.instrumentation.aio_pika import AioPikaInstrumentor

    instrumentor = AioPikaInstrumentor()
    instrumentor.instrument(tracer_provider=telemetry.tracer_provider)
    try:
        channel = await connection.channel()
        queue = await channel.declare_queue(f"{unique}.q", durable=True)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        @with_delayed_retry(
            max_retries=2,
            wait=wait_fixed(0.02),
            topology=topology,
            instrumentation=telemetry.instrumentation,
        )
        async def handle(message: AbstractIncomingMessage) -> None:
            if message.headers.get("x-retry") is None:
                raise Flaky("once")
            done.set_result(None)

        await consume(queue, handle)
        # Published through the instrumented aio-pika exchange: its PRODUCER span starts the trace.
        await channel.default_exchange.publish(
            aio_pika.Message(b"x", message_id="i-1"), routing_key=queue.name
        )
        await asyncio.wait_for(done, 15)

        async def two_attempts() -> list[ReadableSpan]:
            while True:
                spans = [s for s in telemetry.spans() if s.kind is SpanKind.CONSUMER]
                if len(spans) >= 2 and all(
                    "delayed_retry.outcome" in (s.attributes or {}) for s in spans
                ):
                    return spans
                await asyncio.sleep(0.02)

        consumers = await asyncio.wait_for(two_attempts(), 10)
    finally:
        instrumentor.uninstrument()
    spans = telemetry.spans()
    consumers = [s for s in spans if s.kind is SpanKind.CONSUMER]
    # One CONSUMER span per delivery: the aio-pika instrumentation's, carrying our attributes.
    assert len(consumers) == 2
    assert {s.instrumentation_scope.name for s in consumers} == {  # type: ignore[union-attr]
        "opentelemetry.instrumentation.aio_pika"
    }
    outcomes = sorted(str((s.attributes or {})["delayed_retry.outcome"]) for s in consumers)
    assert outcomes == ["retry", "success"]
    assert {s.context.trace_id for s in spans} == {consumers[0].context.trace_id}
    retry_publishes = [
        s for s in spans if (s.attributes or {}).get("delayed_retry.publish.kind") == "retry"
    ]
    assert len(retry_publishes) == 1


class PlainPropagator(TextMapPropagator):
    """A non-W3C propagator: ``x-plain-trace: <trace id hex>:<span id hex>``."""

    def extract(
        self,
        carrier: Any,
        context: Context | None = None,
        getter: Getter[Any] = default_getter,
    ) -> Context:
        values = getter.get(carrier, "x-plain-trace")
        if not values:
            return context or Context()
        trace_id, span_id = values[0].split(":")
        span_context = trace.SpanContext(
            int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=trace.TraceFlags(1)
        )
        return trace.set_span_in_context(trace.NonRecordingSpan(span_context), context)

    def inject(
        self,
        carrier: Any,
        context: Context | None = None,
        setter: Setter[Any] = default_setter,
    ) -> None:
        span_context = trace.get_current_span(context).get_span_context()
        if span_context.is_valid:
            setter.set(
                carrier,
                "x-plain-trace",
                f"{span_context.trace_id:032x}:{span_context.span_id:016x}",
            )

    @property
    def fields(self) -> set[str]:
        return {"x-plain-trace"}


async def test_a_non_w3c_propagator_carries_the_trace_and_the_origin_link_still_works(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, telemetry: Telemetry
) -> None:
    inst = OpenTelemetryInstrumentation(
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
        propagator=PlainPropagator(),
    )
    channel = await connection.channel()
    queue = await channel.declare_queue(f"{unique}.q", durable=True)
    seen: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()

    @with_delayed_retry(
        max_retries=2, wait=wait_fixed(0.02), topology=topology, instrumentation=inst
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        await seen.put(message)
        if message.headers.get("x-retry") is None:
            raise Flaky("once")

    await consume(queue, handle)
    origin = "0af7651916cd43dd8448eb211c80319c:b7ad6b7169203331"
    await channel.default_exchange.publish(
        aio_pika.Message(b"x", headers={"x-plain-trace": origin}), routing_key=queue.name
    )
    await asyncio.wait_for(seen.get(), 10)
    retried = await asyncio.wait_for(seen.get(), 10)
    assert "traceparent" not in retried.headers
    assert (
        retried.headers[X_TRACE_ORIGIN] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    )

    async def two() -> list[ReadableSpan]:
        while len(spans := consumer_spans(telemetry.spans())) < 2:
            await asyncio.sleep(0.02)
        return spans

    first, second = await asyncio.wait_for(two(), 10)
    assert {first.context.trace_id, second.context.trace_id} == {0x0AF7651916CD43DD8448EB211C80319C}
    assert first.parent is not None and first.parent.span_id == 0xB7AD6B7169203331
    assert [link.context.span_id for link in second.links] == [0xB7AD6B7169203331]
