"""Every consumer the library runs consumes again after the broker comes back, and says so.

The front door, the forwarder, the router and the alerts service run as the
commands an operator starts; a consumer decorated with ``@with_delayed_retry``
runs in the test process (:func:`~delayed_retry.consume`), and so does a
FastStream subscriber with ``DelayedRetry``. The broker is restarted, then it
closes every connection; after each fault, readiness must turn 503 while a
service is not consuming, then 200, and NEW messages sent down each path
must arrive: once, not before they are due. A consumer left on a queue the
robust channel does not track is gone after the fault (the broker shows no
consumer) and never takes those messages: these tests fail on it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from functools import partial
from typing import Any

import aio_pika
import aiormq
import pytest
from aio_pika.abc import AbstractIncomingMessage
from faststream.rabbit import QueueType, RabbitBroker, RabbitQueue
from tenacity import wait_fixed

from delayed_retry import (
    ConfigurationError,
    DelayTopology,
    NoInstrumentation,
    consume,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.amqp.channels import declared_queue, underlay_connection
from delayed_retry.amqp.consumers import consume_queue, start_consumer
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.faststream import DelayedRetry
from harness import RabbitMQNode, free_port
from tests.support.services import (
    get,
    metric,
    start_command,
    stop,
    wait_readiness,
    wait_status,
)
from tests.support.waiting import wait_until

from ._fleet import (
    DELAY,
    WITH_ALERTS,
    Path,
    ServiceProcesses,
    alert_round,
    consumers_back,
    declare_fleet,
    deliver_round,
    fleet_names,
    in_process,
    remove_fleet,
)
from ._support import QUORUM

pytestmark = pytest.mark.private_node

TOPOLOGY = DelayTopology(
    prefix=f"rc-{secrets.token_hex(3)}", levels=12, unit=timedelta(milliseconds=1)
)
NAMES = fleet_names(TOPOLOGY.prefix)


@pytest.fixture(scope="module")
def services(node: RabbitMQNode) -> Iterator[ServiceProcesses]:
    """The three service commands on the module's node, for every fault in turn."""
    asyncio.run(declare_fleet(node.url, TOPOLOGY, NAMES))
    processes = ServiceProcesses(node.url, topology=TOPOLOGY, names=NAMES, services=WITH_ALERTS)
    try:
        processes.start()
        yield processes
    finally:
        outputs = processes.stop()
        if not node.running:
            node.start()
        asyncio.run(remove_fleet(node.url, TOPOLOGY, NAMES))
        print("\n".join(f"--- {s}\n{out[-3000:]}" for s, out in outputs.items()))


def _ready(services: ServiceProcesses) -> dict[str, dict[str, Any]]:
    return services.wait_all(200)


def _check_restored(
    before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]], fault: str
) -> None:
    for service in WITH_ALERTS:
        up = after[service]
        assert up["checks"]["consuming"] is True, (service, up)
        assert up["checks"]["broker_sees_consumers"] is True, (service, up)
        assert up["reconnects"] > before[service]["reconnects"], (service, fault, up)
        for queue, detail in up["consumers"].items():
            was = before[service]["consumers"][queue]["restored"]
            assert detail["in_place"] and detail["restored"] > was, (service, queue, up)
            assert detail["broker_consumers"] >= 1, (service, queue, up)


@pytest.mark.timeout(420)
async def test_every_consumer_takes_new_messages_after_a_broker_restart(
    node: RabbitMQNode, services: ServiceProcesses
) -> None:
    async with in_process(node.url, TOPOLOGY, NAMES) as fleet:
        before = await asyncio.to_thread(_ready, services)
        await asyncio.to_thread(node.stop)
        down = await asyncio.to_thread(services.wait_all, 503)
        for service, body in down.items():
            assert body["checks"]["connected"] is False, (service, body)
            assert not any(c["in_place"] for c in body["consumers"].values()), (service, body)
        await asyncio.to_thread(node.start)
        after = await asyncio.to_thread(_ready, services)
        _check_restored(before, after, "a broker restart")
        await consumers_back(node.url, NAMES)
        await deliver_round(node.url, TOPOLOGY, NAMES, fleet, fault="a broker restart")
        await alert_round(node.url, TOPOLOGY, services)


@pytest.mark.timeout(420)
async def test_every_consumer_takes_new_messages_after_the_broker_closes_every_connection(
    node: RabbitMQNode, services: ServiceProcesses
) -> None:
    async with in_process(node.url, TOPOLOGY, NAMES) as fleet:
        before = await asyncio.to_thread(_ready, services)
        await asyncio.to_thread(node.rabbitmqctl, "close_all_connections", "reconnect test")
        # The services reconnect within a second or so: readiness counts the reconnect and
        # every consumer's restoration before it is 200 again.
        for service in WITH_ALERTS:
            was: int = before[service]["reconnects"]

            def reconnected(status: int, body: dict[str, Any], was: int = was) -> bool:
                return status == 200 and int(body["reconnects"]) > was

            await asyncio.to_thread(
                wait_readiness,
                services.ports[service],
                reconnected,
                what=f"{service} ready after a reconnect",
                proc=services.procs[service],
            )
        after = await asyncio.to_thread(_ready, services)
        _check_restored(before, after, "close_all_connections")
        for service in WITH_ALERTS:
            page = (await asyncio.to_thread(get, services.ports[service], "/metrics"))[1]
            reconnects = metric(page, "delayed_retry_service_reconnects_total", service=service)
            restored = metric(
                page, "delayed_retry_service_consumers_restored_total", service=service
            )
            assert reconnects is not None and reconnects >= 1, (service, page[-2000:])
            assert restored is not None and restored >= len(after[service]["consumers"])
        await consumers_back(node.url, NAMES)
        await deliver_round(node.url, TOPOLOGY, NAMES, fleet, fault="close_all_connections")
        await alert_round(node.url, TOPOLOGY, services)


@pytest.mark.timeout(180)
async def test_a_forwarder_is_not_ready_while_its_exchange_is_missing(node: RabbitMQNode) -> None:
    exchange = f"rc-missing-{secrets.token_hex(3)}"
    port = free_port()
    chain = ["--prefix", TOPOLOGY.prefix, "--levels", "12", "--unit-ms", "1"]
    proc = start_command(
        ["--url", node.url, "forwarder", "--exchange", exchange, *chain, "--health-port", str(port)]
    )
    connection = await aio_pika.connect(node.url)
    try:
        down = await asyncio.to_thread(
            wait_readiness,
            port,
            lambda status, body: status == 503 and body["checks"]["started"],
            what="started and not ready",
            proc=proc,
        )
        assert down["checks"]["exchanges_exist"] is False
        assert down["checks"]["consuming"] is True  # only the exchange keeps it from ready
        channel = await connection.channel()
        await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
        up = await asyncio.to_thread(wait_status, port, "/readyz", 200, proc=proc)
        assert up["checks"]["exchanges_exist"] is True
        await channel.exchange_delete(exchange)
        again = await asyncio.to_thread(wait_status, port, "/readyz", 503, proc=proc)
        assert again["checks"]["exchanges_exist"] is False
    finally:
        code, _, output = await asyncio.to_thread(stop, proc)
        channel = await connection.channel()
        await channel.queue_delete(TOPOLOGY.forward_queue(exchange))
        await channel.queue_delete(f"{TOPOLOGY.forward_queue(exchange)}.parking")
        await connection.close()
    assert code == 0, output


async def test_a_queue_the_robust_channel_does_not_track_is_refused(node: RabbitMQNode) -> None:
    queue = f"rc-untracked-{secrets.token_hex(3)}"

    @with_delayed_retry(topology=TOPOLOGY)
    async def handle(message: AbstractIncomingMessage) -> None:
        del message

    connection = await aio_pika.connect_robust(node.url)
    try:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True, arguments=QUORUM)
        untracked = await channel.get_queue(queue, ensure=False)
        with pytest.raises(ConfigurationError, match=r"ensure=False.*declare_queue\("):
            await consume(untracked, handle)
        with pytest.raises(ConfigurationError, match="nothing would consume it again"):
            await start_consumer(untracked, handle)
        declared = await declared_queue(connection, queue)
        assert declared is not None and declared.consumer_count == 0  # nothing was started
    finally:
        channel = await connection.channel()
        await channel.queue_delete(queue)
        await connection.close()


async def test_a_consumer_knows_whether_the_broker_has_it(node: RabbitMQNode) -> None:
    queue = f"rc-consumer-{secrets.token_hex(3)}"
    got: asyncio.Queue[bytes] = asyncio.Queue()

    async def on_message(message: AbstractIncomingMessage) -> None:
        await got.put(message.body)
        await message.ack()

    connection = await aio_pika.connect_robust(node.url, reconnect_interval=1)
    reconnected = asyncio.Event()
    connection.reconnect_callbacks.add(lambda *_: reconnected.set())
    try:
        channel = await connection.channel()
        await channel.declare_queue(queue, durable=True, arguments=QUORUM)
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await consume_queue(await connection.channel(), f"{queue}-missing", on_message)
        consumer = await consume_queue(channel, queue, on_message)
        assert consumer.in_place and consumer.restored == 0

        # An untracked consumer beside it, the mistake the library no longer makes.
        raw_channel = await connection.channel()
        untracked = await raw_channel.get_queue(queue, ensure=False)
        await untracked.consume(on_message)
        assert (await declared_queue(connection, queue)).consumer_count == 2  # type: ignore[union-attr]

        await asyncio.to_thread(node.rabbitmqctl, "close_all_connections", "consumer test")
        await asyncio.wait_for(reconnected.wait(), 60)
        await wait_until(lambda: consumer.in_place, timeout=30, what="the consumer restored")
        assert consumer.restored == 1 and consumer.lost == 0
        # The broker has the restored consumer only: the untracked one is gone for good.
        declared = await declared_queue(connection, queue)
        assert declared is not None and declared.consumer_count == 1

        publisher = await connection.channel()
        await publisher.default_exchange.publish(aio_pika.Message(b"after"), routing_key=queue)
        assert await asyncio.wait_for(got.get(), 30) == b"after"

        await consumer.cancel()
        assert not consumer.in_place
        await wait_until(
            lambda: _consumers(connection, queue, 0), timeout=30, what="no consumer left"
        )
    finally:
        channel = await connection.channel()
        await channel.queue_delete(queue)
        await connection.close()


async def _consumers(connection: Any, queue: str, count: int) -> bool:
    """Whether the broker counts ``count`` consumers on ``queue`` (false while unreachable)."""
    try:
        declared = await declared_queue(connection, queue)
    except (RuntimeError, ConnectionError, aiormq.exceptions.AMQPError):
        return False  # the robust connection is reconnecting
    return declared is not None and declared.consumer_count == count


@pytest.mark.timeout(300)
async def test_a_faststream_subscriber_takes_new_messages_after_each_fault(
    node: RabbitMQNode,
) -> None:
    queue = f"rc-faststream-{secrets.token_hex(3)}"
    broker = RabbitBroker(
        node.url,
        logger=None,
        middlewares=[
            DelayedRetry(
                topology=TOPOLOGY, wait=wait_fixed(DELAY), instrumentation=NoInstrumentation()
            )
        ],
    )
    path = Path("faststream")
    seen: Counter[str] = Counter()

    @broker.subscriber(RabbitQueue(queue, queue_type=QueueType.QUORUM, durable=True))
    async def handle(body: str) -> None:
        seen[body] += 1
        if seen[body] == 1:  # fails once: back after DELAY
            path.sent[body] = time.time() + DELAY
            raise RuntimeError("fails once")
        path.record(body)

    await broker.start()
    connection = await aio_pika.connect_robust(node.url)
    try:
        for fault in ("close_all_connections", "a broker restart"):
            if fault == "close_all_connections":
                await asyncio.to_thread(node.rabbitmqctl, "close_all_connections", "faststream")
            else:
                await asyncio.to_thread(node.restart)
            await wait_until(
                lambda: _consumers(connection, queue, 1),
                timeout=60,
                what=f"the subscriber back after {fault}",
            )
            sent = {f"{fault}-{i}" for i in range(5)}
            fence = {f"{fault}-fence"}
            for body in sorted(sent):
                await broker.publish(body, queue)
            await wait_until(partial(path.all_arrived, sent), timeout=60, what=f"after {fault}")
            await broker.publish(next(iter(fence)), queue)
            await wait_until(partial(path.all_arrived, fence), timeout=60, what="the fence")
            path.check(sent, fault)
    finally:
        await broker.stop()
        channel = await connection.channel()
        await channel.queue_delete(queue)
        await channel.queue_delete(TOPOLOGY.default_parking_queue(queue))
        await connection.close()


@pytest.mark.timeout(180)
async def test_a_forwarder_whose_queue_is_deleted_is_not_ready_until_it_consumes_it_again(
    node: RabbitMQNode,
) -> None:
    exchange = f"rc-deleted-{secrets.token_hex(3)}"
    forward_queue = TOPOLOGY.forward_queue(exchange)
    port = free_port()
    chain = ["--prefix", TOPOLOGY.prefix, "--levels", "12", "--unit-ms", "1"]
    connection = await aio_pika.connect(node.url)
    channel = await connection.channel()
    x = await channel.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
    target = await channel.declare_queue(f"{exchange}.target", durable=True, arguments=QUORUM)
    await target.bind(x, "#")
    proc = start_command(
        ["--url", node.url, "forwarder", "--exchange", exchange, *chain, "--health-port", str(port)]
    )
    try:
        await asyncio.to_thread(wait_status, port, "/readyz", 200, proc=proc)
        await channel.queue_delete(forward_queue)  # the broker cancels the forwarder's consumer
        down = await asyncio.to_thread(wait_status, port, "/readyz", 503, proc=proc)
        assert down["consumers"][forward_queue]["in_place"] is False, down
        underlay = await underlay_connection(connection)
        await declarer_for(underlay).forward_queue(underlay, TOPOLOGY, exchange)
        up = await asyncio.to_thread(wait_status, port, "/readyz", 200, proc=proc)
        assert up["consumers"][forward_queue]["in_place"] is True, up
        await publish_delayed(
            channel,
            aio_pika.Message(b"after"),
            exchange=exchange,
            routing_key="k",
            delay=0.5,
            topology=TOPOLOGY,
        )
        bodies: list[bytes] = []

        async def arrived() -> bool:
            message = await target.get(fail=False)
            if message is not None:
                bodies.append(message.body)
                await message.ack()
            return bool(bodies)

        await wait_until(arrived, timeout=30, what="a forward after the queue came back")
        assert bodies == [b"after"]
    finally:
        code, _, output = await asyncio.to_thread(stop, proc)
        for queue in (forward_queue, f"{forward_queue}.parking", target.name):
            await channel.queue_delete(queue)
        await channel.exchange_delete(exchange)
        await connection.close()
    assert code == 0, output
