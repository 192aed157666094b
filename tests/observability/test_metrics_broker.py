"""Counters, histograms and queue-depth gauges, against a real broker and an in-memory reader."""

from __future__ import annotations

import asyncio
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from tenacity import retry_if_exception_type, wait_fixed

from delayed_retry import (
    DelayTopology,
    consume,
    declare_topology,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.observability.gauges import DELAYED_MESSAGES, PARKED_MESSAGES, ChainMonitor
from tests.support.failures import Flaky
from tests.support.telemetry import Telemetry
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


class Fatal(Exception):
    """Not retried: parks at once."""


def points(telemetry: Telemetry, name: str) -> list[Any]:
    return telemetry.metrics().get(name, [])


def value(telemetry: Telemetry, name: str, **attrs: Any) -> Any:
    """Sum of the points of ``name`` whose attributes include ``attrs``."""
    found = [p for p in points(telemetry, name) if attrs.items() <= dict(p.attributes).items()]
    return sum(p.value for p in found) if found else None


async def test_counters_and_histograms_of_retries_successes_and_parking(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, telemetry: Telemetry
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(f"{unique}.q", durable=True)
    resolved: asyncio.Queue[str] = asyncio.Queue()
    calls = 0

    @with_delayed_retry(
        max_retries=2,
        wait=wait_fixed(0.1),
        retry=retry_if_exception_type(Flaky),
        topology=topology,
        instrumentation=telemetry.instrumentation,
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        nonlocal calls
        calls += 1
        kind = message.body.decode()
        retries = message.headers.get("x-retry", 0)
        if kind == "heals" and retries < 2:  # type: ignore[operator]
            raise Flaky("later")
        if kind == "fatal":
            raise Fatal("bad input")
        if kind == "stubborn":
            raise Flaky("never")
        await resolved.put(kind)

    await consume(queue, handle)
    for kind in ("ok", "heals", "fatal", "stubborn"):
        await channel.default_exchange.publish(
            aio_pika.Message(kind.encode(), message_id=kind), routing_key=queue.name
        )
    parking = await channel.declare_queue(f"{queue.name}.parking", passive=True)

    async def all_resolved() -> bool:
        # ok 1 + heals 3 + fatal 1 + stubborn 3 attempts; 2 successes and 2 parked messages.
        await parking.declare()
        parked = parking.declaration_result.message_count
        return calls >= 8 and resolved.qsize() == 2 and parked == 2

    await wait_until(all_resolved, what="2 successes and 2 parked messages")

    async def attempts_recorded() -> bool:
        return bool(value(telemetry, "delayed_retry.attempts") == 8)

    await wait_until(attempts_recorded, what="8 attempts recorded")
    q = {"messaging.destination.name": queue.name}
    assert (
        value(telemetry, "delayed_retry.attempts", **q, **{"delayed_retry.outcome": "success"}) == 2
    )
    assert value(telemetry, "delayed_retry.attempts", **{"delayed_retry.outcome": "retry"}) == 4
    assert value(telemetry, "delayed_retry.attempts", **{"delayed_retry.outcome": "parked"}) == 2
    flaky = f"{Flaky.__module__}.Flaky"
    fatal = f"{__name__}.Fatal"
    assert value(telemetry, "delayed_retry.retries", **q, **{"error.type": flaky}) == 4
    assert value(telemetry, "delayed_retry.successes_after_retry", **q) == 1
    assert (
        value(
            telemetry,
            "delayed_retry.parked",
            **q,
            **{"error.type": fatal, "delayed_retry.reason": "not-retryable"},
        )
        == 1
    )
    assert (
        value(
            telemetry,
            "delayed_retry.parked",
            **q,
            **{"error.type": flaky, "delayed_retry.reason": "max-retries"},
        )
        == 1
    )

    [delays] = [
        p
        for p in points(telemetry, "delayed_retry.delay")
        if p.attributes.get("delayed_retry.publish.kind") == "retry"
    ]
    assert delays.count == 4
    assert delays.sum == pytest.approx(0.4)
    resolution = {
        p.attributes["delayed_retry.outcome"]: p
        for p in points(telemetry, "delayed_retry.resolution.duration")
    }
    # heals: resolved after two 0.1 s waits; stubborn parked after two; fatal parked at once.
    assert resolution["success"].count == 1
    assert resolution["success"].min >= 0.2  # never early: two waits of 0.1 s at least
    assert resolution["success"].max < 60
    assert resolution["parked"].count == 2
    assert resolution["parked"].min == 0.0
    assert 0.2 <= resolution["parked"].max < 60


async def test_scheduled_delays_are_recorded(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, telemetry: Telemetry
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(f"{unique}.q", durable=True)
    for delay in (1.5, 30.0):
        await publish_delayed(
            channel,
            aio_pika.Message(b"later"),
            queue=queue.name,
            delay=delay,
            topology=topology,
            instrumentation=telemetry.instrumentation,
        )
    [point] = points(telemetry, "delayed_retry.delay")
    assert dict(point.attributes) == {
        "messaging.destination.name": queue.name,
        "delayed_retry.publish.kind": "schedule",
    }
    assert point.count == 2
    assert point.sum == pytest.approx(31.5, abs=0.01)


async def test_chain_monitor_gauges_read_depths_per_level_and_parking_queue(
    connection: AbstractRobustConnection,
    rabbitmq_url: str,
    unique: str,
    topology: DelayTopology,
    telemetry: Telemetry,
) -> None:
    channel = await connection.channel()
    queue = await channel.declare_queue(f"{unique}.q", durable=True)
    await declare_topology(channel, topology, queues=[queue.name])
    # 40 s = 40000 ms: highest bit 2^15, so both wait in level 15 for a long time.
    for _ in range(2):
        await publish_delayed(
            channel, aio_pika.Message(b"x"), queue=queue.name, delay=40.0, topology=topology
        )
    parking_name = topology.default_parking_queue(queue.name)
    await channel.default_exchange.publish(aio_pika.Message(b"p"), routing_key=parking_name)

    now = [1000.0]
    monitor = ChainMonitor(
        url=rabbitmq_url,
        topology=topology,
        parking_queues=[parking_name, f"{unique}.missing.parking"],
        interval=3600,
        meter_provider=telemetry.meter_provider,
        clock=lambda: now[0],
    )
    assert not points(telemetry, DELAYED_MESSAGES)  # nothing read yet: nothing reported

    async def published() -> bool:
        reading = await monitor.refresh()
        return reading.levels.get(15) == 2 and reading.parked.get(parking_name) == 1

    async with monitor:
        await wait_until(published, what="the monitor to see 2 delayed and 1 parked message")
        delayed = {
            p.attributes["delayed_retry.level"]: p.value
            for p in points(telemetry, DELAYED_MESSAGES)
        }
        assert delayed[15] == 2
        assert sum(delayed.values()) == 2
        assert len(delayed) == topology.levels
        level = next(
            p
            for p in points(telemetry, DELAYED_MESSAGES)
            if p.attributes["delayed_retry.level"] == 15
        )
        assert level.attributes["messaging.destination.name"] == topology.level_name(15)
        parked = {
            p.attributes["messaging.destination.name"]: p.value
            for p in points(telemetry, PARKED_MESSAGES)
        }
        # A parking queue that does not exist is not reported (rather than reported as 0).
        assert parked == {parking_name: 1, topology.unroutable_queue: 0}
        # A reading older than max_age (3 intervals) is not reported.
        now[0] += 3 * 3600 + 1
        assert not points(telemetry, DELAYED_MESSAGES)
        assert monitor.reading() is None
    assert monitor.reading() is None


async def test_chain_monitor_polls_in_the_background(
    connection: AbstractRobustConnection,
    rabbitmq_url: str,
    unique: str,
    topology: DelayTopology,
    telemetry: Telemetry,
) -> None:
    channel = await connection.channel()
    await channel.declare_queue(f"{unique}.q", durable=True)
    await declare_topology(channel, topology, queues=[f"{unique}.q"])
    parking_name = topology.default_parking_queue(f"{unique}.q")
    async with ChainMonitor(
        url=rabbitmq_url,
        topology=topology,
        parking_queues=[parking_name],
        interval=0.2,
        meter_provider=telemetry.meter_provider,
    ):
        assert {p.value for p in points(telemetry, PARKED_MESSAGES)} == {0}
        await channel.default_exchange.publish(aio_pika.Message(b"p"), routing_key=parking_name)

        async def seen() -> bool:
            found = {
                p.attributes["messaging.destination.name"]: p.value
                for p in points(telemetry, PARKED_MESSAGES)
            }
            return found.get(parking_name) == 1

        await wait_until(seen, what="a later poll to see the parked message")
    assert not points(telemetry, PARKED_MESSAGES)


def test_chain_monitor_rejects_a_non_positive_interval() -> None:
    with pytest.raises(ValueError, match="interval"):
        ChainMonitor(url="amqp://localhost/", interval=0)


def test_prometheus_exporter_names() -> None:
    """The names docs/observability.md promises, through the standard Prometheus exporter."""
    from datetime import timedelta

    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from prometheus_client import REGISTRY, generate_latest

    from delayed_retry.durations import utcnow
    from delayed_retry.headers import RetryState
    from delayed_retry.observability.metrics import RetryMetrics, meter_for

    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        recorder = RetryMetrics(meter_for(provider))
        state = RetryState(
            attempt=2,
            retries=1,
            queue="orders",
            original_exchange="",
            original_routing_key="orders",
            first_failure_at=utcnow() - timedelta(seconds=3),
        )
        recorder.record_attempt(
            state, queue="orders", outcome="retry", delay=2.0, exc=TimeoutError(), reason=None
        )
        recorder.record_attempt(
            state,
            queue="orders",
            outcome="parked",
            delay=None,
            exc=KeyError(),
            reason="max-retries",
        )
        text = generate_latest(REGISTRY).decode()
    finally:
        provider.shutdown()
    for name in (
        'delayed_retry_attempts_total{delayed_retry_outcome="retry"',
        'delayed_retry_retries_total{error_type="TimeoutError"',
        "delayed_retry_delay_seconds_bucket{",
        'delayed_retry_resolution_duration_seconds_count{delayed_retry_outcome="parked"',
        'delayed_retry_parked_total{delayed_retry_reason="max-retries",error_type="KeyError"',
    ):
        assert name in text, name
