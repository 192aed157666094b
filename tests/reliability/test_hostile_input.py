"""Hostile and broken input: forged routing headers, huge bodies and headers, bad text,
deep tables, absurd retry counts and delays. Each has a defined outcome; nothing is lost.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import pamqp.encode
import pytest
import tenacity
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection
from pamqp.common import FieldTable

from delayed_retry import (
    ConfigurationError,
    DelayOutOfRangeError,
    DelayTopology,
    RetryAfter,
    consume,
    current_retry_state,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.headers import (
    X_DUE_AT,
    X_ORIGINAL_EXCHANGE,
    X_ORIGINAL_ROUTING_KEY,
    X_PARKED_REASON,
    X_QUEUE,
    X_RETRY,
)
from delayed_retry.parking.shortcuts import replay_parked
from tests.support.queues import delete_all, depth
from tests.support.waiting import wait_until

from ._support import QUORUM

Behaviour = Callable[[AbstractIncomingMessage, int], Any]


@dataclass
class Consumer:
    """One retrying consumer on a fresh queue, recording attempts, successes and parkings."""

    channel: AbstractChannel
    queue: str
    topology: DelayTopology
    attempts: Counter[str] = field(default_factory=Counter)
    handled: dict[str, AbstractIncomingMessage] = field(default_factory=dict)
    parked: dict[str, AbstractIncomingMessage] = field(default_factory=dict)

    async def publish(self, body: bytes, message_id: str, **props: Any) -> None:
        await self.channel.default_exchange.publish(
            aio_pika.Message(body, message_id=message_id, **props), routing_key=self.queue
        )

    async def wait_parked(self, message_id: str, timeout: float = 30) -> AbstractIncomingMessage:
        parking = await self.channel.declare_queue(
            self.topology.default_parking_queue(self.queue), passive=True
        )

        async def found() -> bool:
            while (message := await parking.get(fail=False, no_ack=False)) is not None:
                self.parked[message.message_id or ""] = message
                await message.ack()
            return message_id in self.parked

        await wait_until(found, timeout=timeout, what=f"message {message_id} parked")
        return self.parked[message_id]

    async def wait_handled(self, message_id: str, timeout: float = 30) -> AbstractIncomingMessage:
        await wait_until(
            lambda: message_id in self.handled, timeout=timeout, what=f"{message_id} handled"
        )
        return self.handled[message_id]


@pytest.fixture
async def start_consumer(
    connection: AbstractRobustConnection, unique: str
) -> AsyncIterator[Callable[..., Any]]:
    channel = await connection.channel()
    topology = DelayTopology(prefix=unique, levels=12)
    queue = f"{unique}.work"
    await channel.declare_queue(queue, durable=True, arguments=QUORUM)

    async def start(behaviour: Behaviour, **options: Any) -> Consumer:
        consumer = Consumer(channel, queue, topology)
        options.setdefault("max_retries", 1)
        options.setdefault("wait", tenacity.wait_fixed(0.05))

        @with_delayed_retry(topology=topology, **options)
        async def handle(message: AbstractIncomingMessage) -> None:
            key = message.message_id or ""
            consumer.attempts[key] += 1
            state = current_retry_state()
            assert state is not None
            await behaviour(message, state.attempt)
            consumer.handled[key] = message

        consumer_channel = await connection.channel()
        q = await consumer_channel.declare_queue(queue, passive=True)
        await consume(q, handle)
        return consumer

    try:
        yield start
    finally:
        await delete_all(channel, topology=topology, queues=[queue])


async def fail_first(message: AbstractIncomingMessage, attempt: int) -> None:
    if attempt == 1:
        raise RuntimeError("first attempt fails")


async def always_fail(message: AbstractIncomingMessage, attempt: int) -> None:
    raise RuntimeError(f"attempt {attempt} fails")


# --- forged headers -----------------------------------------------------------------


async def test_forged_routing_headers_do_not_route_anywhere_else(
    start_consumer: Callable[..., Any], connection: AbstractRobustConnection, unique: str
) -> None:
    channel = await connection.channel()
    victim = f"{unique}.victim"
    victim_exchange = f"{unique}.victim-ex"
    await channel.declare_queue(victim, durable=True, arguments=QUORUM)
    ex = await channel.declare_exchange(victim_exchange, aio_pika.ExchangeType.FANOUT)
    await (await channel.declare_queue(victim, passive=True)).bind(ex)
    consumer = await start_consumer(always_fail)
    try:
        forged: FieldTable = {
            X_QUEUE: victim,
            X_ORIGINAL_EXCHANGE: victim_exchange,
            X_ORIGINAL_ROUTING_KEY: victim,
            X_RETRY: 0,
        }
        await consumer.publish(b"forged", "forged", headers=forged)
        parked = await consumer.wait_parked("forged")
        # Retried back to the queue it was consumed from, then parked in that queue's parking.
        assert consumer.attempts["forged"] == 2
        assert parked.headers[X_QUEUE] == consumer.queue
        assert parked.headers[X_PARKED_REASON] == "max-retries"
        assert await depth(channel, victim) == 0
        # Replay goes to the parking queue's own queue unless the operator names another,
        # whatever a parked message's headers say.
        await channel.default_exchange.publish(
            aio_pika.Message(b"forged-3", message_id="forged-3", headers=forged),
            routing_key=consumer.topology.default_parking_queue(consumer.queue),
        )
        result = await replay_parked(channel, queue=consumer.queue, topology=consumer.topology)
        assert result.to_queue == consumer.queue
        await wait_until(
            lambda: consumer.attempts["forged-3"] >= 1, timeout=30, what="the replayed message"
        )
        assert await depth(channel, victim) == 0
    finally:
        await delete_all(channel, queues=[victim, f"{victim}.parking"])
        await channel.exchange_delete(victim_exchange)


async def test_forged_due_time_on_a_direct_publish_does_not_delay_it(
    start_consumer: Callable[..., Any],
) -> None:
    consumer = await start_consumer(fail_first)
    far = 4_000_000_000_000  # year 2096, in epoch milliseconds
    await consumer.publish(b"x", "due", headers={X_DUE_AT: far})
    # Handled at once (not sent back to wait), retried once, handled.
    await consumer.wait_handled("due", timeout=20)
    assert consumer.attempts["due"] == 2


# --- sizes ------------------------------------------------------------------------


async def test_big_body_makes_the_round_trip_intact(start_consumer: Callable[..., Any]) -> None:
    consumer = await start_consumer(fail_first)
    body = bytes(range(256)) * (8 * 1024 * 1024 // 256)  # 8 MiB
    await consumer.publish(body, "big")
    message = await consumer.wait_handled("big", timeout=60)
    assert hashlib.sha256(message.body).digest() == hashlib.sha256(body).digest()
    assert consumer.attempts["big"] == 2


async def test_headers_too_big_for_a_retry_park_the_message_and_keep_the_connection(
    start_consumer: Callable[..., Any], connection: AbstractRobustConnection
) -> None:
    reconnects = 0

    def count(*_: object) -> None:
        nonlocal reconnects
        reconnects += 1

    connection.reconnect_callbacks.add(count)

    async def fail_long(message: AbstractIncomingMessage, attempt: int) -> None:
        if message.message_id == "ok":
            return
        raise RuntimeError("x" * 1900)

    consumer = await start_consumer(fail_long)
    # Just under the 128 KiB frame limit: the retry's own headers would push it over.
    headers = {f"h{i}": "a" * 26_100 for i in range(5)}
    await consumer.publish(b"hdr", "hdr", headers=headers)
    parked = await consumer.wait_parked("hdr")
    assert parked.headers[X_PARKED_REASON] == "unencodable"
    assert "frame_max" in parked.headers["x-parked-note"]
    assert consumer.attempts["hdr"] == 1
    # The consumer's connection was never closed by the broker, and it goes on.
    await consumer.publish(b"ok", "ok")
    await consumer.wait_handled("ok")
    assert reconnects == 0


# --- bad text and structure ---------------------------------------------------------


async def test_non_utf8_header_text_is_kept_as_bytes(
    start_consumer: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Encode like a client that does not check UTF-8 (lone surrogates become raw bytes).
    def lax_string(encoder: Any, value: str) -> bytes:
        raw = value.encode("utf-8", "surrogateescape")
        return bytes(encoder.pack(len(raw)) + raw)

    monkeypatch.setattr(pamqp.encode, "_string", lax_string)
    consumer = await start_consumer(always_fail)
    bad = b"caf\xe9 \xff\xfe".decode("utf-8", "surrogateescape")
    await consumer.publish(b"\xff\xfe not utf-8 either", "latin", headers={"name": bad})
    parked = await consumer.wait_parked("latin")
    assert bytes(parked.headers["name"]) == b"caf\xe9 \xff\xfe"
    assert parked.body == b"\xff\xfe not utf-8 either"
    assert consumer.attempts["latin"] == 2


async def test_deeply_nested_tables_are_flattened_past_the_depth_limit(
    start_consumer: Callable[..., Any],
) -> None:
    consumer = await start_consumer(fail_first)
    nested: dict[str, Any] = {"leaf": 1}
    for level in range(40):
        nested = {f"n{level}": nested, "list": [nested] if level % 10 == 0 else []}
    await consumer.publish(b"deep", "deep", headers={"deep": nested})
    message = await consumer.wait_handled("deep")
    assert consumer.attempts["deep"] == 2
    depth_seen, value = 0, message.headers["deep"]
    while isinstance(value, dict):
        key = next(k for k in value if k.startswith("n"))
        value, depth_seen = value[key], depth_seen + 1
    assert isinstance(value, str), "past the depth limit the table is spelled out as text"
    assert depth_seen <= 10


# --- absurd counts and delays ---------------------------------------------------------


async def test_retry_count_of_10_to_the_18_is_read_as_malformed(
    start_consumer: Callable[..., Any],
) -> None:
    consumer = await start_consumer(always_fail)
    await consumer.publish(b"x", "huge", headers={X_RETRY: 10**18})
    parked = await consumer.wait_parked("huge")
    # Counted from 0: one retry, then parked by the policy, not at once and not never.
    assert consumer.attempts["huge"] == 2
    assert parked.headers[X_PARKED_REASON] == "max-retries"
    assert parked.headers[X_RETRY] == 1


@pytest.mark.parametrize("delay", [-1, math.nan, math.inf, 1e18])
async def test_handler_asking_for_an_impossible_delay_is_parked(
    start_consumer: Callable[..., Any], delay: float
) -> None:
    async def retry_after(message: AbstractIncomingMessage, attempt: int) -> None:
        raise RetryAfter(delay)

    consumer = await start_consumer(retry_after, max_retries=3)
    await consumer.publish(b"x", "delay")
    parked = await consumer.wait_parked("delay")
    assert parked.headers[X_PARKED_REASON] == "delay-out-of-range"
    assert consumer.attempts["delay"] == 1


@pytest.mark.parametrize("delay", [-1, -0.001, math.nan, math.inf, -math.inf])
async def test_publish_delayed_rejects_impossible_delays_before_publishing(
    connection: AbstractRobustConnection, unique: str, delay: float
) -> None:
    channel = await connection.channel()
    with pytest.raises(DelayOutOfRangeError, match="delay"):
        await publish_delayed(
            channel,
            aio_pika.Message(b"x"),
            queue=f"{unique}.never-declared",
            delay=delay,
            topology=DelayTopology(prefix=unique, levels=4),
        )


@pytest.mark.parametrize("timeout", [-1, math.nan, "soon"])
def test_decorator_rejects_impossible_publish_timeouts(timeout: Any) -> None:
    with pytest.raises(ConfigurationError, match="publish_timeout"):
        with_delayed_retry(publish_timeout=timeout)
