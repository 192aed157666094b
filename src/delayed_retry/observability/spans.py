"""OpenTelemetry spans for every handling attempt and every hand-over.

One CONSUMER span per handling attempt, named ``process <queue>``, with the
messaging semantic-convention attributes (:func:`message_attributes`) and the
retry attributes (``delayed_retry.*``). Each onward publish (into the delay
chain, to the parking exchange, or a :func:`~delayed_retry.publish_delayed`)
is a PRODUCER span whose context is injected into the message headers with
the configured propagator (W3C ``traceparent``/``tracestate`` by default).
A retry arriving hours later extracts it, so every attempt of a message is a
span of the trace its first publish started. The first publish's context is
also kept in :data:`X_TRACE_ORIGIN` and every later attempt links to it.

Choose :class:`OpenTelemetryInstrumentation` with explicit providers in tests
and in applications that do not use the global ones; the middleware's default
is the same class on the global providers, which costs only the API's no-op
until an SDK is configured.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from aio_pika.abc import AbstractIncomingMessage
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.propagate import get_global_textmap
from opentelemetry.propagators.textmap import Getter, Setter, TextMapPropagator
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

from delayed_retry.headers.names import X_TRACE_ORIGIN
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.headers.text import exception_name, exception_text

__all__ = [
    "ATTR_ATTEMPT",
    "ATTR_DELAY",
    "ATTR_IMMEDIATE_RETRY",
    "ATTR_OUTCOME",
    "ATTR_PUBLISH_KIND",
    "ATTR_REASON",
    "INSTRUMENTATION_NAME",
    "HeaderGetter",
    "HeaderSetter",
    "active_consumer_span",
    "instrumentation_version",
    "message_attributes",
    "publish_attributes",
    "tracer_for",
    "AttemptSpan",
    "ERROR_TYPE",
    "HEADER_GETTER",
    "HEADER_SETTER",
    "MESSAGING_DESTINATION_NAME",
    "W3C",
    "attempt_span",
    "global_propagator",
    "producer_span",
]

INSTRUMENTATION_NAME = "delayed_retry"
"""Instrumentation scope name of the tracer and the meter."""


# Messaging semantic conventions (https://opentelemetry.io/docs/specs/semconv/messaging/).
# Spelled out here because only opentelemetry-api is a run-time dependency.
MESSAGING_SYSTEM = "messaging.system"
MESSAGING_OPERATION_TYPE = "messaging.operation.type"
MESSAGING_OPERATION_NAME = "messaging.operation.name"
MESSAGING_DESTINATION_NAME = "messaging.destination.name"
MESSAGING_MESSAGE_ID = "messaging.message.id"
MESSAGING_CONVERSATION_ID = "messaging.message.conversation_id"
MESSAGING_BODY_SIZE = "messaging.message.body.size"
MESSAGING_RABBITMQ_ROUTING_KEY = "messaging.rabbitmq.destination.routing_key"
MESSAGING_RABBITMQ_DELIVERY_TAG = "messaging.rabbitmq.message.delivery_tag"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

ATTR_ATTEMPT = "delayed_retry.attempt"
"""1 on the first handling, 2 on the first retry …"""
ATTR_OUTCOME = "delayed_retry.outcome"
"""``success``, ``retry``, ``parked``, ``error`` (hand-over failed, message requeued),
``immediate-retry`` (the handler runs again at once)."""
ATTR_IMMEDIATE_RETRY = "delayed_retry.immediate_retry"
"""On an immediate retry's span: 1 on the first immediate retry of a delivery, 2 on the next …"""
ATTR_DELAY = "delayed_retry.delay"
"""The delay chosen, in seconds."""
ATTR_REASON = "delayed_retry.reason"
"""Why a message was parked (``max-retries``, ``not-retryable`` …)."""
ATTR_PUBLISH_KIND = "delayed_retry.publish.kind"
"""``retry``, ``park`` or ``schedule``."""
ATTR_QUEUE = "delayed_retry.queue"
"""The queue a published message is destined for (it returns there after the delay)."""


def tracer_for(provider: TracerProvider | None) -> Tracer:
    """The delayed-retry tracer of ``provider``, or of the global provider when ``None``."""
    return trace.get_tracer(
        INSTRUMENTATION_NAME, instrumentation_version(), tracer_provider=provider
    )


def instrumentation_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("delayed-retry")
    except PackageNotFoundError:
        return "0"


class HeaderGetter(Getter[Mapping[str, Any]]):
    """Reads trace context from AMQP headers, whose strings may arrive as bytes."""

    def get(self, carrier: Mapping[str, Any], key: str) -> list[str] | None:
        value = carrier.get(key)
        if value is None:
            return None
        if isinstance(value, bytes | bytearray):
            return [bytes(value).decode("utf-8", "replace")]
        if isinstance(value, str):
            return [value]
        return None

    def keys(self, carrier: Mapping[str, Any]) -> list[str]:
        return [str(k) for k in carrier]


class HeaderSetter(Setter[MutableMapping[str, Any]]):
    """Writes trace context into AMQP headers."""

    def set(self, carrier: MutableMapping[str, Any], key: str, value: str) -> None:
        carrier[key] = value


HEADER_GETTER = HeaderGetter()
HEADER_SETTER = HeaderSetter()

W3C = TraceContextTextMapPropagator()
"""The origin link header is always W3C trace context, whatever the configured propagator."""


def _server(message: AbstractIncomingMessage) -> dict[str, AttributeValue]:
    try:
        url = message.channel.connection.url
    except Exception:  # an unusual channel: the attributes are optional
        return {}
    out: dict[str, AttributeValue] = {}
    if url.host:
        out[SERVER_ADDRESS] = url.host
    out[SERVER_PORT] = url.port or 5672
    return out


def message_attributes(
    message: AbstractIncomingMessage, *, queue: str
) -> dict[str, AttributeValue]:
    """Semantic-convention attributes of a RabbitMQ delivery being processed from ``queue``.

    ``messaging.destination.name`` is the queue (low cardinality: the chain's
    routing keys carry a delay, so they go in the routing-key attribute).
    """
    attrs: dict[str, AttributeValue] = {
        MESSAGING_SYSTEM: "rabbitmq",
        MESSAGING_OPERATION_TYPE: "process",
        MESSAGING_OPERATION_NAME: "process",
        MESSAGING_DESTINATION_NAME: queue,
        MESSAGING_RABBITMQ_ROUTING_KEY: message.routing_key or "",
        MESSAGING_BODY_SIZE: len(message.body),
    }
    if message.message_id:
        attrs[MESSAGING_MESSAGE_ID] = str(message.message_id)
    if message.correlation_id:
        attrs[MESSAGING_CONVERSATION_ID] = str(message.correlation_id)
    if message.delivery_tag is not None:
        attrs[MESSAGING_RABBITMQ_DELIVERY_TAG] = int(message.delivery_tag)
    attrs.update(_server(message))
    return attrs


def publish_attributes(
    *,
    exchange: str,
    routing_key: str,
    kind: str,
    queue: str,
    message_id: str | None = None,
    conversation_id: str | None = None,
    delay: float | None = None,
) -> dict[str, AttributeValue]:
    """Semantic-convention attributes of a publish into the chain or to parking."""
    attrs: dict[str, AttributeValue] = {
        MESSAGING_SYSTEM: "rabbitmq",
        MESSAGING_OPERATION_TYPE: "send",
        MESSAGING_OPERATION_NAME: "publish",
        MESSAGING_DESTINATION_NAME: exchange or "amq.default",
        MESSAGING_RABBITMQ_ROUTING_KEY: routing_key,
        ATTR_PUBLISH_KIND: kind,
        ATTR_QUEUE: queue,
    }
    if message_id:
        attrs[MESSAGING_MESSAGE_ID] = message_id
    if conversation_id:
        attrs[MESSAGING_CONVERSATION_ID] = conversation_id
    if delay is not None:
        attrs[ATTR_DELAY] = delay
    return attrs


def active_consumer_span() -> Span | None:
    """The recording CONSUMER span already active here, if another instrumentation opened one.

    ``opentelemetry-instrumentation-aio-pika`` (and frameworks such as
    FastStream) open a consumer span around the callback; delayed-retry then
    adds its attributes to that span instead of opening a second one.
    """
    span = trace.get_current_span()
    if span.is_recording() and getattr(span, "kind", None) is SpanKind.CONSUMER:
        return span
    return None


def _origin_link(headers: Mapping[str, Any], current: trace.SpanContext) -> Link | None:
    origin = headers.get(X_TRACE_ORIGIN)
    if origin is None:
        return None
    ctx = W3C.extract({"traceparent": origin}, getter=HEADER_GETTER)
    span_context = trace.get_current_span(ctx).get_span_context()
    if not span_context.is_valid or span_context == current:
        return None
    return Link(span_context, {"delayed_retry.link": "first-failure"})


class AttemptSpan:
    """The span of one attempt and what its onward publishes need; used by the instrumentation."""

    def __init__(self, span: Span, *, owned: bool, queue: str, message_id: str | None) -> None:
        self.span = span
        self.owned = owned
        self.queue = queue
        self.message_id = message_id

    def finish(
        self,
        outcome: str,
        *,
        delay: float | None,
        exc: BaseException | None,
        reason: str | None,
    ) -> None:
        span = self.span
        if not span.is_recording():
            return
        span.set_attribute(ATTR_OUTCOME, outcome)
        if delay is not None:
            span.set_attribute(ATTR_DELAY, delay)
        if reason is not None:
            span.set_attribute(ATTR_REASON, reason)
        if exc is not None:
            _record(span, exc)
            span.set_attribute(ERROR_TYPE, exception_name(exc))


def _record(span: Span, exc: BaseException) -> None:
    """Record ``exc`` on ``span``, even when its ``__str__`` raises."""
    text = exception_text(exc)
    try:
        span.record_exception(exc)
    except Exception:
        attributes = {"exception.type": type(exc).__name__, "exception.message": text}
        span.add_event("exception", attributes)
    span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {text}"[:500]))


@contextmanager
def attempt_span(
    tracer: Tracer,
    propagator: TextMapPropagator,
    message: AbstractIncomingMessage,
    state: RetryState,
    *,
    queue: str,
) -> Iterator[AttemptSpan]:
    """Open the CONSUMER span of one attempt, parented on the context the headers carry.

    The extracted context is attached for the attempt (so the handler's own
    spans are children) and detached in ``finally``.
    """
    existing = active_consumer_span()
    if existing is not None and not state.immediate_retries:
        existing.set_attributes(message_attributes(message, queue=queue))
        existing.set_attribute(ATTR_ATTEMPT, state.attempt)
        yield AttemptSpan(existing, owned=False, queue=queue, message_id=message.message_id)
        return
    headers: Mapping[str, Any] = message.headers or {}
    # An immediate retry under a framework's consumer span (FastStream's) is its child;
    # otherwise each attempt is a child of the context the message carries.
    parent = (
        otel_context.get_current()
        if existing is not None
        else propagator.extract(headers, getter=HEADER_GETTER)
    )
    parent_context = trace.get_current_span(parent).get_span_context()
    link = _origin_link(headers, parent_context)
    # What a sampler may look at is given at the start; the rest only to a recording
    # span, so that without an SDK an attempt costs no more than the API's no-op.
    span = tracer.start_span(
        f"process {queue}",
        context=parent,
        kind=SpanKind.CONSUMER,
        attributes={
            MESSAGING_SYSTEM: "rabbitmq",
            MESSAGING_OPERATION_TYPE: "process",
            MESSAGING_DESTINATION_NAME: queue,
            ATTR_ATTEMPT: state.attempt,
        },
        links=[link] if link is not None else None,
        record_exception=False,
        set_status_on_exception=False,
    )
    if span.is_recording():
        span.set_attributes(message_attributes(message, queue=queue))
        if state.immediate_retries:
            span.set_attribute(ATTR_IMMEDIATE_RETRY, state.immediate_retries)
    token = otel_context.attach(trace.set_span_in_context(span, parent))
    scope = AttemptSpan(span, owned=True, queue=queue, message_id=message.message_id)
    try:
        yield scope
    except BaseException as exc:
        if span.is_recording():
            _record(span, exc)
        raise
    finally:
        otel_context.detach(token)
        span.end()


@contextmanager
def producer_span(
    tracer: Tracer,
    propagator: TextMapPropagator,
    headers: dict[str, Any],
    attributes: dict[str, AttributeValue],
    *,
    exchange: str,
) -> Iterator[Span]:
    """A PRODUCER span around one publish; its context is injected into ``headers``."""
    with tracer.start_as_current_span(
        f"publish {exchange or 'amq.default'}", kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        propagator.inject(headers, setter=HEADER_SETTER)
        yield span


def global_propagator() -> TextMapPropagator:
    """The globally configured propagator (W3C trace context and baggage unless changed)."""
    return get_global_textmap()
