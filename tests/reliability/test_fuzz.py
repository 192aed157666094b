"""Fuzzing what a consumer can receive: raw header tables, routing keys, and real deliveries.

The pure header functions are fuzzed with Python values in ``tests/headers/test_headers.py``;
here the input is what comes off the wire: random bytes decoded as an AMQP
field table, random routing keys, and hypothesis-made headers published to a
real queue whose consumer must end every message acked-and-forwarded or parked,
with no exception escaping into aio-pika's consumer loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Coroutine, Iterator
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, TypeVar

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import decode
from pamqp.commands import Basic
from pamqp.frame import marshal
from pamqp.header import ContentHeader

from delayed_retry import DelayTopology, current_retry_state, with_delayed_retry
from delayed_retry.amqp.publish import copy_properties
from delayed_retry.chain.routing_keys import decode_routing_key, routing_key
from delayed_retry.headers import (
    X_DUE_AT,
    X_FIRST_FAILURE_AT,
    X_LAST_FAILURE_AT,
    X_ORIGINAL_EXCHANGE,
    X_QUEUE,
    X_RETRY,
    failure_headers,
    parking_headers,
    parse_retry_state,
)

from ._support import QUORUM

T = TypeVar("T")

# --- pure: bytes off the wire ---------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_any_decodable_table_is_parsed_and_republishable(raw: bytes) -> None:
    try:
        _, table = decode.field_table(len(raw).to_bytes(4, "big") + raw)
    except (ValueError, UnicodeDecodeError):
        return  # the client library rejects the frame before delayed-retry sees it
    state = parse_retry_state(table, exchange="", routing_key="q", queue="q")
    error = RuntimeError("fuzz")
    now = datetime.now(UTC)
    for headers in (
        failure_headers(table, state, error, now=now, retries=state.retries + 1),
        parking_headers(table, state, error, now=now, reason="max-retries"),
    ):
        marshal(ContentHeader(0, 1, copy_properties(Basic.Properties(), headers)), 1)


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=120), st.integers(min_value=1, max_value=48))
def test_routing_key_decoding_raises_only_value_error(key: str, levels: int) -> None:
    with contextlib.suppress(ValueError):
        decoded = decode_routing_key(key, levels)
        assert routing_key(decoded.units, levels, decoded.destination) == key


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["0", "1", "2", "", "*", "#", "01"]), max_size=50),
    st.text(max_size=30),
    st.integers(min_value=1, max_value=48),
)
def test_digit_like_routing_keys_decode_or_raise_value_error(
    digits: list[str], destination: str, levels: int
) -> None:
    key = ".".join([*digits, destination])
    with contextlib.suppress(ValueError):
        decoded = decode_routing_key(key, levels)
        assert 0 <= decoded.units < 1 << levels


# --- on the broker: hypothesis-made headers through a real consumer ---------------------

epoch_ms = st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
amqp_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1),
    # RabbitMQ closes a publisher's connection (INTERNAL_ERROR) on a NaN or infinite
    # float in headers, so no producer can deliver one; sanitize_headers spells them out.
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.decimals(min_value=-(10**6), max_value=10**6, places=2, allow_nan=False),
    st.text(max_size=30),
    st.binary(max_size=30).map(bytearray),
    st.datetimes(  # hypothesis bounds are naive by its API; the values get timezones=UTC
        min_value=datetime(1970, 1, 2),  # noqa: DTZ001
        max_value=datetime(2200, 1, 1),  # noqa: DTZ001
        timezones=st.just(UTC),
    ),
)
amqp_values = st.recursive(
    amqp_scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(min_size=1, max_size=12), children, max_size=3),
    ),
    max_leaves=12,
)
retry_header_names = st.sampled_from(
    [X_RETRY, X_DUE_AT, X_FIRST_FAILURE_AT, X_LAST_FAILURE_AT, X_QUEUE, X_ORIGINAL_EXCHANGE]
)
hostile_headers = st.dictionaries(
    st.one_of(
        retry_header_names,
        st.sampled_from(["x-death", "x-delivery-count"]),
        st.text(min_size=1, max_size=12),
    ),
    st.one_of(amqp_values, epoch_ms),
    max_size=8,
)


class LoopThread:
    """An event loop in a thread, so that a synchronous hypothesis test can drive a consumer."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class FuzzConsumer:
    """A consumer whose handler fails once (``retry`` bodies) or always (``park`` bodies)."""

    def __init__(self, url: str, prefix: str) -> None:
        self.url = url
        self.topology = DelayTopology(prefix=prefix, levels=12)
        self.queue = f"{prefix}.work"
        self.handled: set[str] = set()
        self.parked: set[str] = set()
        self.escaped: list[BaseException] = []
        self.changed = asyncio.Event()

    async def start(self) -> None:
        self.connection = await aio_pika.connect_robust(self.url)
        self.channel = await self.connection.channel()
        q = await self.channel.declare_queue(self.queue, durable=True, arguments=QUORUM)

        @with_delayed_retry(
            queue=self.queue,
            max_retries=1,
            wait=tenacity.wait_fixed(0.02),
            topology=self.topology,
        )
        async def handle(message: AbstractIncomingMessage) -> None:
            state = current_retry_state()
            assert state is not None
            if message.body == b"park" or state.attempt == 1:
                raise RuntimeError("fuzzed message fails")
            self.handled.add(message.message_id or "")
            self.changed.set()

        await handle.declare(self.channel)

        async def outer(message: AbstractIncomingMessage) -> None:
            try:
                await handle(message)
            except BaseException as exc:
                self.escaped.append(exc)
                raise

        consumer_channel = await self.connection.channel()
        await (await consumer_channel.declare_queue(self.queue, passive=True)).consume(outer)
        self.parking = await self.channel.declare_queue(
            self.topology.default_parking_queue(self.queue), passive=True
        )
        assert q.name == self.queue

    async def settle(self, message_id: str, body: bytes, headers: dict[str, Any]) -> str:
        try:
            await self.channel.default_exchange.publish(
                aio_pika.Message(body, message_id=message_id, headers=headers),
                routing_key=self.queue,
            )
        except Exception as exc:
            raise AssertionError(f"PUBLISH FAILED {exc!r} for {headers!r}") from exc

        async def outcome() -> str:
            while True:
                if message_id in self.handled:
                    return "handled"
                while (m := await self.parking.get(fail=False, no_ack=True)) is not None:
                    self.parked.add(m.message_id or "")
                if message_id in self.parked:
                    return "parked"
                if self.escaped:
                    return "escaped"
                self.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), 0.05)

        return await asyncio.wait_for(outcome(), 20)

    async def stop(self) -> None:
        print(f"COUNTS fuzz-deliveries: handled={len(self.handled)} parked={len(self.parked)}")
        for name in (
            self.queue,
            self.topology.default_parking_queue(self.queue),
            *(spec.name for spec in self.topology.queues()),
        ):
            with contextlib.suppress(Exception):
                await self.channel.queue_delete(name, if_unused=False, if_empty=False)
        await self.connection.close()


@pytest.fixture(scope="module")
def fuzz_consumer(rabbitmq_url: str) -> Iterator[tuple[LoopThread, FuzzConsumer]]:
    runner = LoopThread()
    consumer = FuzzConsumer(rabbitmq_url, f"t-fuzz-{threading.get_ident() % 100000}")
    runner.run(consumer.start())
    try:
        yield runner, consumer
    finally:
        runner.run(consumer.stop())
        runner.close()


counter = iter(range(10**9))


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(headers=hostile_headers, park=st.booleans())
def test_every_fuzzed_delivery_ends_handled_or_parked(
    fuzz_consumer: tuple[LoopThread, FuzzConsumer], headers: dict[str, Any], park: bool
) -> None:
    runner, consumer = fuzz_consumer
    message_id = f"m{next(counter)}"
    try:
        marshal(ContentHeader(0, 1, Basic.Properties(headers=headers)), 1)
    except (TypeError, ValueError, OverflowError):
        return  # a producer cannot send these either
    outcome = runner.run(consumer.settle(message_id, b"park" if park else b"retry", headers))
    assert consumer.escaped == [], consumer.escaped
    assert outcome == ("parked" if park else "handled"), json.dumps(
        {k: repr(v) for k, v in headers.items()}
    )


def test_decimal_strategy_is_encodable() -> None:
    marshal(ContentHeader(0, 1, Basic.Properties(headers={"d": Decimal("1.25")})), 1)
