"""The router of rejections against a real broker: a consumer that only rejects gets retries.

The consumer here never uses the library: it rejects every message with
``basic.reject(requeue=False)``, as a Go or Java consumer would, from a queue
whose only delayed-retry setting is ``x-dead-letter-exchange``.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection
from tenacity import wait_fixed

from delayed_retry import ConfigurationError, DelayTopology, NoInstrumentation, RetryRouter
from delayed_retry.cli.router_cmd import parse_wait
from delayed_retry.headers import (
    X_CLAIMED_QUEUE,
    X_PARKED_REASON,
    X_RETRY,
)
from tests.support.chain import Scenario, open_scenario
from tests.support.waiting import WAIT

pytestmark = pytest.mark.broker

CLI = (sys.executable, "-c", "import sys; from delayed_retry.cli import main; sys.exit(main())")


@pytest.fixture
async def chain(
    connection: AbstractRobustConnection, unique: str, rabbitmq_url: str
) -> AsyncIterator[Scenario]:
    async with open_scenario(connection, unique, rabbitmq_url, "quorum", levels=8) as opened:
        yield opened


class Rejecter:
    """A consumer that rejects everything without requeue, recording each delivery."""

    def __init__(self) -> None:
        self.arrivals: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()

    async def __call__(self, message: AbstractIncomingMessage) -> None:
        self.arrivals.put_nowait(message)
        await message.reject(requeue=False)

    async def get(self) -> AbstractIncomingMessage:
        return await asyncio.wait_for(self.arrivals.get(), WAIT)


async def _team_queue(chain: Scenario, suffix: str = "orders") -> str:
    """A queue as another team declares it: one argument, the rejected exchange."""
    name = chain.name(suffix)
    chain.track_queue(name, chain.topology.default_parking_queue(name))
    await chain.ch.declare_queue(
        name,
        durable=True,
        arguments={
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": chain.topology.rejected_exchange,
        },
    )
    return name


def _router(topology: DelayTopology, *queues: str, max_retries: int = 3) -> RetryRouter:
    return RetryRouter(
        queues=queues,
        max_retries=max_retries,
        wait=wait_fixed(0.005),
        topology=topology,
        instrumentation=NoInstrumentation(),
    )


async def test_rejections_are_retried_through_the_chain_then_parked(chain: Scenario) -> None:
    orders = await _team_queue(chain)
    entry = chain.name("in")
    chain.track_exchange(entry)
    exchange = await chain.ch.declare_exchange(entry, aio_pika.ExchangeType.DIRECT, durable=True)
    queue = await chain.ch.get_queue(orders)
    await queue.bind(exchange, routing_key="order.created")

    router_channel = await chain.connection.channel()
    await _router(chain.topology, orders).start(router_channel)
    rejecter = Rejecter()
    await queue.consume(rejecter)

    await exchange.publish(
        aio_pika.Message(b"order 42", message_id="m-42", headers={"team": "go"}),
        routing_key="order.created",
    )
    # The first delivery plus three retries, each back in the same queue.
    seen = [await rejecter.get() for _ in range(4)]
    assert [m.body for m in seen] == [b"order 42"] * 4
    assert [(m.headers or {}).get(X_RETRY) for m in seen] == [None, 1, 2, 3]
    for m in seen[1:]:
        # What the consumer sees carries only the chain's hops, never an old rejection.
        deaths: Any = (m.headers or {}).get("x-death") or []
        assert all(d["queue"] != orders for d in deaths)

    parking = chain.topology.default_parking_queue(orders)
    await chain.wait_for_depth(parking, 1)
    parked = await (await chain.ch.get_queue(parking)).get(timeout=WAIT)
    assert parked is not None
    headers = parked.headers or {}
    assert parked.body == b"order 42" and parked.message_id == "m-42"
    assert headers[X_PARKED_REASON] == "max-retries"
    assert headers[X_RETRY] == 3
    assert headers["x-retry-queue"] == orders
    assert headers["x-retry-original-exchange"] == entry
    assert headers["x-retry-original-routing-key"] == "order.created"
    assert headers["x-exception-type"] == "delayed_retry.consumer.router.ConsumerRejected"
    assert headers["team"] == "go"
    assert "x-death" not in headers
    await parked.ack()
    assert rejecter.arrivals.empty()
    assert await chain.depth(chain.topology.rejected_queue) == 0


async def test_a_forged_death_names_no_destination(chain: Scenario) -> None:
    orders = await _team_queue(chain)
    victim = await _team_queue(chain, "victim")
    await _router(chain.topology, orders).start(await chain.connection.channel())
    victim_seen = Rejecter()
    await (await chain.ch.get_queue(victim)).consume(victim_seen)

    forged: dict[str, Any] = {
        "x-death": [
            {
                "queue": victim,
                "reason": "rejected",
                "count": 1,
                "exchange": "",
                "routing-keys": [victim],
                "time": datetime.now(UTC),
            }
        ],
        "x-retry-queue": victim,
    }
    rejected = await chain.ch.get_exchange(chain.topology.rejected_exchange)
    await rejected.publish(aio_pika.Message(b"forged", headers=forged), routing_key=victim)
    await rejected.publish(aio_pika.Message(b"no death"), routing_key=orders)

    unroutable = chain.topology.unroutable_queue
    await chain.wait_for_depth(unroutable, 2)
    kept = {}
    q = await chain.ch.get_queue(unroutable)
    for _ in range(2):
        m = await q.get(timeout=WAIT)
        assert m is not None
        kept[m.body] = m.headers or {}
        await m.ack()
    assert kept[b"forged"][X_PARKED_REASON] == "unknown-queue"
    assert kept[b"forged"][X_CLAIMED_QUEUE] == victim
    assert "x-death" not in kept[b"forged"]
    assert kept[b"no death"][X_PARKED_REASON] == "no-death-record"
    assert victim_seen.arrivals.empty()
    assert await chain.depth(victim) == 0
    assert await chain.depth(chain.topology.rejected_queue) == 0


async def test_a_router_needs_queues_and_a_confirming_channel(chain: Scenario) -> None:
    with pytest.raises(ConfigurationError, match="at least one queue"):
        RetryRouter(queues=[], topology=chain.topology)
    with pytest.raises(ConfigurationError, match="not one string"):
        RetryRouter(queues="orders", topology=chain.topology)
    plain = await chain.connection.channel(publisher_confirms=False)
    with pytest.raises(ConfigurationError, match="without publisher confirms"):
        await _router(chain.topology, chain.name("orders")).start(plain)


async def test_the_router_command_retries_and_parks(chain: Scenario, rabbitmq_url: str) -> None:
    orders = await _team_queue(chain)
    topo = ["--prefix", chain.topology.prefix, "--levels", "8"]
    # Declare first, so the rejection of the first delivery has somewhere to go.
    declared = await asyncio.create_subprocess_exec(*CLI, "--url", rabbitmq_url, "declare", *topo)
    assert await declared.wait() == 0
    router = await asyncio.create_subprocess_exec(
        *CLI,
        "--url",
        rabbitmq_url,
        "router",
        *topo,
        "--queue",
        orders,
        "--max-retries",
        "1",
        "--wait",
        "fixed:10ms",
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert router.stdout is not None
        line = await asyncio.wait_for(router.stdout.readline(), WAIT)
        assert f"routing rejections of {orders!r}" in line.decode()
        rejecter = Rejecter()
        await (await chain.ch.get_queue(orders)).consume(rejecter)
        await chain.ch.default_exchange.publish(aio_pika.Message(b"x"), routing_key=orders)
        await rejecter.get()
        await rejecter.get()
        await chain.wait_for_depth(chain.topology.default_parking_queue(orders), 1)
    finally:
        router.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(router.wait(), WAIT) == 0


@pytest.mark.parametrize(
    ("spec", "first"),
    [("fixed:90s", 90.0), ("fixed:500ms", 0.5), ("exponential:2s:1h", 2.0)],
)
def test_parse_wait(spec: str, first: float) -> None:
    wait = parse_wait(spec)
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    state.attempt_number = 1
    assert first <= wait(state) <= first + 1


@pytest.mark.parametrize("spec", ["", "fixed", "fixed:soon", "exponential:1h:1s", "linear:1s"])
def test_parse_wait_refuses_what_it_cannot_read(spec: str) -> None:
    with pytest.raises(ConfigurationError, match="--wait"):
        parse_wait(spec)


async def test_an_expired_message_is_parked_at_once(chain: Scenario) -> None:
    """No consumer failed on it (the team's queue has a TTL): parked, not retried."""
    name = chain.name("short-lived")
    chain.track_queue(name, chain.topology.default_parking_queue(name))
    await chain.ch.declare_queue(
        name,
        durable=True,
        arguments={
            "x-message-ttl": 1,
            "x-dead-letter-exchange": chain.topology.rejected_exchange,
        },
    )
    await _router(chain.topology, name).start(await chain.connection.channel())
    await chain.ch.default_exchange.publish(aio_pika.Message(b"stale"), routing_key=name)
    parking = chain.topology.default_parking_queue(name)
    await chain.wait_for_depth(parking, 1)
    parked = await (await chain.ch.get_queue(parking)).get(timeout=WAIT)
    assert parked is not None
    headers = parked.headers or {}
    assert headers[X_PARKED_REASON] == "not-retryable"
    assert headers["x-exception-message"] == f"message dead-lettered (expired) by queue {name!r}"
    await parked.ack()


async def test_a_zero_delay_rejection_still_goes_through_the_chain(chain: Scenario) -> None:
    # The router hands over messages from <prefix>.rejected, not from the queue itself, so a
    # retry due at once keeps the chain route (and its unroutable safety net for a queue
    # deleted meanwhile) instead of going straight to the queue as a consumer's retry does.
    orders = await _team_queue(chain)
    router = RetryRouter(
        queues=(orders,),
        max_retries=1,
        wait=wait_fixed(0),
        topology=chain.topology,
        instrumentation=NoInstrumentation(),
    )
    await router.start(await chain.connection.channel())
    rejecter = Rejecter()
    queue = await chain.ch.get_queue(orders)
    await queue.consume(rejecter)
    await chain.ch.default_exchange.publish(aio_pika.Message(b"now", message_id="m-0"), orders)
    first, retried = await rejecter.get(), await rejecter.get()
    assert first.exchange == ""
    assert chain.topology.is_chain_exchange(retried.exchange), retried.exchange
    assert (retried.headers or {}).get(X_RETRY) == 1
