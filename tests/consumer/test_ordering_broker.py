"""Order per key on a real broker: a key's later messages wait behind its message in the chain."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from delayed_retry import (
    ConfigurationError,
    RetryingHandler,
    consume,
    current_retry_state,
    declare_ordered_queues,
    publish_ordered,
    with_delayed_retry,
)
from delayed_retry.consumer import order_partition
from delayed_retry.consumer.order_partition import order_queue_name
from delayed_retry.headers.names import X_ORDER_RECORD, X_ORDER_TOKEN
from tests.support.chain import Scenario
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


def key_of(message: AbstractIncomingMessage) -> str:
    return message.body.decode().split(":")[0]


class Run:
    """A handler that records every successful handling per key; chosen messages fail."""

    def __init__(self, fails: dict[str, int]) -> None:
        self.fails = fails  # body -> how many attempts fail (large: always)
        self.handled: dict[str, list[str]] = defaultdict(list)

    def handler(self, scenario: Scenario, **options: Any) -> RetryingHandler[Any]:
        """The handler, retrying after 0.2 s up to 3 times unless ``options`` say otherwise."""
        settings = {
            "max_retries": 3,
            "wait": tenacity.wait_fixed(0.2),
            "topology": scenario.topology,
            **options,
        }

        @with_delayed_retry(**settings)
        async def handle(message: AbstractIncomingMessage) -> None:
            body = message.body.decode()
            state = current_retry_state()
            assert state is not None
            if state.attempt <= self.fails.get(body, 0):
                raise RuntimeError(f"{body} fails attempt {state.attempt}")
            self.handled[key_of(message)].append(body)

        return handle

    def count(self) -> int:
        return sum(len(v) for v in self.handled.values())


async def ordered_queue(scenario: Scenario, channel: AbstractChannel | None = None) -> str:
    name = scenario.name("work")
    scenario.track_queue(
        name,
        order_queue_name(name),
        f"{name}.dead-letter",
        scenario.topology.default_parking_queue(name),
    )
    await declare_ordered_queues(channel or scenario.ch, name)
    return name


async def start(url: str, name: str, handler: object) -> aio_pika.abc.AbstractRobustConnection:
    connection = await aio_pika.connect_robust(url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=20)
    queue = await channel.get_queue(name)
    await consume(queue, handler)  # type: ignore[arg-type]
    return connection


async def send(scenario: Scenario, name: str, bodies: list[str]) -> None:
    for body in bodies:
        await publish_ordered(
            scenario.ch, aio_pika.Message(body.encode()), queue=name, key=body.split(":")[0]
        )


BODIES = [f"{key}:{n}" for n in range(5) for key in ("a", "b")]


@pytest.mark.parametrize("ordered", [True, False])
async def test_a_keys_later_messages_wait_behind_its_retry(
    quorum: Scenario, rabbitmq_url: str, ordered: bool
) -> None:
    name = await ordered_queue(quorum)
    run = Run({"a:0": 2})
    options = {"ordered_by": key_of} if ordered else {}
    connection = await start(rabbitmq_url, name, run.handler(quorum, **options))
    try:
        await send(quorum, name, BODIES)
        await wait_until(lambda: run.count() == len(BODIES), what="every message handled")
        assert run.handled["b"] == [f"b:{n}" for n in range(5)]  # never held up
        if ordered:
            assert run.handled["a"] == [f"a:{n}" for n in range(5)]
        else:  # the test can fail: without order, a:0 comes back after the others
            assert run.handled["a"] == ["a:1", "a:2", "a:3", "a:4", "a:0"]
        await quorum.wait_for_depth(order_queue_name(name), 0)
    finally:
        await connection.close()


async def test_a_parked_blocker_releases_its_key_in_order(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    name = await ordered_queue(quorum)
    run = Run({"a:0": 99, "a:2": 1})
    connection = await start(rabbitmq_url, name, run.handler(quorum, ordered_by=key_of))
    try:
        await send(quorum, name, BODIES)
        await wait_until(lambda: run.count() == len(BODIES) - 1, what="all but a:0 handled")
        assert run.handled["a"] == ["a:1", "a:2", "a:3", "a:4"]
        await quorum.wait_for_depth(quorum.topology.default_parking_queue(name), 1)
    finally:
        await connection.close()


async def test_a_new_consumer_takes_the_waiting_keys_over(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    name = await ordered_queue(quorum)
    first = Run({"a:0": 1})
    first_handler = first.handler(quorum, wait=tenacity.wait_fixed(3), ordered_by=key_of)
    connection = await start(rabbitmq_url, name, first_handler)
    await send(quorum, name, BODIES)
    await wait_until(lambda: first.count() == 5, what="the b messages handled")
    # a:0 waits 3 s in the chain; a:1-a:4 wait behind it in the order queue, its block too.
    await connection.close()  # the records go back to the order queue
    order = order_queue_name(name)

    async def given_back() -> bool:
        # A message still being deferred at the close goes back to the partition instead;
        # a:0 itself may be back from the chain there too.
        records = await quorum.depth(order)
        return records >= 2 and records + await quorum.depth(name) in (5, 6)

    await wait_until(given_back, what="the records and a:1-a:4 back in their queues")
    second = Run({})
    connection = await start(rabbitmq_url, name, second.handler(quorum, ordered_by=key_of))
    try:
        await wait_until(lambda: second.count() == 5, timeout=30, what="a:0-a:4 handled")
        assert second.handled["a"] == [f"a:{n}" for n in range(5)]
        assert first.handled["a"] == []
    finally:
        await connection.close()


async def test_a_blocker_gone_from_the_chain_releases_its_key(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    name = await ordered_queue(quorum)
    run = Run({"a:0": 1})
    handler = run.handler(
        quorum, wait=tenacity.wait_fixed(2), ordered_by=key_of, ordered_release_after=1
    )
    connection = await start(rabbitmq_url, name, handler)
    try:
        await send(quorum, name, ["a:0", "a:1", "a:2"])
        topology = quorum.topology
        levels = [topology.level_name(n) for n in range(topology.levels)]
        purged = 0

        async def purge() -> bool:
            nonlocal purged
            for level in levels:
                queue = await quorum.ch.get_queue(level)
                purged += (await queue.purge()).message_count or 0
            return purged >= 1

        await wait_until(purge, what="a:0 purged from the chain")
        await wait_until(lambda: run.count() == 2, timeout=30, what="a:1 and a:2 released")
        assert run.handled["a"] == ["a:1", "a:2"]
    finally:
        await connection.close()


async def test_ordered_by_on_a_queue_without_single_active_consumer_is_refused(
    quorum: Scenario,
) -> None:
    queue = await quorum.queue("work")
    handler = Run({}).handler(quorum, ordered_by=key_of)
    with pytest.raises(ConfigurationError, match="x-single-active-consumer"):
        await consume(queue, handler)


def test_ordered_by_with_a_throttle_is_refused() -> None:
    from delayed_retry import Throttle

    with pytest.raises(ConfigurationError, match="throttle"):
        with_delayed_retry(ordered_by=key_of, throttle=Throttle(consecutive=3, probe_every=1.0))


async def test_an_order_queue_the_broker_refuses_keeps_the_messages_until_it_is_fixed(
    quorum: Scenario, rabbitmq_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    name = quorum.name("work")
    quorum.track_queue(name, order_queue_name(name), f"{name}.dead-letter")
    quorum.track_queue(quorum.topology.default_parking_queue(name))
    await declare_ordered_queues(quorum.ch, name)
    await quorum.ch.queue_delete(order_queue_name(name))
    await quorum.ch.declare_queue(order_queue_name(name), durable=True)  # classic: refused
    run = Run({})
    connection = await start(rabbitmq_url, name, run.handler(quorum, ordered_by=key_of))
    try:
        await send(quorum, name, ["a:0", "a:1"])
        await wait_until(
            lambda: "returning it to the queue" in caplog.text, what="the message given back"
        )
        assert run.count() == 0
        await quorum.ch.queue_delete(order_queue_name(name))  # the operator's fix
        await wait_until(lambda: run.count() == 2, timeout=30, what="both handled once fixed")
        assert run.handled["a"] == ["a:0", "a:1"]
    finally:
        await connection.close()


async def test_a_partition_holding_its_limit_gives_messages_back_none_lost(
    quorum: Scenario,
    rabbitmq_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(order_partition, "HELD_LIMIT", 3)  # a block and two messages behind it
    name = await ordered_queue(quorum)
    run = Run({"a:0": 1})
    handler = run.handler(quorum, wait=tenacity.wait_fixed(2), ordered_by=key_of)
    connection = await start(rabbitmq_url, name, handler)
    try:
        await send(quorum, name, [f"a:{n}" for n in range(6)])
        await wait_until(lambda: run.count() == 6, timeout=60, what="a:0-a:5 handled")
        # Those within the limit keep their order; those given back come back in an order
        # the broker chooses (docs/ordering.md), each handled once.
        assert run.handled["a"][:3] == ["a:0", "a:1", "a:2"]
        assert sorted(run.handled["a"]) == [f"a:{n}" for n in range(6)]
        assert "holds 3 records" in caplog.text
    finally:
        await connection.close()


async def test_records_held_long_are_replaced_by_fresh_copies(
    quorum: Scenario, rabbitmq_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Held past REFRESH_AFTER, each record is published again and the old one acked, so that no
    # record is held unacked as long as RabbitMQ's consumer_timeout. Here after 0.6 s, while
    # a:0 waits 4 s in the chain: every record is replaced several times.
    monkeypatch.setattr(order_partition, "REFRESH_AFTER", 0.6)
    refreshed: list[tuple[str, str]] = []
    publish = order_partition.Partition._publish

    async def counting(self: order_partition.Partition, **kwargs: Any) -> None:
        headers = kwargs["headers"]
        if order_partition._REFRESHED in headers:
            refreshed.append((headers[X_ORDER_RECORD], headers[X_ORDER_TOKEN]))
        await publish(self, **kwargs)

    monkeypatch.setattr(order_partition.Partition, "_publish", counting)
    name = await ordered_queue(quorum)
    run = Run({"a:0": 1})
    handler = run.handler(quorum, wait=tenacity.wait_fixed(4), ordered_by=key_of)
    connection = await start(rabbitmq_url, name, handler)
    try:
        await send(quorum, name, BODIES)
        await wait_until(lambda: run.count() == len(BODIES), timeout=60, what="every message")
    finally:
        await connection.close()
    # Each message once, in order: a replaced record ran once, its fresh copy not again.
    assert run.handled["a"] == [f"a:{n}" for n in range(5)]
    assert run.handled["b"] == [f"b:{n}" for n in range(5)]
    # The block and the four messages behind it were each refreshed, more than once.
    kinds = {kind for kind, _ in refreshed}
    assert kinds == {"block", "deferred"}, refreshed
    assert len({token for _, token in refreshed}) == 5, refreshed
    assert len(refreshed) > 5
    # Every copy replaced was acked, the last ones once they ran: nothing is left behind.
    await quorum.wait_for_depth(order_queue_name(name), 0)


async def test_more_messages_wait_behind_a_key_than_a_quorum_queue_gives_by_default(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    # A quorum queue gives a consumer without a prefetch 2,000 unacked messages at most:
    # the order queue's records past that must still arrive, or the consumer waits for ever.
    name = await ordered_queue(quorum)
    bodies = [f"a:{n}" for n in range(2_300)]
    run = Run({"a:0": 1})
    handler = run.handler(quorum, wait=tenacity.wait_fixed(5), ordered_by=key_of)
    await send(quorum, name, bodies)  # all in the queue before a:0 fails and comes back
    connection = await start(rabbitmq_url, name, handler)
    try:
        await wait_until(lambda: run.count() == len(bodies), timeout=120, what="all 2,300 handled")
        assert run.handled["a"] == bodies
    finally:
        await connection.close()


async def test_each_retry_of_the_waiting_message_moves_its_keys_release(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    # a:0 waits 1 s, then 4 s. Released 2 s past its first due time, a:1 would run before it.
    name = await ordered_queue(quorum)
    run = Run({"a:0": 2})
    handler = run.handler(
        quorum,
        wait=tenacity.wait_chain(tenacity.wait_fixed(1), tenacity.wait_fixed(4)),
        ordered_by=key_of,
        ordered_release_after=2,
    )
    connection = await start(rabbitmq_url, name, handler)
    try:
        await send(quorum, name, ["a:0", "a:1", "a:2"])
        await wait_until(lambda: run.count() == 3, timeout=30, what="a:0-a:2 handled")
        assert run.handled["a"] == ["a:0", "a:1", "a:2"]
    finally:
        await connection.close()


async def test_a_message_that_went_back_to_its_queue_keeps_its_turn(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    name = await ordered_queue(quorum)
    run = Run({"a:0": 1})
    nacked: list[str] = []

    @with_delayed_retry(
        max_retries=3, wait=tenacity.wait_fixed(0.5), topology=quorum.topology, ordered_by=key_of
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        body = message.body.decode()
        if body == "a:1" and not nacked:  # runs from the order queue, then asks to go back
            nacked.append(body)
            await message.nack(requeue=True)
            return
        await run.handler(quorum).fn(message)

    connection = await start(rabbitmq_url, name, handle)
    try:
        await send(quorum, name, ["a:0", "a:1", "a:2"])
        await wait_until(lambda: run.count() == 3, timeout=30, what="a:0-a:2 handled")
        assert nacked == ["a:1"]
        assert run.handled["a"] == ["a:0", "a:1", "a:2"]
    finally:
        await connection.close()


async def test_two_alike_messages_without_an_id_both_run(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    # Without a message_id, both have one token; neither is a redelivery, so both are kept.
    name = await ordered_queue(quorum)
    run = Run({"a:0": 1})
    connection = await start(rabbitmq_url, name, run.handler(quorum, ordered_by=key_of))
    try:
        await send(quorum, name, ["a:0", "a:1", "a:1", "a:2"])
        await wait_until(lambda: run.count() == 4, timeout=30, what="all four handled")
        assert run.handled["a"] == ["a:0", "a:1", "a:1", "a:2"]
    finally:
        await connection.close()
