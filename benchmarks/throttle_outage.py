"""A dependency outage with and without the throttle: retries spent, parkings, delivery counts.

``messages`` messages wait in a work queue; the handler's dependency is down
for ``outage`` seconds from its first call (it raises ``ConnectionError``),
then up. The same workload runs twice on one broker, each on a chain and a
queue of its own: with ``Throttle(consecutive=N, probe_every=P,
counts=retry_if_exception_type(ConnectionError))`` and without a throttle.
Both use the same retry policy (``max_retries`` delayed retries, backoff
``1 s * 2**r`` capped at 30 s), short enough that without a throttle every
message runs out of retries within the outage.

Counted per run: messages that spent at least one delayed retry, failed
handlings in all (each one a delayed retry, or the last one a parking),
messages parked, messages handled, the time until every message was handled
or parked, and the broker's delivery counts of the messages handled
(``redelivered``, ``x-delivery-count`` from quorum queues, ``x-acquired-count``
on 4.3), which show that the messages that waited
were not returned to the queue in a way the broker counts.

The suite's ``throttle`` workload: ``benchmarks/run --only throttle`` (on the suite's
broker), ``--throttle-rabbitmq 4.3`` (a private 4.3 node).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import secrets
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import timedelta

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage
from workloads import Row, Suite

from delayed_retry import (
    DelayTopology,
    NoInstrumentation,
    Throttle,
    consume,
    with_delayed_retry,
)
from delayed_retry.chain.digest import markers
from delayed_retry.headers import X_ACQUIRED_COUNT, X_DELIVERY_COUNT
from harness import RabbitMQNode


@dataclass
class Run:
    """What one run counted."""

    throttle: bool
    messages: int
    spent_a_retry: int = 0
    failed_handlings: int = 0
    parked: int = 0
    handled: int = 0
    trips: int = 0
    seconds_to_done: float = 0.0
    redelivered: int = 0
    delivery_counts: dict[str, int] = field(default_factory=dict)
    acquired_counts: dict[str, int] = field(default_factory=dict)


class Dependency:
    """Down for ``outage`` seconds from the first call; counts each message's failures."""

    def __init__(self, outage: float) -> None:
        self.outage = outage
        self.started: float | None = None
        self.failures: Counter[str] = Counter()
        self.handled: set[str] = set()
        self.redelivered = 0
        self.delivery_counts: Counter[str] = Counter()
        self.acquired_counts: Counter[str] = Counter()
        self.done = asyncio.Event()

    async def __call__(self, message: AbstractIncomingMessage) -> None:
        now = time.monotonic()
        if self.started is None:
            self.started = now
        key = message.body.decode()
        if now - self.started < self.outage:
            self.failures[key] += 1
            raise ConnectionError("the database is down")
        headers = message.headers or {}
        self.redelivered += bool(message.redelivered)
        self.delivery_counts[str(headers.get(X_DELIVERY_COUNT, 0))] += 1
        self.acquired_counts[str(headers.get(X_ACQUIRED_COUNT, "-"))] += 1
        self.handled.add(key)


async def _depth(connection: aio_pika.abc.AbstractConnection, queue: str) -> int:
    channel = await connection.channel()
    try:
        declared = await channel.declare_queue(queue, passive=True)
        return int(declared.declaration_result.message_count or 0)
    finally:
        await channel.close()


async def one_run(url: str, args: argparse.Namespace, *, throttled: bool) -> Run:
    prefix = f"bench-throttle-{secrets.token_hex(3)}"
    topology = DelayTopology(
        prefix=prefix, levels=20, unit=timedelta(milliseconds=1), queue_type=args.queue_type
    )
    name = f"{prefix}.work"
    parking = topology.default_parking_queue(name)
    dependency = Dependency(args.outage)
    throttle = (
        Throttle(
            consecutive=args.consecutive,
            probe_every=args.probe,
            counts=tenacity.retry_if_exception_type(ConnectionError),
        )
        if throttled
        else None
    )
    handler = with_delayed_retry(
        queue=name,
        topology=topology,
        max_retries=args.max_retries,
        wait=tenacity.wait_exponential(multiplier=1, min=1, max=30),
        instrumentation=NoInstrumentation(),
        throttle=throttle,
    )(dependency)
    connection = await aio_pika.connect_robust(url)
    run = Run(throttle=throttled, messages=args.messages)
    try:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=args.prefetch)
        queue = await channel.declare_queue(
            name, durable=True, arguments={"x-queue-type": args.queue_type}
        )
        for i in range(args.messages):
            await channel.default_exchange.publish(
                aio_pika.Message(str(i).encode(), message_id=f"m{i}", delivery_mode=2), name
            )
        tag = await consume(queue, handler)
        deadline = time.monotonic() + args.outage + args.max_wait
        while time.monotonic() < deadline:
            run.parked = await _depth(connection, parking)
            if len(dependency.handled) + run.parked >= args.messages:
                break
            await asyncio.sleep(0.25)
        started = dependency.started or time.monotonic()
        run.seconds_to_done = round(time.monotonic() - started, 1)
        await queue.cancel(tag)
        await handler.release_held()
        run.parked = await _depth(connection, parking)
        run.handled = len(dependency.handled)
        run.spent_a_retry = len(dependency.failures)
        run.failed_handlings = sum(dependency.failures.values())
        run.redelivered = dependency.redelivered
        run.delivery_counts = dict(dependency.delivery_counts)
        run.acquired_counts = dict(dependency.acquired_counts)
        run.trips = 0 if handler.throttle is None else handler.throttle.state.trips
        await channel.close()
    finally:
        await _clean(connection, topology, [name, parking])
        await connection.close()
    return run


async def _clean(
    connection: aio_pika.abc.AbstractConnection, topology: DelayTopology, queues: list[str]
) -> None:
    """Delete the run's queues and its whole chain (the shared broker keeps nothing)."""
    names = queues + [spec.name for spec in topology.queues()]
    exchanges = [spec.name for spec in topology.exchanges()] + list(markers(topology))
    channel = await connection.channel()
    for kind, items in (("queue", names), ("exchange", exchanges)):
        for item in items:
            try:
                if kind == "queue":
                    await channel.queue_delete(item)
                else:
                    await channel.exchange_delete(item)
            except Exception:
                channel = await connection.channel()  # an error closes the channel
    with contextlib.suppress(Exception):
        await channel.close()


@contextlib.contextmanager
def broker(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    if args.rabbitmq:
        with RabbitMQNode(version=args.rabbitmq) as node:
            yield node.url, args.rabbitmq
        return
    yield args.url, "the suite's broker"


async def with_and_without(args: argparse.Namespace) -> list[Run]:
    runs = []
    with broker(args) as (url, where):
        connection = await aio_pika.connect(url)
        version = str(connection.transport.connection.server_properties.get("version", "?"))
        await connection.close()
        print(f"RabbitMQ {version} ({where}), {args.queue_type} queues", file=sys.stderr)
        for throttled in (True, False):
            run = await one_run(url, args, throttled=throttled)
            print(json.dumps({"rabbitmq": version, **asdict(run)}), flush=True)
            runs.append(run)
    return runs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("throttle")
    group.add_argument("--throttle-rabbitmq", choices=("4.0", "4.3"), help="a node of this version")
    group.add_argument("--throttle-messages", type=int, default=300)
    group.add_argument(
        "--throttle-outage", type=float, default=20.0, help="s the dependency is down"
    )
    group.add_argument("--throttle-queue-type", choices=("quorum", "classic"), default="quorum")


async def throttle(suite: Suite) -> list[Row]:
    """The ``throttle`` workload: one outage with the throttle, then the same without it."""
    args = suite.args
    outage = argparse.Namespace(
        url=suite.url,
        rabbitmq=args.throttle_rabbitmq,
        messages=args.throttle_messages,
        outage=args.throttle_outage,
        consecutive=5,
        probe=1.0,
        prefetch=10,
        max_retries=3,
        queue_type=args.throttle_queue_type,
        max_wait=120.0,
    )
    # Without the throttle every message is parked: one warning each.
    logging.getLogger("delayed_retry.consumer.failures").setLevel(logging.ERROR)
    runs = await with_and_without(outage)
    with_throttle, without = runs
    met = (
        with_throttle.spent_a_retry < 40
        and with_throttle.parked == 0
        and with_throttle.handled == args.throttle_messages
    )
    return [
        {
            **asdict(with_throttle),
            "workload": f"throttle, {args.throttle_outage:g} s outage",
            "subject": "Throttle(consecutive=5, probe_every=1 s)",
            "unit": "messages spent a retry",
            "value": with_throttle.spent_a_retry,
            "baseline": "no throttle",
            "baseline_value": without.spent_a_retry,
            "ratio": (
                with_throttle.spent_a_retry / without.spent_a_retry
                if without.spent_a_retry
                else None
            ),
            "note": f"parked {with_throttle.parked} (without: {without.parked}), "
            f"handled {with_throttle.handled}/{args.throttle_messages}; target "
            "(<40 spent a retry, none parked, all handled) " + ("met" if met else "MISSED"),
        }
    ]
