"""The front door's x-delay contract, fed by a producer that is not aio-pika (pika)."""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from typing import Any

import aio_pika
import aiormq
import pika
import pytest

from delayed_retry.amqp.declarer import TopologyDeclarer
from delayed_retry.delivery.front_door import (
    BadDelay,
    FrontDoor,
    parse_x_delay,
)
from delayed_retry.headers import (
    X_DELAY,
    X_ORIGINAL_EXCHANGE,
    X_ORIGINAL_ROUTING_KEY,
    X_PARKED_REASON,
)
from tests.support.chain import Inbox, Scenario
from tests.support.services import lines_until_running, start_command
from tests.support.waiting import wait_until


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (None, 0),
        (5000, 5000),
        (-10, 0),
        ("5000", 5000),
        (" 42 ", 42),
        ("-7", 0),
        (b"12", 12),
        (1.2, 2),
        (Decimal("3.0"), 3),
    ],
)
def test_x_delay_values_read_as_the_plugin_does(value: object, ms: int) -> None:
    assert parse_x_delay(value) == ms


@pytest.mark.parametrize("value", ["soon", "", "1e3", True, math.nan, math.inf, [1], {"a": 1}])
def test_x_delay_values_that_are_not_delays(value: object) -> None:
    with pytest.raises(BadDelay) as info:
        parse_x_delay(value)
    assert info.value.reason == "bad-x-delay"


def _pika_publish(
    url: str,
    exchange: str,
    messages: list[tuple[str, bytes, dict[str, Any]]],
    *,
    delivery_mode: int = 2,
) -> None:
    """Publish with pika, in confirm mode: (routing key, body, headers) each."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for key, body, headers in messages:
            channel.basic_publish(
                exchange,
                key,
                body,
                properties=pika.BasicProperties(headers=headers, delivery_mode=delivery_mode),
                mandatory=True,
            )
    finally:
        connection.close()


def _track_door(s: Scenario, exchange: str) -> None:
    forward = s.topology.forward_queue(exchange)
    s.track_queue(f"{exchange}.delay", f"{exchange}.delay.parking", forward, f"{forward}.parking")
    s.track_exchange(exchange, f"{exchange}.delay")


@pytest.fixture
async def door(quorum: Scenario) -> AsyncIterator[FrontDoor]:
    exchange = quorum.name("plugin")
    _track_door(quorum, exchange)
    async with FrontDoor(quorum.connection, exchange=exchange, topology=quorum.topology) as opened:
        yield opened


async def test_pika_producer_gets_the_plugin_contract(
    quorum: Scenario, door: FrontDoor, rabbitmq_url: str
) -> None:
    s = quorum
    q = await s.queue()
    await q.bind(door.exchange, routing_key="orders.#")
    inbox = Inbox()
    await q.consume(inbox)
    sent = time.time()
    await asyncio.to_thread(
        _pika_publish,
        rabbitmq_url,
        door.delay_exchange,
        [
            ("orders.int", b"int", {X_DELAY: 600}),
            ("orders.str", b"str", {X_DELAY: "600"}),
            ("orders.none", b"none", {}),
            ("orders.negative", b"negative", {X_DELAY: -5}),
            ("invoices.x", b"not-bound", {X_DELAY: 1}),
        ],
    )
    # Published to X itself: at once, x-delay or not (X is an ordinary exchange).
    await asyncio.to_thread(
        _pika_publish, rabbitmq_url, door.exchange, [("orders.direct", b"direct", {X_DELAY: 600})]
    )
    arrivals = {a.message.body: a for a in await inbox.take(5)}
    assert set(arrivals) == {b"int", b"str", b"none", b"negative", b"direct"}
    for body in (b"int", b"str"):
        assert arrivals[body].at >= sent + 0.6, f"{body!r} came early"
        assert arrivals[body].headers[X_DELAY] == -600  # the plugin's mark of a delayed delivery
        assert arrivals[body].message.routing_key == f"orders.{body.decode()}"
        assert arrivals[body].message.exchange == door.exchange
    for body in (b"none", b"negative", b"direct"):
        assert arrivals[body].at < arrivals[b"int"].at
    # Nothing bound for invoices.x: kept with a record, not dropped.
    await s.wait_for_depth(f"{door.forward_queue}.parking", 1)


@pytest.mark.parametrize("delivery_mode", [1, 2])
async def test_every_copy_keeps_its_delivery_mode_and_names_where_it_was_sent(
    quorum: Scenario, door: FrontDoor, rabbitmq_url: str, delivery_mode: int
) -> None:
    q = await quorum.queue()
    await q.bind(door.exchange, routing_key="orders.#")
    inbox = Inbox()
    await q.consume(inbox)
    await asyncio.to_thread(
        _pika_publish,
        rabbitmq_url,
        door.delay_exchange,
        [
            ("orders.delayed", b"delayed", {X_DELAY: 300}),
            ("orders.none", b"none", {}),
            ("orders.zero", b"zero", {X_DELAY: 0}),
            ("orders.negative", b"negative", {X_DELAY: -5}),
            ("orders.forged", b"forged", {X_ORIGINAL_EXCHANGE: "elsewhere"}),
        ],
        delivery_mode=delivery_mode,
    )
    arrivals = {a.message.body: a for a in await inbox.take(5)}
    assert set(arrivals) == {b"delayed", b"none", b"zero", b"negative", b"forged"}
    for body, arrival in arrivals.items():
        assert arrival.message.delivery_mode == delivery_mode, body
        expected_exchange = "elsewhere" if body == b"forged" else door.exchange
        assert arrival.headers[X_ORIGINAL_EXCHANGE] == expected_exchange, body
        assert arrival.headers[X_ORIGINAL_ROUTING_KEY] == f"orders.{body.decode()}", body


async def test_x_delay_appears_only_once_bound_to_its_queue(
    quorum: Scenario, rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A producer that publishes as soon as X.delay exists loses nothing.

    The front door used to declare X.delay first and bind its queue only after
    the whole chain: for seconds on a fresh broker (a compose deployment),
    X.delay existed with no queue and dropped what producers sent it.
    """
    s = quorum
    exchange = s.name("early")
    _track_door(s, exchange)
    declaring_chain = asyncio.Event()
    go_on = asyncio.Event()
    declare_topology = TopologyDeclarer.topology

    async def slow_topology(self: TopologyDeclarer, connection: Any, topology: Any) -> None:
        if topology == s.topology and not go_on.is_set():
            declaring_chain.set()
            await go_on.wait()
        await declare_topology(self, connection, topology)

    monkeypatch.setattr(TopologyDeclarer, "topology", slow_topology)
    door = FrontDoor(s.connection, exchange=exchange, topology=s.topology)
    opening = asyncio.create_task(door.start())
    try:
        await asyncio.wait_for(declaring_chain.wait(), 30)
        producer = await aio_pika.connect(rabbitmq_url)
        async with producer:
            probe = await producer.channel()
            with pytest.raises(aiormq.exceptions.ChannelNotFoundEntity):
                await probe.get_exchange(door.delay_exchange, ensure=True)
            go_on.set()
            # A producer's view: poll for X.delay, publish the moment it is there.
            deadline = time.monotonic() + 30
            while True:
                probe = await producer.channel()
                try:
                    await probe.get_exchange(door.delay_exchange, ensure=True)
                    break
                except aiormq.exceptions.ChannelNotFoundEntity:
                    assert time.monotonic() < deadline, "X.delay never appeared"
                    await asyncio.sleep(0.001)
            publisher = await producer.channel(on_return_raises=True)
            inbox_exchange = await publisher.get_exchange(door.delay_exchange, ensure=False)
            # Returned (unroutable) messages raise instead of vanishing.
            await inbox_exchange.publish(
                aio_pika.Message(b"early", headers={X_DELAY: 5}, message_id="early"),
                routing_key="k",
                mandatory=True,
            )
        await asyncio.wait_for(opening, 30)
    finally:
        go_on.set()
        if not opening.done():
            opening.cancel()
        with contextlib.suppress(BaseException):
            await opening
        await door.close()


async def test_bad_and_too_long_delays_are_parked_with_a_record(
    quorum: Scenario, door: FrontDoor, rabbitmq_url: str
) -> None:
    s = quorum
    too_long = str(s.topology.max_delay // s.topology.max_delay.resolution + 1)
    await asyncio.to_thread(
        _pika_publish,
        rabbitmq_url,
        door.delay_exchange,
        [("k", b"bad", {X_DELAY: "soon"}), ("k", b"long", {X_DELAY: too_long})],
    )
    await s.wait_for_depth(f"{door.inbox_queue}.parking", 2)
    parked = await s.ch.get_queue(f"{door.inbox_queue}.parking")
    reasons = {}
    for _ in range(2):
        message = await parked.get(timeout=5)
        reasons[message.body] = message.headers[X_PARKED_REASON]
        await message.ack()
    assert reasons == {b"bad": "bad-x-delay", b"long": "delay-too-long"}


@pytest.fixture
def front_door_process(quorum: Scenario, rabbitmq_url: str) -> Iterator[Any]:
    """Start ``delayed-retry front-door`` as a subprocess; returns a starter; kills leftovers."""
    started: list[subprocess.Popen[str]] = []
    exchange = quorum.name("door")
    _track_door(quorum, exchange)

    def start() -> subprocess.Popen[str]:
        proc = start_command(
            [
                "--url",
                rabbitmq_url,
                "front-door",
                "--exchange",
                exchange,
                "--prefix",
                quorum.topology.prefix,
                "--levels",
                str(quorum.topology.levels),
                "--prefetch",
                "20",
            ]
        )
        started.append(proc)
        return proc

    start.exchange = exchange  # type: ignore[attr-defined]
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.mark.timeout(180)
async def test_front_door_loses_nothing_under_kill_9(
    quorum: Scenario, front_door_process: Any, rabbitmq_url: str
) -> None:
    s = quorum
    exchange = front_door_process.exchange
    first = front_door_process()
    await asyncio.to_thread(lines_until_running, first)
    q = await s.queue()
    await q.bind(exchange, routing_key="#")
    inbox = Inbox()
    await q.consume(inbox)
    n = 200
    await asyncio.to_thread(
        _pika_publish,
        rabbitmq_url,
        f"{exchange}.delay",
        # Every other one at once, so arrivals start while the intake is still going.
        [("k", str(i).encode(), {X_DELAY: (i % 2) * (50 + (i % 10) * 100)}) for i in range(n)],
    )
    seen = {(await inbox.get()).message.body}  # some went through: kill it mid-stream
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    forward = s.topology.forward_queue(exchange)

    async def left_behind() -> bool:
        return await s.depth(f"{exchange}.delay") + await s.depth(forward) > 0

    # The kill left work behind (unacked messages back in the queues), or it proves nothing.
    await wait_until(left_behind, what="messages left in X.delay or the forward queue")
    second = front_door_process()
    await asyncio.to_thread(lines_until_running, second)
    deadline = time.monotonic() + 60
    while len(seen) < n:  # duplicates allowed, losses not
        assert time.monotonic() < deadline, f"only {len(seen)} of {n} arrived after kill -9"
        seen.add((await inbox.get(timeout=30)).message.body)
    assert seen == {str(i).encode() for i in range(n)}
