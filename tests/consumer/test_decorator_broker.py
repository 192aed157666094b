"""@with_delayed_retry on a real broker: backoff, signals, parking records, odd messages."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from pamqp import commands as spec
from pamqp.common import FieldTable

from delayed_retry import (
    ConfigurationError,
    ParkMessage,
    RetryAfter,
    RetryingHandler,
    RetryState,
    consume,
    current_retry_state,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry import headers as h
from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.amqp.publish import publish_confirmed
from delayed_retry.consumer.hold import EARLY_TOLERANCE
from delayed_retry.durations import to_epoch_ms
from delayed_retry.errors import PublishNotConfirmedError
from tests.support.chain import Inbox, Scenario, publish
from tests.support.waiting import WAIT, wait_until

pytestmark = pytest.mark.broker

FAST = tenacity.wait_fixed(0.2)


class Calls:
    """What a handler saw on each call: time, retry state, headers, body."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[float, RetryState, dict[str, Any], bytes]] = asyncio.Queue()

    def record(self, message: AbstractIncomingMessage) -> RetryState:
        state = current_retry_state()
        assert state is not None, "current_retry_state() is None inside a wrapped handler"
        self.queue.put_nowait((time.time(), state, dict(message.headers or {}), message.body))
        return state

    async def get(self) -> tuple[float, RetryState, dict[str, Any], bytes]:
        return await asyncio.wait_for(self.queue.get(), WAIT)


async def start(
    scenario: Scenario, handler: RetryingHandler[[AbstractIncomingMessage]], suffix: str = "q"
) -> tuple[AbstractQueue, Inbox]:
    """Declare a queue, consume it with ``handler`` and watch its parking queue."""
    queue = await scenario.queue(suffix)
    await consume(queue, handler)
    parked = Inbox()
    parking = await scenario.ch.get_queue(scenario.topology.default_parking_queue(queue.name))
    await parking.consume(parked)
    return queue, parked


async def test_retries_back_off_with_the_tenacity_wait_and_then_succeed(scenario: Scenario) -> None:
    calls = Calls()
    waits = [0.2, 0.3, 0.4]

    @with_delayed_retry(
        max_retries=5,
        wait=tenacity.wait_incrementing(start=0.2, increment=0.1),
        topology=scenario.topology,
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        if calls.record(message).attempt <= len(waits):
            raise ConnectionError("database down")

    queue, parked = await start(scenario, handler)
    await publish(scenario.ch, queue.name, b"order-1", message_id="order-1")
    seen = [await calls.get() for _ in range(len(waits) + 1)]
    assert [st.attempt for _, st, _, _ in seen] == [1, 2, 3, 4]
    assert [st.retries for _, st, _, _ in seen] == [0, 1, 2, 3]
    for (failed_at, _, _, _), (back_at, _, _, body), wait in zip(
        seen, seen[1:], waits, strict=False
    ):
        assert back_at - failed_at >= wait, "a retry came back before its backoff"
        assert back_at - failed_at < wait + 5
        assert body == b"order-1"
    first = seen[1][1].first_failure_at
    assert first is not None and abs(first.timestamp() - seen[0][0]) < 2
    assert seen[-1][1].last_error == "ConnectionError: database down"
    assert seen[-1][1].original_exchange == ""
    assert seen[-1][1].original_routing_key == queue.name
    await scenario.wait_for_depth(queue.name, 0)
    assert parked.pending() == 0


async def test_retry_after_sets_the_delay_of_that_retry(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry(max_retries=3, wait=tenacity.wait_fixed(30), topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        if calls.record(message).attempt == 1:
            raise RetryAfter(0.3, "rate limited")

    queue, _ = await start(quorum, handler)
    await publish(quorum.ch, queue.name, b"x")
    failed_at, _, _, _ = await calls.get()
    back_at, state, _, _ = await calls.get()  # well before the 30 s wait
    assert back_at - failed_at >= 0.3
    assert state.attempt == 2
    assert state.last_error is not None and "rate limited" in state.last_error


async def test_park_message_parks_at_once_with_its_reason(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry(max_retries=5, wait=FAST, topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        calls.record(message)
        raise ParkMessage("order references customer 42, which does not exist")

    queue, parked = await start(quorum, handler)
    await publish(quorum.ch, queue.name, b"x")
    record = (await parked.get()).headers
    assert record[h.X_PARKED_REASON] == "park-requested"
    assert "customer 42" in record[h.X_EXCEPTION_MESSAGE]
    assert record[h.X_RETRY] == 0
    assert calls.queue.qsize() == 1
    await quorum.wait_for_depth(queue.name, 0)


async def test_exception_outside_retry_parks_at_once(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry(
        max_retries=5,
        wait=FAST,
        retry=tenacity.retry_if_exception_type(ConnectionError),
        topology=quorum.topology,
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        calls.record(message)
        raise KeyError("sku")

    queue, parked = await start(quorum, handler)
    await publish(quorum.ch, queue.name, b"x")
    record = (await parked.get()).headers
    assert record[h.X_PARKED_REASON] == "not-retryable"
    assert record[h.X_EXCEPTION_TYPE] == "KeyError"
    assert calls.queue.qsize() == 1


async def test_an_exception_class_as_retry_parks_the_other_exceptions_at_once(
    quorum: Scenario,
) -> None:
    calls = Calls()

    @with_delayed_retry(max_retries=5, wait=FAST, retry=ValueError, topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        calls.record(message)
        raise RuntimeError("not a ValueError")

    queue, parked = await start(quorum, handler)
    await publish(quorum.ch, queue.name, b"x")
    record = (await parked.get()).headers
    assert (record[h.X_PARKED_REASON], record[h.X_EXCEPTION_TYPE]) == (
        "not-retryable",
        "RuntimeError",
    )
    assert calls.queue.qsize() == 1


async def test_parking_record_after_max_retries_is_complete(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry(max_retries=2, wait=tenacity.wait_fixed(0.1), topology=quorum.topology)
    async def failing_handler(message: AbstractIncomingMessage) -> None:
        calls.record(message)
        raise ValueError("price is negative")

    queue, parked = await start(quorum, failing_handler)
    orders = quorum.name("orders")
    quorum.track_exchange(orders)
    exchange = await quorum.ch.declare_exchange(orders, aio_pika.ExchangeType.TOPIC, durable=True)
    await queue.bind(exchange, "order.#")
    alerts = Inbox()
    await (await quorum.ch.get_queue(quorum.topology.alerts_queue)).consume(alerts)

    await exchange.publish(
        aio_pika.Message(b"order-7", message_id="order-7", headers={"tenant": "acme"}),
        "order.created.eu",
    )
    arrival = await parked.get()
    times = [(await calls.get())[0] for _ in range(3)]
    record = arrival.headers
    assert arrival.message.body == b"order-7"
    assert arrival.message.message_id == "order-7"
    assert record[h.X_PARKED_REASON] == "max-retries"
    assert record[h.X_EXCEPTION_TYPE] == "ValueError"
    assert record[h.X_EXCEPTION_MESSAGE] == "price is negative"
    trace = record[h.X_EXCEPTION_TRACEBACK]
    assert "failing_handler" in trace
    assert trace.rstrip().endswith("ValueError: price is negative")
    assert len(trace) <= h.MAX_TRACEBACK_CHARS
    assert record[h.X_RETRY] == 2
    first, last = record[h.X_FIRST_FAILURE_AT], record[h.X_LAST_FAILURE_AT]
    assert times[0] * 1000 - 1 <= first <= times[1] * 1000
    assert times[2] * 1000 - 1 <= last <= record[h.X_PARKED_AT]
    assert record[h.X_ORIGINAL_EXCHANGE] == orders
    assert record[h.X_ORIGINAL_ROUTING_KEY] == "order.created.eu"
    assert record[h.X_QUEUE] == queue.name
    assert record["tenant"] == "acme"
    assert "x-death" not in record
    # The alert queue got a copy.
    alert = await alerts.get()
    assert alert.message.message_id == "order-7"
    assert alert.headers[h.X_PARKED_REASON] == "max-retries"
    await quorum.wait_for_depth(queue.name, 0)


async def test_a_wait_longer_than_the_chain_parks(quorum: Scenario) -> None:
    @with_delayed_retry(max_retries=3, wait=tenacity.wait_fixed(3600), topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        raise ConnectionError("down")

    queue, parked = await start(quorum, handler)
    await publish(quorum.ch, queue.name, b"x")
    assert (await parked.get()).headers[h.X_PARKED_REASON] == "delay-out-of-range"


async def test_ten_retries_through_the_same_levels_all_arrive(quorum: Scenario) -> None:
    calls = Calls()
    retries = 10

    # hold=None: through the levels every time (held, a 0.1 s retry makes no hop).
    @with_delayed_retry(
        max_retries=retries, wait=tenacity.wait_fixed(0.1), topology=quorum.topology, hold=None
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        if calls.record(message).attempt <= retries:
            raise ConnectionError("still down")

    queue, parked = await start(quorum, handler)
    await publish(quorum.ch, queue.name, b"loop")
    seen = [await calls.get() for _ in range(retries + 1)]
    assert [st.attempt for _, st, _, _ in seen] == list(range(1, retries + 2))
    for _, state, headers, _ in seen[1:]:
        # Each copy went in without the broker's history: one death per level, never counted up.
        deaths = headers["x-death"]
        assert all(d["count"] == 1 and d["reason"] == "expired" for d in deaths), deaths
        assert headers[h.X_RETRY] == state.retries
    await quorum.wait_for_depth(queue.name, 0)
    assert parked.pending() == 0


async def test_odd_incoming_messages_are_retried_or_parked_never_stuck(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry(max_retries=1, wait=tenacity.wait_fixed(0.1), topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        state = calls.record(message)
        if message.body == b"huge":
            raise ValueError("x" * 1_000_000)
        if state.attempt == 1:
            raise ConnectionError("first try fails")

    queue, parked = await start(quorum, handler)
    level = quorum.topology.level_name(6)
    odd: dict[bytes, dict[str, Any] | None] = {
        b"none": None,
        b"deaths": {
            # A history naming this topology's own level queues: re-published as is, the
            # broker would see a dead-letter cycle and drop or stall the retry.
            "x-death": [
                *(
                    {
                        "count": 5,
                        "reason": "expired",
                        "queue": quorum.topology.level_name(n),
                        "exchange": quorum.topology.level_name(n),
                        "routing-keys": ["x"],
                        "time": datetime.now(UTC),
                    }
                    for n in range(quorum.topology.levels)
                ),
                {"count": 1, "reason": "rejected", "queue": "elsewhere", "exchange": ""},
            ],
            "x-first-death-queue": level,
            "x-first-death-reason": "expired",
        },
        b"malformed": {h.X_RETRY: "three", h.X_FIRST_FAILURE_AT: "yesterday", h.X_DUE_AT: -1},
        b"types": {
            "f": 0.1,
            "d": Decimal("1.25"),
            "raw": bytearray(b"\x00\xff"),
            "big": 1 << 62,
            "nested": {"a": [1, "b", {"c": None}]},
            "when": datetime(2020, 1, 1, tzinfo=UTC),
            h.X_QUEUE: 12,
            h.X_ORIGINAL_EXCHANGE: bytearray(b"bytes"),
        },
        b"huge": {"note": "y" * 60_000},
    }
    for body, headers in odd.items():
        await publish(quorum.ch, queue.name, body, headers=headers)

    bodies: dict[bytes, list[RetryState]] = {}
    for _ in range(2 * len(odd) - 1):  # each fails once and comes back, except "huge" which…
        _, state, _, body = await calls.get()
        bodies.setdefault(body, []).append(state)
    # …fails twice: first attempt and the retry, then parks.
    _, state, _, body = await calls.get()
    bodies.setdefault(body, []).append(state)
    assert {b: [st.attempt for st in sts] for b, sts in bodies.items()} == {b: [1, 2] for b in odd}
    assert bodies[b"malformed"][0].problems
    assert bodies[b"deaths"][0].broker_deaths == 0  # a rejection elsewhere is not ours
    record = (await parked.get()).headers
    assert record[h.X_EXCEPTION_TYPE] == "ValueError"
    assert len(record[h.X_EXCEPTION_MESSAGE]) <= h.MAX_ERROR_CHARS
    assert len(record[h.X_EXCEPTION_TRACEBACK]) <= h.MAX_TRACEBACK_CHARS
    assert record[h.X_RETRY] == 1
    await quorum.wait_for_depth(queue.name, 0)


async def test_retries_return_only_to_the_failing_queue(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry(max_retries=2, wait=FAST, topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        if calls.record(message).attempt == 1:
            raise ConnectionError("down")

    failing, _ = await start(quorum, handler, "failing")
    other = await quorum.queue("other")
    bystander = Inbox()
    await other.consume(bystander)
    fanout = quorum.name("events")
    quorum.track_exchange(fanout)
    exchange = await quorum.ch.declare_exchange(fanout, aio_pika.ExchangeType.FANOUT, durable=True)
    await failing.bind(exchange)
    await other.bind(exchange)
    # The headers claim the message belongs to `other`: nothing from a message decides where
    # the consumer's credentials send it.
    claims: FieldTable = {h.X_QUEUE: other.name, h.X_ORIGINAL_EXCHANGE: fanout, h.X_RETRY: 0}
    await exchange.publish(aio_pika.Message(b"event", headers=claims), "")

    assert (await bystander.get()).message.body == b"event"
    await calls.get()
    _, state, headers, _ = await calls.get()
    assert state.attempt == 2
    assert headers[h.X_QUEUE] == failing.name
    # Anything routed with the retry would be in `other` by now: a marker published after
    # the retry arrived queues behind it.
    await publish(quorum.ch, other.name, b"marker")
    assert (await bystander.get()).message.body == b"marker"


async def test_decorator_with_and_without_parentheses(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry
    async def bare(message: AbstractIncomingMessage) -> None:
        calls.record(message)

    assert isinstance(bare, RetryingHandler)
    assert bare.options.queue is None
    assert getattr(bare, "__name__", None) == "bare"  # functools.update_wrapper

    @with_delayed_retry()
    async def empty(message: AbstractIncomingMessage) -> None:
        calls.record(message)

    assert isinstance(empty, RetryingHandler)
    queue = await quorum.queue()

    @with_delayed_retry(queue=queue.name, topology=quorum.topology, max_retries=1, wait=FAST)
    async def named(message: AbstractIncomingMessage) -> None:
        if calls.record(message).attempt == 1:
            raise ConnectionError("down")

    assert named.options.queue == queue.name
    await named.declare(quorum.ch)
    await queue.consume(named)
    await publish(quorum.ch, queue.name, b"x")
    assert [(await calls.get())[1].attempt for _ in range(2)] == [1, 2]


def test_unknown_options_are_rejected_when_decorating() -> None:
    with pytest.raises(TypeError, match="max_retry"):
        with_delayed_retry(queue="q", max_retry=3)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": "5"}, "max_retries"),
        ({"wait": 5}, "wait"),
        ({"retry": "always"}, "retry"),
        ({"stop": 10}, "stop"),
        ({"queue": "a.*.b"}, "a.*.b"),
        ({"queue": "amq.gen-1"}, "amq.gen-1"),
        ({"topology": "delayed-retry"}, "topology"),
        ({"queue": "orders", "topology": "delayed-retry"}, "topology"),
        ({"instrumentation": "otel"}, "instrumentation"),
        ({"parking_queue": "amq.x"}, "parking_queue"),
        ({"publish_timeout": -1}, "publish_timeout"),
        ({"publish_timeout": "soon"}, "publish_timeout"),
    ],
)
def test_bad_option_values_raise_configuration_error(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match.replace(".", r"\.").replace("*", r"\*")):
        with_delayed_retry(**options)


async def test_consume_binds_the_queue_and_declares_parking(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry(topology=quorum.topology, max_retries=1, wait=FAST)
    async def handler(message: AbstractIncomingMessage) -> None:
        if calls.record(message).attempt == 1:
            raise ConnectionError("down")

    queue = await quorum.queue()
    tag = await consume(queue, handler)
    assert tag
    # Declared before any message: the parking queue exists, passive declare finds it.
    assert await quorum.depth(quorum.topology.default_parking_queue(queue.name)) == 0
    await publish(quorum.ch, queue.name, b"x")
    states = [(await calls.get())[1] for _ in range(2)]
    assert [st.attempt for st in states] == [1, 2]
    assert states[1].queue == queue.name
    other = await quorum.queue("other")
    with pytest.raises(ConfigurationError, match="configured for queue"):
        await consume(other, handler.for_queue(queue.name))


async def test_handler_without_a_queue_is_a_clear_error(quorum: Scenario) -> None:
    @with_delayed_retry(topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"does not know which queue.*consume"):
        await handler.declare(quorum.ch)
    queue = await quorum.queue()
    await publish(quorum.ch, queue.name, b"x")
    message = await _get(queue)
    with pytest.raises(ConfigurationError, match="does not know which queue"):
        await handler(message)
    await message.nack(requeue=False)


async def _get(queue: AbstractQueue) -> AbstractIncomingMessage:
    got: list[AbstractIncomingMessage] = []

    async def arrived() -> bool:
        message = await queue.get(fail=False)
        if message is not None:
            got.append(message)
        return bool(got)

    await wait_until(arrived, what=f"a message in {queue.name}")
    return got[0]


async def test_a_message_arriving_before_its_due_time_waits_again(quorum: Scenario) -> None:
    calls = Calls()

    @with_delayed_retry(topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        calls.record(message)

    queue, _ = await start(quorum, handler)
    due_ms = to_epoch_ms(datetime.now(UTC)) + 600
    # Straight onto the end of the chain, as if a level had let it go too soon.
    delivery = await quorum.ch.get_exchange(quorum.topology.delivery_exchange)
    await delivery.publish(
        aio_pika.Message(b"early", headers={h.X_DUE_AT: due_ms}),
        quorum.topology.route(0, queue.name).routing_key,
    )
    handled_at, state, _, body = await calls.get()
    assert body == b"early"
    assert handled_at * 1000 >= due_ms - EARLY_TOLERANCE.total_seconds() * 1000
    assert state.attempt == 1  # waiting again is not a retry
    assert current_retry_state() is None  # only set inside a wrapped handler


async def test_headers_that_would_overflow_a_frame_park_with_the_record_alone(
    quorum: Scenario,
) -> None:
    calls = Calls()

    @with_delayed_retry(max_retries=1, wait=tenacity.wait_fixed(0.1), topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        calls.record(message)
        raise ValueError("z" * 5_000)

    queue, parked = await start(quorum, handler)
    # About 126 KB of headers: the original fits a 128 KB frame, the copy with the failure
    # record does not. Sent as is, the broker would close the consumer's connection.
    bulky: FieldTable = {f"h{i}": "y" * 21_000 for i in range(6)}
    await publish(quorum.ch, queue.name, b"bulky", headers=bulky, message_id="bulky")
    record = (await parked.get()).headers
    assert record[h.X_PARKED_REASON] in ("max-retries", "unencodable")
    assert record[h.X_EXCEPTION_TYPE] == "ValueError"
    assert "h0" not in record
    assert not quorum.ch.is_closed
    await quorum.wait_for_depth(queue.name, 0)


async def test_a_channel_without_publisher_confirms_is_refused_at_start_up(
    quorum: Scenario,
) -> None:
    @with_delayed_retry(topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        raise ConnectionError("down")

    unconfirmed = await quorum.connection.channel(publisher_confirms=False)
    queue = await quorum.queue(channel=unconfirmed)
    with pytest.raises(ConfigurationError, match="publisher_confirms=True"):
        await consume(queue, handler)


async def test_a_method_can_be_the_handler(quorum: Scenario) -> None:
    calls = Calls()

    class Orders:
        @with_delayed_retry(topology=quorum.topology, max_retries=1, wait=FAST)
        async def handle(self, message: AbstractIncomingMessage) -> None:
            assert isinstance(self, Orders)
            if calls.record(message).attempt == 1:
                raise ConnectionError("down")

    queue, _ = await start(quorum, Orders().handle)
    await publish(quorum.ch, queue.name, b"x")
    assert [(await calls.get())[1].attempt for _ in range(2)] == [1, 2]


async def test_a_scheduled_message_that_fails_records_no_chain_internals(quorum: Scenario) -> None:
    @with_delayed_retry(max_retries=0, topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        raise ValueError("bad")

    queue, parked = await start(quorum, handler)
    await publish_delayed(
        quorum.ch,
        aio_pika.Message(b"later"),
        queue=queue.name,
        delay=0.05,
        topology=quorum.topology,
    )
    record = (await parked.get()).headers
    # It came off a level exchange with a chain routing key; neither is where it came from.
    assert not record[h.X_ORIGINAL_EXCHANGE].startswith(quorum.topology.prefix)
    assert record[h.X_ORIGINAL_ROUTING_KEY] == queue.name


def test_a_sync_handler_is_refused_when_decorating() -> None:
    def handler(message: object) -> None:
        return None

    with pytest.raises(ConfigurationError, match=r"needs an async function \(async def\)"):
        with_delayed_retry(handler)  # type: ignore[arg-type]


async def test_a_zero_delay_retry_goes_straight_back_and_a_delayed_one_through_the_chain(
    quorum: Scenario,
) -> None:
    calls = Calls()
    exchanges: list[str | None] = []
    delays = [0, 0, 0.001]  # two retries due at once, then one that waits a unit

    @with_delayed_retry(max_retries=5, topology=quorum.topology)
    async def handler(message: AbstractIncomingMessage) -> None:
        state = calls.record(message)
        exchanges.append(message.exchange)
        if state.attempt <= len(delays):
            raise RetryAfter(delays[state.attempt - 1])

    queue, parked = await start(quorum, handler)
    # Published through an exchange of its own, so the record keeps where it came from.
    entry = await quorum.ch.declare_exchange(f"{quorum.unique}.entry", auto_delete=True)
    await queue.bind(entry, "k")
    await entry.publish(aio_pika.Message(b"job", message_id="job-1"), "k")
    seen = [await calls.get() for _ in range(len(delays) + 1)]
    assert [st.attempt for _, st, _, _ in seen] == [1, 2, 3, 4]
    # Zero delay: the default exchange, like a hand-rolled re-publish; one unit: the chain.
    assert exchanges[:3] == [entry.name, "", ""]
    assert quorum.topology.is_chain_exchange(exchanges[3])
    for handled_at, state, _, _ in seen[1:]:
        assert state.original_exchange == entry.name and state.original_routing_key == "k"
        assert state.due_at is not None and handled_at >= state.due_at.timestamp() - 0.001
    assert all("x-death" not in headers for _, _, headers, _ in seen[1:3])
    assert seen[-1][2][h.X_RETRY] == 3
    assert parked.pending() == 0
    assert await quorum.depth(quorum.topology.unroutable_queue) == 0


async def test_a_zero_delay_retry_to_a_missing_queue_is_returned_not_confirmed(
    quorum: Scenario,
) -> None:
    # What the zero-delay route relies on when its queue is deleted in between:
    # the mandatory publish comes back, so the original is never acked for it.
    channel = await underlay_channel(quorum.ch)
    with pytest.raises(PublishNotConfirmedError, match="unroutable"):
        await publish_confirmed(
            channel,
            exchange="",
            routing_key=f"{quorum.unique}.no-such-queue",
            body=b"x",
            properties=spec.Basic.Properties(delivery_mode=2),
        )
