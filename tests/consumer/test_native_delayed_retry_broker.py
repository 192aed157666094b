"""The library on RabbitMQ 4.3 queues that delay returned messages themselves.

RabbitMQ 4.3 quorum queues can hold a message that comes back to them
(``x-delayed-retry-type`` ``all``, ``failed`` or ``returned``, with
``x-delayed-retry-min``/``-max`` in milliseconds, or the same policy keys) for
``min x delivery-count`` before delivering it again. ``basic.nack`` with requeue
is a "returned" return and leaves the delivery count alone, so it is delayed by
``min`` every time; ``basic.reject`` and a closing channel are "failed" returns.
Comparison and figures: ``docs/native-delayed-retry.md``.

What the library does on such queues:

- a retry is a new message published into the delay chain, not a return, so
  the queue's delay never adds to it;
- a hand-over requeued after its window (``nack``, requeue) is delayed by the
  queue's minimum when the type is ``all`` or ``returned``: a later retry, no loss;
- messages held until due and requeued on shutdown come back after the
  queue's delay, late, never lost, never early;
- a native-retry policy on ``<prefix>.rejected`` (and on the team's queue) does
  not change the router's retries: dead-lettering is not a return.

The feature exists from 4.3 on, so every test here runs on a private 4.3 node of
its own, whatever version the rest of the suite runs on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import timedelta
from typing import Any

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue, AbstractRobustConnection

from delayed_retry import (
    Hold,
    NoInstrumentation,
    RetryRouter,
    consume,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.consumer import handover
from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.headers import X_RETRY
from harness import RabbitMQNode
from tests.consumer.test_decorator_broker import Calls
from tests.support.chain import Scenario, open_scenario, publish
from tests.support.nodes import private_node
from tests.support.waiting import WAIT, wait_until

pytestmark = [pytest.mark.broker, pytest.mark.private_node]

NATIVE_MS = 1500
"""The queues' native delay (min = max): far longer than any retry wait here, so it shows."""
NATIVE_S = NATIVE_MS / 1000
CLOCKS = 0.05
"""Broker and client clocks, and the nack's way to the broker: a delay may look this much short."""

SHORT_WINDOW = handover.HandOverTiming(window=1.0, first_pause=0.2, max_pause=0.4)
"""The hand-over's 30 s window cut to 1 s: the tests are about what the queue does with the
give-back that ends it, not about the window."""


def native(kind: str) -> dict[str, Any]:
    """Arguments of a quorum queue whose returns of ``kind`` the broker delays by NATIVE_MS."""
    return {
        "x-queue-type": "quorum",
        "x-delayed-retry-type": kind,
        "x-delayed-retry-min": NATIVE_MS,
        "x-delayed-retry-max": NATIVE_MS,
    }


@pytest.fixture(scope="module")
def node() -> Iterator[RabbitMQNode]:
    """A private RabbitMQ 4.3 node for this module, whatever DELAYED_RETRY_TEST_RABBITMQ says."""
    yield from private_node(version="4.3")


@pytest.fixture
async def broker(node: RabbitMQNode) -> AsyncIterator[AbstractRobustConnection]:
    connection = await aio_pika.connect_robust(node.url)
    try:
        yield connection
    finally:
        await connection.close()


@pytest.fixture
async def quorum43(
    broker: AbstractRobustConnection, unique: str, node: RabbitMQNode
) -> AsyncIterator[Scenario]:
    """A quorum chain of its own on the 4.3 node, deleted afterwards."""
    async with open_scenario(broker, unique, node.url, "quorum", levels=14) as opened:
        yield opened


@pytest.fixture
async def classic43(
    broker: AbstractRobustConnection, unique: str, node: RabbitMQNode
) -> AsyncIterator[Scenario]:
    """A classic chain on the 4.3 node: a full classic queue nacks every publish at once."""
    async with open_scenario(broker, unique, node.url, "classic", levels=14) as opened:
        yield opened


async def ctl(node: RabbitMQNode, *args: str) -> str:
    """``rabbitmqctl ARGS`` on the node, off the event loop (the consumers keep running)."""
    return await asyncio.to_thread(node.rabbitmqctl, *args)


async def listed(node: RabbitMQNode) -> dict[str, dict[str, Any]]:
    """``rabbitmqctl list_queues``: ``messages`` counts the messages a queue is delaying too
    (a passive declare's count and ``basic.get`` do not see them)."""
    out = await ctl(node, "list_queues", "name", "messages", "policy", "--formatter", "json")
    return {row["name"]: row for row in json.loads(out)}


async def wait_until_empty(node: RabbitMQNode, *queues: str) -> None:
    """Wait until no queue of ``queues`` holds a message: ready, unacked or delayed."""

    async def empty() -> bool:
        rows = await listed(node)
        return all(int(rows[q]["messages"]) == 0 for q in queues)

    await wait_until(empty, timeout=WAIT, interval=0.5, what=f"{queues} to be empty")


async def wait_for_policy(node: RabbitMQNode, policy: str, queues: list[str]) -> None:
    """Policies apply asynchronously: wait until each of ``queues`` lists ``policy``."""

    async def applied() -> bool:
        rows = await listed(node)
        return all(rows[q]["policy"] == policy for q in queues)

    await wait_until(applied, timeout=WAIT, interval=0.5, what=f"policy {policy} on {queues}")


async def native_queue(s: Scenario, kind: str, suffix: str = "work") -> AbstractQueue:
    name = s.name(suffix)
    s.track_queue(name, s.topology.default_parking_queue(name))
    return await s.ch.declare_queue(name, durable=True, arguments=native(kind))


async def test_retries_are_new_messages_the_queue_does_not_delay(
    quorum43: Scenario, node: RabbitMQNode
) -> None:
    s = quorum43
    calls = Calls()

    @with_delayed_retry(max_retries=3, wait=tenacity.wait_fixed(0.3), topology=s.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        if calls.record(message).attempt <= 2:
            raise ConnectionError("down")

    queue = await native_queue(s, "all")
    await consume(queue, handler)
    await publish(s.ch, queue.name, b"order", message_id="order")
    seen = [await calls.get() for _ in range(3)]
    assert [state.attempt for _, state, _, _ in seen] == [1, 2, 3]
    for at, state, headers, _ in seen[1:]:
        assert state.due_at is not None
        due = state.due_at.timestamp()
        assert at >= due, "a retry was handled before its due time"
        # A return would have waited NATIVE_S in the queue and carry the broker's count.
        assert at - due < NATIVE_S / 2, f"a retry came {at - due:.3f} s late"
        assert "x-acquired-count" not in headers, "a retry came back as a return"
    # Once each: nothing is left in the queue (delayed messages included) or the chain.
    await wait_until_empty(node, queue.name, *(spec.name for spec in s.topology.queues()))
    assert calls.queue.empty()


@pytest.mark.parametrize(
    ("kind", "delayed"), [("all", True), ("returned", True), ("failed", False)]
)
async def test_a_requeue_is_a_nack_that_the_queue_delays_by_its_minimum(
    classic43: Scenario,
    node: RabbitMQNode,
    kind: str,
    delayed: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    s = classic43
    caplog.set_level(logging.ERROR, logger="delayed_retry.consumer.handover")
    calls = Calls()

    # hold=None: the retry enters the chain's levels (held, a 0.2 s retry would not).
    @with_delayed_retry(
        max_retries=3, wait=tenacity.wait_fixed(0.2), topology=s.topology, hold=None
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        if calls.record(message).attempt == 1:
            raise ConnectionError("down")

    queue = await native_queue(s, kind)
    await consume(queue, RetryingHandler(handler.fn, replace(handler.options, timing=SHORT_WINDOW)))
    # Every publish into the chain is nacked: the hand-over keeps failing until the policy goes.
    policy = f"{s.unique}-full"
    levels = [s.topology.level_name(level) for level in range(s.topology.levels)]
    await ctl(
        node,
        "set_policy",
        "--apply-to",
        "queues",
        policy,
        rf"^{re.escape(s.unique)}\.level\.",
        '{"max-length":0,"overflow":"reject-publish"}',
    )

    def given_back() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "returning it to the queue" in r.getMessage()]

    try:
        await wait_for_policy(node, policy, levels)
        await publish(s.ch, queue.name, b"m", message_id="m")
        _, state, _, _ = await calls.get()
        assert state.attempt == 1
        await wait_until(lambda: bool(given_back()), what="the give-back ending the hand-over")
        given_back_at = given_back()[0].created
    finally:
        await ctl(node, "clear_policy", policy)
    again_at, state, headers, _ = await calls.get()
    assert state.attempt == 1, "the same message again, not a retry"
    # A nack: acquired once more, not counted toward the delivery limit.
    assert headers.get("x-acquired-count") == 1
    assert "x-delivery-count" not in headers
    late = again_at - given_back_at
    print(f"NATIVE give-back on x-delayed-retry-type={kind}: back after {late:.3f} s")
    if delayed:
        assert NATIVE_S - CLOCKS <= late < NATIVE_S + 1.0
    else:
        assert late < NATIVE_S / 2
    # The hand-over succeeds once the chain takes publishes again: one retry, handled once,
    # a new message that does not carry the original's broker counts.
    while state.attempt == 1:
        _, state, headers, _ = await calls.get()
    assert state.attempt == 2
    assert "x-acquired-count" not in headers
    await wait_until_empty(node, queue.name, s.topology.default_parking_queue(queue.name))
    assert calls.queue.empty()


@pytest.mark.parametrize("how", ["release_held", "close_channel"])
async def test_held_messages_given_back_on_shutdown_come_back_after_the_queue_delay(
    quorum43: Scenario, node: RabbitMQNode, how: str
) -> None:
    s = quorum43
    # A long lead, so each message is held for most of a second: time to shut down.
    hold = Hold(lead=timedelta(milliseconds=700), limit=timedelta(seconds=2))
    handled: defaultdict[str, list[tuple[float, dict[str, Any]]]] = defaultdict(list)

    @with_delayed_retry(topology=s.topology, hold=hold)
    async def handler(message: AbstractIncomingMessage) -> None:
        handled[message.message_id or ""].append((time.time(), dict(message.headers or {})))

    name = (await native_queue(s, "all")).name
    channel = await s.connection.channel()
    queue = await channel.get_queue(name)
    tag = await consume(queue, handler)
    due: dict[str, float] = {}
    for i in map(str, range(3)):
        due_at = await publish_delayed(
            s.ch,
            aio_pika.Message(b"later", message_id=i),
            queue=name,
            delay=1.2,
            topology=s.topology,
            hold=hold,
        )
        due[i] = due_at.timestamp()
    await wait_until(lambda: len(handler.options.held) == 3, what="three messages held")
    released_at = time.time()
    if how == "release_held":
        await queue.cancel(tag)
        assert await handler.release_held() == 3
    else:
        await channel.close()
    assert not handled, "a message was handled before its due time"

    consumer = await s.connection.channel()
    await consume(await consumer.get_queue(name), handler)
    await wait_until(lambda: len(handled) == 3, what="the three messages handled")
    for i, deliveries in handled.items():
        ((at, headers),) = deliveries
        assert at >= due[i], "handled before its due time"
        # Given back before due, they wait out the queue's delay, then are handled at once.
        assert NATIVE_S - CLOCKS <= at - released_at < NATIVE_S + 1.0
        print(f"NATIVE {how} on x-delayed-retry-type=all: {at - due[i]:.3f} s after due")
        if how == "release_held":  # a nack: not counted toward the delivery limit
            assert headers.get("x-acquired-count") == 1
            assert "x-delivery-count" not in headers
        else:  # returned by the closing channel: counted
            assert headers.get("x-delivery-count") == 1
    await wait_until_empty(node, name)


async def test_a_native_retry_policy_does_not_change_the_routers_retries(
    quorum43: Scenario, node: RabbitMQNode
) -> None:
    s = quorum43
    orders = s.name("orders")
    s.track_queue(orders, s.topology.default_parking_queue(orders))
    queue = await s.ch.declare_queue(
        orders,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": s.topology.rejected_exchange,
        },
    )
    router = RetryRouter(
        queues=[orders],
        max_retries=3,
        wait=tenacity.wait_fixed(0.3),
        topology=s.topology,
        instrumentation=NoInstrumentation(),
    )
    await router.declare(s.ch)  # declares <prefix>.rejected before the policy is set
    policy = f"{s.unique}-native"
    rejected = s.topology.rejected_queue
    await ctl(
        node,
        "set_policy",
        "--apply-to",
        "quorum_queues",
        policy,
        f"^({re.escape(rejected)}|{re.escape(orders)})$",
        json.dumps(
            {
                "delayed-retry-type": "all",
                "delayed-retry-min": NATIVE_MS,
                "delayed-retry-max": NATIVE_MS,
            }
        ),
    )
    try:
        await wait_for_policy(node, policy, [rejected, orders])
        await router.start(await s.connection.channel())
        arrivals: asyncio.Queue[tuple[float, AbstractIncomingMessage]] = asyncio.Queue()

        async def team_consumer(message: AbstractIncomingMessage) -> None:
            arrivals.put_nowait((time.time(), message))
            if (message.headers or {}).get(X_RETRY) is None:
                await message.reject(requeue=False)  # dead-lettered: not a return
            else:
                await message.ack()

        await queue.consume(team_consumer)
        await publish(s.ch, orders, b"order 7", message_id="o-7")
        first_at, first = await asyncio.wait_for(arrivals.get(), WAIT)
        again_at, again = await asyncio.wait_for(arrivals.get(), WAIT)
        assert first.body == again.body == b"order 7"
        assert (again.headers or {}).get(X_RETRY) == 1
        # The router's wait, not the queues' native delay.
        assert 0.3 <= again_at - first_at < NATIVE_S, f"back after {again_at - first_at:.3f} s"
        assert "x-acquired-count" not in (again.headers or {})
        await wait_until_empty(node, orders, rejected, s.topology.default_parking_queue(orders))
        assert arrivals.empty()
    finally:
        await ctl(node, "clear_policy", policy)
