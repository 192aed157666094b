"""The throttle on a real broker: a dependency goes down, the consumer stops and probes.

A queue of messages, a handler whose dependency is down: after the trip the
broker sees no consumer, the messages wait in their queue (none parks, few
spend a retry), the handler runs one message at a time, and once the
dependency is back one probe resumes full speed and everything is handled.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections import Counter
from typing import Any

import tenacity
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue

from delayed_retry import (
    Alert,
    CallbackSink,
    ParkingAlerts,
    Throttle,
    consume,
    with_delayed_retry,
)
from delayed_retry.cli import main
from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.headers import X_DELIVERY_COUNT
from delayed_retry.observability.metrics import THROTTLE_TRIPS, THROTTLED
from delayed_retry.recovery.throttle import marker_queue_name
from tests.support.chain import Scenario, publish
from tests.support.telemetry import Telemetry
from tests.support.waiting import wait_until

MESSAGES = 40
PREFETCH = 8


class Dependency:
    """A dependency that is down until told otherwise; records every handling."""

    def __init__(self) -> None:
        self.up = False
        self.handled: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        self.running = 0
        self.most_running_while_throttled = 0
        self.redelivered = 0
        self.delivery_counts: list[object] = []
        self.handler: RetryingHandler[Any] | None = None

    async def __call__(self, message: AbstractIncomingMessage) -> None:
        key = message.body.decode()
        self.running += 1
        if message.redelivered:
            self.redelivered += 1
            self.delivery_counts.append((message.headers or {}).get(X_DELIVERY_COUNT))
        try:
            throttle = self.handler.throttle if self.handler is not None else None
            if throttle is not None and throttle.throttled:
                self.most_running_while_throttled = max(
                    self.most_running_while_throttled, self.running
                )
            await asyncio.sleep(0)  # let concurrent deliveries overlap, as real work does
            if not self.up:
                self.failed[key] += 1
                raise ConnectionError("database is down")
            self.handled[key] += 1
        finally:
            self.running -= 1


def _status(scenario: Scenario, queue: str, url: str) -> dict[str, Any]:
    """``delayed-retry status --queue QUEUE --json`` for the scenario's chain."""
    out = io.StringIO()
    args = [
        "--url",
        url,
        "status",
        "--queue",
        queue,
        "--json",
        "--prefix",
        scenario.topology.prefix,
    ]
    args += ["--levels", str(scenario.topology.levels), "--unit-ms", str(scenario.topology.unit_ms)]
    args += ["--queue-type", scenario.topology.queue_type]
    with contextlib.redirect_stdout(out):
        assert main(args) == 0
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


async def _count(name: str, scenario: Scenario, expected: int) -> bool:
    return await consumers_of(name, scenario) == expected


async def consumers_of(queue: AbstractQueue | str, scenario: Scenario) -> int:
    ch = await scenario.connection.channel()
    try:
        name = queue if isinstance(queue, str) else queue.name
        declared = await ch.declare_queue(name, passive=True)
        return int(declared.declaration_result.consumer_count or 0)
    finally:
        await ch.close()


async def test_throttle_stops_the_consumer_probes_and_resumes(
    scenario: Scenario, rabbitmq_url: str, telemetry: Telemetry
) -> None:
    ch = scenario.ch
    await ch.set_qos(prefetch_count=PREFETCH)
    queue = await scenario.queue(queue_type=scenario.topology.queue_type)
    dependency = Dependency()
    handler = with_delayed_retry(
        queue=queue.name,
        topology=scenario.topology,
        max_retries=50,
        wait=tenacity.wait_fixed(0.5),
        instrumentation=telemetry.instrumentation,
        throttle=Throttle(
            consecutive=3,
            probe_every=0.2,
            counts=tenacity.retry_if_exception_type(ConnectionError),
        ),
    )(dependency)
    for i in range(MESSAGES):
        await publish(ch, queue.name, str(i).encode())
    tag = await consume(queue, handler)
    seen: list[Alert] = []
    alerts = ParkingAlerts(
        scenario.connection,
        sinks=[CallbackSink(seen.append)],
        topology=scenario.topology,
        window=0.05,
        declare=False,
    )
    await alerts.start()
    control = handler.throttle
    assert control is not None
    dependency.handler = handler

    await wait_until(lambda: control.throttled, what="the throttle to trip")
    await wait_until(
        lambda: _zero(queue, scenario), what="the broker to see no consumer on the queue"
    )
    marker = marker_queue_name(scenario.topology.prefix, queue.name)
    scenario.track_queue(marker)
    await wait_until(lambda: _count(marker, scenario, 1), what="the process counted as throttled")
    # A quorum queue counts a probe's basic.get as a consumer until its message is
    # settled, so `status` may catch a probe in flight: it must show none between probes.
    shown: list[dict[str, Any]] = []

    async def status_shows_throttled() -> bool:
        status = await asyncio.to_thread(_status, scenario, queue.name, rabbitmq_url)
        shown.append(status["queues"][0])
        return bool(shown[-1]["throttled_consumers"] == 1 and shown[-1]["consumers"] == 0)

    await wait_until(status_shows_throttled, what="status to show 1 throttled, 0 consuming")
    assert all(s["throttled_consumers"] == 1 for s in shown), shown
    # While throttled the handler takes one message at a time: let several probes run.
    failed_at_trip = sum(dependency.failed.values())
    await wait_until(
        lambda: sum(dependency.failed.values()) >= failed_at_trip + 3,
        what="three failing probes",
    )
    assert control.throttled
    assert dependency.most_running_while_throttled <= 1 + PREFETCH  # in flight at the trip
    dependency.most_running_while_throttled = 0
    await wait_until(
        lambda: sum(dependency.failed.values()) >= failed_at_trip + 5,
        what="two more failing probes",
    )
    assert dependency.most_running_while_throttled == 1

    dependency.up = True
    await wait_until(lambda: len(dependency.handled) == MESSAGES, timeout=60, what="all handled")
    assert not control.throttled
    await wait_until(lambda: _one(queue, scenario), what="the consumer to be back")
    await wait_until(lambda: _count(marker, scenario, 0), what="no process counted as throttled")
    parked = await scenario.depth(scenario.topology.default_parking_queue(queue.name))
    assert parked == 0
    if scenario.topology.queue_type == "classic":
        assert dependency.redelivered == 0, "a put-back message must come as a new one"
    else:
        # Quorum queues: a message the queue sent as the consumer was being cancelled
        # is dropped by the channel and returned when the consumer comes back, once:
        # x-delivery-count 1 on 3.10-4.2, absent (a return 4.3 does not count) on 4.3.
        assert dependency.redelivered <= PREFETCH
        assert set(dependency.delivery_counts) <= {1, None}, dependency.delivery_counts
    # Those in flight at the trip (a prefetch) and the probes failed; the rest waited untouched.
    spent = len(dependency.failed)
    assert MESSAGES - spent >= 15, dependency.failed

    points = telemetry.metrics()
    assert sum(p.value for p in points[THROTTLE_TRIPS]) == 1
    assert sum(p.value for p in points[THROTTLED]) == 0  # tripped, then resumed

    # The trip and the resume reach the alert sinks, as parkings do.
    await wait_until(lambda: sum(len(a.events) for a in seen) == 2, what="two throttle alerts")
    await alerts.stop()
    events = [e for a in seen for e in a.events]
    assert events[0].startswith(f"consumer of {queue.name} throttled after 3 consecutive")
    assert events[1] == f"consumer of {queue.name} resumed full speed after a successful probe"
    assert all(a.total == 0 for a in seen)
    await queue.cancel(tag)
    await handler.release_held()


async def _zero(queue: AbstractQueue, scenario: Scenario) -> bool:
    return await consumers_of(queue, scenario) == 0


async def _one(queue: AbstractQueue, scenario: Scenario) -> bool:
    return await consumers_of(queue, scenario) == 1
