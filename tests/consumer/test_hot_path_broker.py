"""The success path skips what only a failure needs: telemetry while it records nothing,
header parsing, and declarations already made on the connection."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from opentelemetry import trace
from opentelemetry.metrics import NoOpMeterProvider
from opentelemetry.sdk.trace import TracerProvider
from tenacity import wait_fixed

from delayed_retry import (
    DelayTopology,
    NoInstrumentation,
    RetryState,
    consume,
    current_retry_state,
    with_delayed_retry,
)
from delayed_retry.headers import X_RETRY
from delayed_retry.observability.instrumentation import AttemptScope
from delayed_retry.observability.otel import OpenTelemetryInstrumentation
from tests.support.failures import Flaky


class Switchable:
    """An instrumentation that counts the attempts it is asked to observe."""

    def __init__(self, *, on: bool) -> None:
        self.on = on
        self.attempts = 0

    def enabled(self) -> bool:
        return self.on

    @contextmanager
    def attempt(
        self, message: AbstractIncomingMessage, state: RetryState, *, queue: str
    ) -> Iterator[AttemptScope]:
        self.attempts += 1
        with NoInstrumentation().attempt(message, state, queue=queue) as scope:
            yield scope

    @contextmanager
    def scheduling(
        self, headers: dict[str, Any], *, queue: str, exchange: str, routing_key: str, delay: float
    ) -> Iterator[None]:
        yield


def test_opentelemetry_is_enabled_only_when_a_provider_records() -> None:
    quiet = OpenTelemetryInstrumentation(
        tracer_provider=trace.NoOpTracerProvider(), meter_provider=NoOpMeterProvider()
    )
    assert not quiet.enabled()
    traced = OpenTelemetryInstrumentation(
        tracer_provider=TracerProvider(), meter_provider=NoOpMeterProvider()
    )
    assert traced.enabled()
    assert not NoInstrumentation().enabled()


@pytest.mark.broker
@pytest.mark.parametrize("on", [False, True])
async def test_a_disabled_instrumentation_is_not_called_and_retries_still_work(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, on: bool
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(f"{unique}.q", durable=True)
    inst = Switchable(on=on)
    states: asyncio.Queue[tuple[bytes, RetryState | None]] = asyncio.Queue()

    @with_delayed_retry(
        max_retries=1, wait=wait_fixed(0.02), topology=topology, instrumentation=inst
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        await states.put((message.body, current_retry_state()))
        if message.body == b"fail" and message.headers.get(X_RETRY) is None:
            raise Flaky("once")

    await consume(queue, handle)
    for body in (b"ok", b"fail"):
        await channel.default_exchange.publish(aio_pika.Message(body), routing_key=queue.name)
    seen = [await asyncio.wait_for(states.get(), 10) for _ in range(3)]
    by_body: dict[bytes, list[int]] = {}
    for body, state in seen:
        assert state is not None  # read on demand, even when nothing else needed it
        by_body.setdefault(body, []).append(state.attempt)
    assert by_body == {b"ok": [1], b"fail": [1, 2]}
    assert inst.attempts == (3 if on else 0)
