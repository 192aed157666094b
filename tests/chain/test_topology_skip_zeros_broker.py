"""Skip-zero routing: each level exchange binds the next 1 bit's queue directly.

A model of RabbitMQ's topic routing checks every delay of small chains
against the topology's bindings (one hop per 1 bit, one exchange per hop,
each message once, also with the earlier versions' pass-through bindings
beside them); the broker tests check the same on a real node, while the
bindings flip between the two versions' as in a rolling deploy.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import re
from dataclasses import dataclass, field

import aio_pika
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from delayed_retry import DelayTopology, declare_topology, publish_delayed
from delayed_retry.chain import routing_keys
from delayed_retry.headers import X_DUE_AT
from tests.support.chain import Inbox, Scenario

# -- a model of topic routing ---------------------------------------------------


def _topic_match(pattern: str, key: str) -> bool:
    """RabbitMQ's topic match: ``*`` one word, ``#`` zero or more."""

    def match(p: list[str], k: list[str]) -> bool:
        if not p:
            return not k
        if p[0] == "#":
            return any(match(p[1:], k[i:]) for i in range(len(k) + 1))
        return bool(k) and (p[0] == "*" or p[0] == k[0]) and match(p[1:], k[1:])

    return match(pattern.split("."), key.split("."))


@dataclass
class _Broker:
    """Exchanges, bindings and level queues' dead-letter exchanges of one topology."""

    queue_bindings: list[tuple[str, str, str]] = field(default_factory=list)  # (ex, queue, key)
    exchange_bindings: list[tuple[str, str, str]] = field(default_factory=list)  # (src, dst, key)
    dead_letter: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, topology: DelayTopology, *, retired: bool = False, dest: str = "q") -> _Broker:
        broker = cls()
        for spec in topology.queues():
            broker.queue_bindings += [(ex, spec.name, key) for ex, key in spec.bindings]
            dlx = spec.arguments.get("x_dead_letter_exchange")
            if dlx is not None:
                broker.dead_letter[spec.name] = dlx
        extra = topology.retired_bindings() if retired else []
        for destination, source, key in [*topology.exchange_bindings(), *extra]:
            broker.exchange_bindings.append((source, destination, key))
        broker.queue_bindings.append(
            (
                topology.delivery_exchange,
                dest,
                routing_keys.delivery_binding_key(topology.levels, dest),
            )
        )
        return broker

    def route(self, exchange: str, key: str) -> tuple[list[str], int]:
        """The queues a publish reaches (each once, as the broker dedups) and exchanges passed."""
        seen_exchanges: set[str] = set()
        queues: list[str] = []
        todo = [exchange]
        while todo:
            ex = todo.pop()
            if ex in seen_exchanges:
                continue
            seen_exchanges.add(ex)
            for source, queue, pattern in self.queue_bindings:
                if source == ex and _topic_match(pattern, key) and queue not in queues:
                    queues.append(queue)
            todo += [d for s, d, p in self.exchange_bindings if s == ex and _topic_match(p, key)]
        return queues, len(seen_exchanges)


def _travel(topology: DelayTopology, broker: _Broker, units: int) -> tuple[int, int, int]:
    """Follow one message: (hops, exchange passes, units waited); fails on a copy or a loss."""
    route = topology.route(units, "q")
    passes = waited = 0
    exchange = route.exchange
    for hops in range(topology.levels + 1):
        queues, passed = broker.route(exchange, route.routing_key)
        passes += passed
        assert len(queues) == 1, f"{units} units reached {queues} from {exchange}"
        (queue,) = queues
        if queue == "q":
            return hops, passes, waited
        waited += 1 << int(re.sub(r"^.*?(\d+)$", r"\1", queue))
        exchange = broker.dead_letter[queue]
    raise AssertionError(f"{units} units never left the chain")


@pytest.mark.parametrize("levels", [1, 2, 5, 8])
@pytest.mark.parametrize("retired", [False, True], ids=["this version", "mixed"])
def test_every_delay_hops_once_per_1_bit_and_arrives_once(levels: int, retired: bool) -> None:
    topology = DelayTopology(prefix="m", levels=levels)
    broker = _Broker.of(topology, retired=retired)
    for units in range(1 << levels):
        hops, passes, waited = _travel(topology, broker, units)
        assert waited == units
        assert hops == units.bit_count()
        if not retired:
            # The entry exchange, one per hop, and the delivery exchange; no delay goes
            # straight to the delivery exchange; level 0's queue dead-letters there itself.
            expected = 1 if units == 0 else hops + 2 - (units & 1)
            assert passes == expected, f"{units} units passed {passes} exchanges"


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=1, max_value=(1 << 36) - 1))
def test_long_delays_on_the_default_chain(units: int) -> None:
    topology = DelayTopology(prefix="m")
    hops, passes, waited = _travel(topology, _BROKER_36, units)
    assert (hops, waited) == (units.bit_count(), units)
    assert passes <= hops + 2


_BROKER_36 = _Broker.of(DelayTopology(prefix="m"))


def test_nservicebus_naming_keeps_its_pass_through_bindings() -> None:
    topology = DelayTopology.nservicebus()
    assert not topology.skips_zeros
    assert topology.retired_bindings() == []
    broker = _Broker.of(topology)
    hops, passes, waited = _travel(topology, broker, 0b1001)
    assert (hops, waited) == (2, 9)
    assert passes == 3 + 2  # levels 3..0 pass it down one by one, then the delivery exchange


def test_binding_keys_refuse_impossible_levels() -> None:
    with pytest.raises(ValueError, match="not a way down"):
        routing_keys.skip_binding_key(2, 3, 8)
    with pytest.raises(ValueError, match="outside"):
        routing_keys.drained_binding_key(8, 8)


# -- on a real broker -------------------------------------------------------------


def _hops(message: aio_pika.abc.AbstractIncomingMessage, topology: DelayTopology) -> int:
    """Level queues the message waited in, from its ``x-death`` header."""
    deaths: list[dict[str, object]] = (message.headers or {}).get("x-death") or []  # type: ignore[assignment]
    return sum(int(str(d["count"])) for d in deaths if topology.is_level_queue(str(d["queue"])))


async def _retired(scenario: Scenario, *, bind: bool) -> None:
    """Add (as an earlier version's declaration does) or remove the pass-through bindings."""
    raw = await scenario.ch.get_underlay_channel()
    for destination, source, key in scenario.topology.retired_bindings():
        if bind:
            await raw.exchange_bind(destination, source, routing_key=key)
        else:
            await raw.exchange_unbind(destination, source, routing_key=key)


async def _nothing_more(scenario: Scenario, queue: str, inbox: Inbox) -> None:
    """Fail if a copy of an earlier message arrives before a last one sent with the longest
    delay: copies made by routing travel with their originals."""
    topology = scenario.topology
    await publish_delayed(
        scenario.ch,
        aio_pika.Message(b"last"),
        queue=queue,
        delay=topology.max_units * topology.unit_ms / 1000,
        topology=topology,
    )
    arrival = await inbox.get()
    assert arrival.message.body == b"last", f"a copy of {arrival.message.body!r} arrived"
    assert await scenario.depth(topology.unroutable_queue) == 0


@pytest.mark.broker
async def test_mixed_bindings_deliver_each_message_once_with_its_hops(quorum: Scenario) -> None:
    topology = DelayTopology(prefix=quorum.unique, levels=8)
    quorum.topology = topology
    queue = await quorum.queue()
    await declare_topology(quorum.ch, topology=topology, queues=[queue.name])
    await _retired(quorum, bind=True)  # a service of an earlier version declared the chain
    inbox = Inbox()
    await queue.consume(inbox)
    delays = dict(enumerate(range(0, 256, 5)))
    for i, units in delays.items():
        await publish_delayed(
            quorum.ch,
            aio_pika.Message(str(i).encode()),
            queue=queue.name,
            delay=units / 1000,
            topology=topology,
        )
    arrivals = await inbox.take(len(delays))
    assert sorted(int(a.message.body) for a in arrivals) == sorted(delays)
    for arrival in arrivals:
        units = delays[int(arrival.message.body)]
        assert _hops(arrival.message, topology) == units.bit_count()
        assert arrival.at * 1000 >= arrival.headers[X_DUE_AT], f"{units} units arrived early"
    await _nothing_more(quorum, queue.name, inbox)


@pytest.mark.broker
async def test_a_rolling_deploy_loses_and_copies_nothing(
    quorum: Scenario, rabbitmq_url: str
) -> None:
    """Old and new services declaring the chain in turn while delays flow through it."""
    topology = DelayTopology(prefix=quorum.unique, levels=10)
    quorum.topology = topology
    queue = await quorum.queue()
    await declare_topology(quorum.ch, topology=topology, queues=[queue.name])
    inbox = Inbox()
    await queue.consume(inbox)
    flips = 0
    stop = asyncio.Event()

    async def deploy() -> None:
        nonlocal flips
        for old in itertools.cycle([True, False]):
            if stop.is_set():
                return
            if old:  # an earlier version's declaration adds the pass-through bindings
                await _retired(quorum, bind=True)
            else:  # this version's, on a new connection (declarations are cached per one)
                async with await aio_pika.connect(rabbitmq_url) as connection:
                    await declare_topology(await connection.channel(), topology=topology)
            flips += 1

    rng = random.Random(22)
    deployer = asyncio.create_task(deploy())
    sent = 400
    for i in range(sent):
        await publish_delayed(
            quorum.ch,
            aio_pika.Message(str(i).encode()),
            queue=queue.name,
            delay=rng.randrange(0, 1024) / 1000,
            topology=topology,
        )
    arrivals = await inbox.take(sent)
    stop.set()
    await deployer
    assert flips >= 4, f"the bindings changed only {flips} times"
    assert sorted(int(a.message.body) for a in arrivals) == list(range(sent))
    for arrival in arrivals:
        assert arrival.at * 1000 >= arrival.headers[X_DUE_AT]
    await _nothing_more(quorum, queue.name, inbox)
