"""Every path out of a decorated handler, on the fake channel: no broker, milliseconds each.

Each test drives the real ``RetryingHandler.__call__`` with a real aio-pika
``IncomingMessage`` on a :class:`~delayed_retry.testing.FakeChannel`, and
checks what was published and how the message was settled.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import weakref
from dataclasses import replace
from datetime import timedelta
from typing import Any, ClassVar

import aio_pika
import aiormq
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry.amqp import declarer
from delayed_retry.amqp.publish import publish_confirmed
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer import handover
from delayed_retry.consumer.consume import consume
from delayed_retry.consumer.decorator import with_delayed_retry
from delayed_retry.consumer.handler import RetryingHandler
from delayed_retry.consumer.hold import early_tolerance
from delayed_retry.consumer.retry_state import current_retry_state
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import ConfigurationError, TopologyMismatchError
from delayed_retry.headers import (
    X_DUE_AT,
    X_EXCEPTION_TRACEBACK,
    X_FIRST_FAILURE_AT,
    X_PARKED_REASON,
    X_QUEUE,
    X_RETRY,
    parse_retry_state,
)
from delayed_retry.observability.instrumentation import NoInstrumentation
from delayed_retry.testing import FakeChannel, FakeConnection, fake_message

QUEUE = "work"
TOPOLOGY = DelayTopology(prefix="fake", levels=20, unit=timedelta(milliseconds=1))


NO_PAUSES = handover.HandOverTiming(
    window=0.05, first_pause=0.0, max_pause=0.0, requeue_first_pause=0.0, requeue_max_pause=0.0
)
"""Backoff pauses of zero: the tests check what happens, not how long it waits."""


def decorate(fn: Any, **options: Any) -> RetryingHandler[Any]:
    options.setdefault("queue", QUEUE)
    options.setdefault("topology", TOPOLOGY)
    options.setdefault("instrumentation", NoInstrumentation())
    options.setdefault("wait", tenacity.wait_fixed(1))
    handler = with_delayed_retry(**options)(fn)
    return RetryingHandler(handler.fn, replace(handler.options, timing=NO_PAUSES))


def parks(channel: FakeChannel) -> list[dict[str, Any]]:
    return [p.headers for p in channel.published if p.exchange == TOPOLOGY.parking_exchange]


def retries(channel: FakeChannel) -> list[dict[str, Any]]:
    """Retry copies: into the chain, or (due within the hold's limit) its delivery exchange."""
    return [
        p.headers
        for p in channel.published
        if p.exchange.startswith("fake.level.") or p.exchange == TOPOLOGY.delivery_exchange
    ]


class Boom(Exception):
    pass


# --- the ordinary paths --------------------------------------------------------


async def test_a_queues_failure_handling_is_built_once_with_the_injected_timing() -> None:
    channel = FakeChannel()

    async def handler(message: AbstractIncomingMessage) -> None:
        raise Boom("down")

    handler_fn = decorate(handler)
    await handler_fn(fake_message(channel))
    first = handler_fn._failures(QUEUE)
    await handler_fn(fake_message(channel))
    assert handler_fn._failures(QUEUE) is first
    assert first.timing is NO_PAUSES
    assert handler_fn._failures("other") is not first  # another queue: its own


class Tracked(Exception):
    """A failure that tells whether it is still alive."""

    alive: ClassVar[list[weakref.ref[Tracked]]] = []

    def __init__(self) -> None:
        super().__init__("tracked")
        Tracked.alive.append(weakref.ref(self))


@pytest.mark.parametrize("max_retries", [1, 0])
async def test_a_handled_failure_leaves_no_reference_cycle(
    max_retries: int, caplog: pytest.LogCaptureFixture
) -> None:
    # Freed by its reference count once handed over: no cycle through the frame that caught
    # it, so a failed message (and its body) does not wait for the garbage collector.
    caplog.set_level(logging.ERROR, logger="delayed_retry")  # captured records keep their args
    channel = FakeChannel()

    async def handler(message: AbstractIncomingMessage) -> None:
        raise Tracked()

    handler_fn = decorate(handler, max_retries=max_retries)
    await handler_fn(fake_message(channel))  # the first delivery declares on the connection
    Tracked.alive.clear()
    gc.collect()
    gc.disable()
    try:
        message = fake_message(channel)
        await handler_fn(message)
        assert channel.settlement_of(message) == [("ack", False)]
        assert len(Tracked.alive) == 1
        assert Tracked.alive[0]() is None, gc.get_referrers(Tracked.alive[0]())
    finally:
        gc.enable()


async def test_success_acks() -> None:
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        pass

    await decorate(handler)(message)
    assert channel.settlement_of(message) == [("ack", False)]
    assert channel.published == []


async def test_failure_publishes_retry_then_acks() -> None:
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise Boom("x")

    await decorate(handler)(message)
    assert [h[X_RETRY] for h in retries(channel)] == [1]
    assert channel.settlement_of(message) == [("ack", False)]


@pytest.mark.parametrize("answer", ["nack", "return", "timeout", "closed"])
async def test_unconfirmed_handover_is_never_acked(answer: str) -> None:
    channel = FakeChannel(default_answer=answer)  # type: ignore[arg-type]
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise Boom("x")

    await decorate(handler)(message)
    settled = channel.settlement_of(message)
    assert ("ack", False) not in settled
    # A closed channel cannot settle; the broker redelivers. Otherwise: nack with requeue.
    assert settled == ([] if answer == "closed" else [("nack", True)])


async def test_max_retries_parks() -> None:
    channel = FakeChannel()
    message = fake_message(channel, headers={X_RETRY: 2, X_QUEUE: QUEUE})

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise Boom("x")

    await decorate(handler, max_retries=2)(message)
    assert [h[X_PARKED_REASON] for h in parks(channel)] == ["max-retries"]
    assert channel.settlement_of(message) == [("ack", False)]


# --- case 1: handlers that settle their own message ----------------------------


@pytest.mark.parametrize(
    "process_kwargs",
    [{}, {"requeue": True}, {"ignore_processed": True}, {"reject_on_redelivered": True}],
)
async def test_failure_inside_message_process_is_retried(process_kwargs: dict[str, Any]) -> None:
    channel = FakeChannel()
    message = fake_message(channel, redelivered=True)

    async def handler(msg: AbstractIncomingMessage) -> None:
        async with msg.process(**process_kwargs):
            raise Boom("inside process()")

    await decorate(handler)(message)
    assert [h[X_RETRY] for h in retries(channel)] == [1]
    assert channel.settlement_of(message) == [("ack", False)]


async def test_success_inside_message_process_acks_once() -> None:
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        async with msg.process():
            pass

    await decorate(handler)(message)
    assert channel.settlement_of(message) == [("ack", False)]


async def test_failure_inside_message_process_parks_past_the_limit() -> None:
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        async with msg.process():
            raise Boom("inside process()")

    await decorate(handler, max_retries=0)(message)
    assert [h[X_PARKED_REASON] for h in parks(channel)] == ["max-retries"]
    assert channel.settlement_of(message) == [("ack", False)]


@pytest.mark.parametrize(("kind", "requeue"), [("reject", False), ("nack", True), ("nack", False)])
async def test_explicit_reject_without_raising_is_sent(kind: str, requeue: bool) -> None:
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        await getattr(msg, kind)(requeue=requeue)

    await decorate(handler)(message)
    assert channel.settlement_of(message) == [(kind, requeue)]
    assert channel.published == []


async def test_reject_then_raise_is_retried_not_rejected() -> None:
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        await msg.reject()
        raise Boom("after reject")

    await decorate(handler)(message)
    assert [h[X_RETRY] for h in retries(channel)] == [1]
    assert channel.settlement_of(message) == [("ack", False)]


async def test_ack_then_raise_keeps_the_ack() -> None:
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        await msg.ack()
        raise Boom("after ack")

    await decorate(handler)(message)
    assert channel.settlement_of(message) == [("ack", False)]
    assert channel.published == []


async def test_no_ack_delivery_is_refused() -> None:
    channel = FakeChannel()
    message = fake_message(channel, no_ack=True)
    ran = []

    async def handler(msg: AbstractIncomingMessage) -> None:
        ran.append(msg)

    with pytest.raises(ConfigurationError, match="no_ack"):
        await decorate(handler)(message)
    assert ran == []


async def test_consume_with_no_ack_is_refused() -> None:
    async def handler(msg: AbstractIncomingMessage) -> None:
        pass

    class Queue:
        name = QUEUE
        channel = FakeChannel()

    with pytest.raises(ConfigurationError, match="no_ack=True"):
        await consume(Queue(), decorate(handler, queue=None), no_ack=True)  # type: ignore[arg-type]


# --- case 2: every path out settles the message ---------------------------------


def _raising_retry(_: tenacity.RetryCallState) -> bool:
    raise RuntimeError("user retry predicate broke")


def _raising_wait(_: tenacity.RetryCallState) -> float:
    raise RuntimeError("user wait broke")


def _raising_stop(_: tenacity.RetryCallState) -> bool:
    raise RuntimeError("user stop broke")


@pytest.mark.parametrize(
    "option",
    [{"retry": _raising_retry}, {"wait": _raising_wait}, {"stop": _raising_stop}],
    ids=["retry", "wait", "stop"],
)
async def test_policy_that_raises_parks_as_internal_error(option: dict[str, Any]) -> None:
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise Boom("handler failed")

    await decorate(handler, **option)(message)
    [record] = parks(channel)
    assert record[X_PARKED_REASON] == "internal-error"
    assert "broke" in record[X_EXCEPTION_TRACEBACK]
    assert "Boom: handler failed" in record[X_EXCEPTION_TRACEBACK]
    assert channel.settlement_of(message) == [("ack", False)]


async def test_exception_whose_str_raises_is_retried() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise ValueError("no str for you")

    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise Unprintable

    await decorate(handler)(message)
    [headers] = retries(channel)
    assert "Unprintable" in headers["x-retry-last-error"]
    assert channel.settlement_of(message) == [("ack", False)]


async def test_channel_without_confirms_gives_back_after_backoff() -> None:
    channel = FakeChannel(publisher_confirms=False)
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise Boom("x")

    await decorate(handler)(message)
    assert channel.published == []
    assert channel.settlement_of(message) == [("nack", True)]


@pytest.mark.parametrize(
    "error",
    [TopologyMismatchError("mismatch"), ConfigurationError("bad"), aiormq.exceptions.AMQPError()],
)
async def test_declaration_failure_gives_back_after_backoff(error: Exception) -> None:
    connection = FakeConnection(fail_declare=error)
    channel = FakeChannel(connection=connection)
    message = fake_message(channel)
    ran = []

    async def handler(msg: AbstractIncomingMessage) -> None:
        ran.append(msg)

    await decorate(handler)(message)
    assert ran == []
    assert channel.settlement_of(message) == [("nack", True)]


async def test_parking_redeclare_failure_is_settled(monkeypatch: pytest.MonkeyPatch) -> None:
    connection = FakeConnection()
    channel = FakeChannel(connection=connection)
    handler_fn = decorate(_always_park)
    await handler_fn(fake_message(channel))  # declares the topology
    connection.fail_declare = TopologyMismatchError("parking queue mismatch")
    monkeypatch.setattr(declarer, "PARKING_REDECLARE_INTERVAL", 0.0, raising=False)
    message = fake_message(channel)
    await handler_fn(message)
    assert channel.settlement_of(message) == [("nack", True)]


async def _always_park(msg: AbstractIncomingMessage) -> None:
    from delayed_retry import ParkMessage

    raise ParkMessage("no")


async def test_closed_channel_is_left_to_the_broker() -> None:
    channel = FakeChannel()
    message = fake_message(channel)
    channel.is_closed = True  # message.channel now raises ChannelInvalidStateError

    async def handler(msg: AbstractIncomingMessage) -> None:
        pass

    await decorate(handler)(message)  # no exception escapes
    assert channel.settlements == []


async def test_handler_raising_cancelled_error_is_retried() -> None:
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise asyncio.CancelledError

    await decorate(handler)(message)
    [headers] = retries(channel)
    assert "HandlerCancelledError" in headers["x-retry-last-error"]
    assert channel.settlement_of(message) == [("ack", False)]


async def test_real_cancellation_propagates_unsettled() -> None:
    channel = FakeChannel()
    message = fake_message(channel)
    started = asyncio.Event()

    async def handler(msg: AbstractIncomingMessage) -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(decorate(handler)(message))
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert channel.settlements == []


async def test_prefetch_one_consumer_keeps_going_after_every_failure() -> None:
    """One message at a time, as with prefetch_count=1: each is settled before the next."""
    connection = FakeConnection()
    channel = FakeChannel(connection=connection)

    async def handler(msg: AbstractIncomingMessage) -> None:
        kind = msg.body.decode()
        if kind == "process":
            async with msg.process():
                raise Boom("x")
        if kind == "cancel":
            raise asyncio.CancelledError
        if kind == "ok":
            return
        raise Boom(kind)

    wrapped = decorate(handler, stop=_raising_stop)
    messages = [fake_message(channel, body=k.encode()) for k in ("process", "cancel", "x", "ok")]
    for message in messages:
        await asyncio.wait_for(wrapped(message), timeout=5)
    for message in messages:
        assert len(channel.settlement_of(message)) == 1, message.body


# --- case 3: a parking storm uses a bounded number of channels -----------------


async def test_parking_storm_opens_a_bounded_number_of_channels() -> None:
    connection = FakeConnection()
    channel = FakeChannel(connection=connection)
    wrapped = decorate(_always_park)
    gate = asyncio.Event()
    channel.publish_gate = gate
    # More parks at once than RabbitMQ's default channel_max (2,047) allows channels.
    storm = 3_000
    messages = [fake_message(channel, message_id=f"m{i}") for i in range(storm)]
    tasks = [asyncio.create_task(wrapped(m)) for m in messages]
    while channel.in_flight < storm:
        await asyncio.sleep(0.01)
    gate.set()
    await asyncio.gather(*tasks)
    # Declarations one at a time (a kept queue's own channel inside the declaring one),
    # not one channel per park: the broker would close the connection at channel_max.
    assert connection.max_open_channels <= 2
    assert connection.channels_opened < 100
    assert len(parks(channel)) == storm
    assert all(channel.settlement_of(m) == [("ack", False)] for m in messages)


# --- case 5: retry state counts only for the queue that wrote it ---------------


def test_retry_state_of_another_queue_is_ignored() -> None:
    headers = {X_RETRY: 5, X_QUEUE: "service-a", X_FIRST_FAILURE_AT: to_epoch_ms(utcnow())}
    state = parse_retry_state(headers, exchange="", routing_key="billing", queue="billing")
    assert (state.retries, state.attempt, state.first_failure_at) == (0, 1, None)
    own = parse_retry_state(headers, exchange="", routing_key="a", queue="service-a")
    assert own.retries == 5


async def test_forwarded_message_is_retried_not_parked() -> None:
    channel = FakeChannel()
    message = fake_message(channel, headers={X_RETRY: 5, X_QUEUE: "service-a"})

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise Boom("billing failed")

    await decorate(handler, queue="billing", max_retries=5)(message)
    assert parks(channel) == []
    [headers] = retries(channel)
    assert (headers[X_RETRY], headers[X_QUEUE]) == (1, "billing")


# --- case 7: the smaller ones ---------------------------------------------------


async def test_callable_instance_with_options_attribute() -> None:
    class Handler:
        def __init__(self) -> None:
            self.options = "the user's own"
            self.fn = "also the user's"
            self.calls = 0

        async def __call__(self, msg: AbstractIncomingMessage) -> None:
            self.calls += 1

    instance = Handler()
    wrapped = decorate(instance)
    channel = FakeChannel()
    message = fake_message(channel)
    await wrapped(message)
    assert instance.calls == 1
    assert channel.settlement_of(message) == [("ack", False)]


async def test_redelay_failure_retries_before_giving_back() -> None:
    channel = FakeChannel()
    due = utcnow() + timedelta(seconds=10)
    message = fake_message(
        channel, headers={X_DUE_AT: to_epoch_ms(due)}, exchange=TOPOLOGY.level_name(3)
    )
    channel.answers.extend(["nack", "nack"])  # then ack

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise AssertionError("an early message must not be handled")

    await decorate(handler)(message)
    assert [p.answer for p in channel.published] == ["nack", "nack", "ack"]
    assert channel.settlement_of(message) == [("ack", False)]


def test_early_tolerance_is_at_least_one_unit() -> None:
    assert early_tolerance(TOPOLOGY) == timedelta(milliseconds=50)
    coarse = DelayTopology(prefix="coarse", levels=10, unit=timedelta(seconds=1))
    assert early_tolerance(coarse) == timedelta(seconds=1)


async def test_message_less_than_a_unit_early_is_handled_now() -> None:
    coarse = DelayTopology(prefix="coarse", levels=10, unit=timedelta(seconds=1))
    channel = FakeChannel()
    due = utcnow() + timedelta(milliseconds=400)  # clock skew: 0.4 s early
    message = fake_message(
        channel, headers={X_DUE_AT: to_epoch_ms(due)}, exchange=coarse.level_name(0)
    )
    handled = []

    async def handler(msg: AbstractIncomingMessage) -> None:
        handled.append(msg)

    await decorate(handler, topology=coarse)(message)
    assert len(handled) == 1
    assert channel.published == []


async def test_one_publish_per_message_id_in_flight() -> None:
    channel = FakeChannel()
    gate = asyncio.Event()
    channel.publish_gate = gate
    properties = aio_pika.Message(b"", message_id="same").properties

    async def publish() -> None:
        await publish_confirmed(
            channel,  # type: ignore[arg-type]
            exchange="x",
            routing_key="k",
            body=b"",
            properties=properties,
        )

    tasks = [asyncio.create_task(publish()) for _ in range(3)]
    while channel.in_flight < 1:
        await asyncio.sleep(0)
    for _ in range(10):
        await asyncio.sleep(0)
    assert channel.in_flight == 1
    gate.set()
    await asyncio.gather(*tasks)
    assert channel.max_in_flight == 1
    assert len(channel.published) == 3


# --- hooks: told of what happened, and only of that ------------------------------------


async def test_on_park_is_told_of_an_internal_error_parking() -> None:
    from delayed_retry.consumer.hooks import FailureEvent

    events: list[FailureEvent] = []
    channel = FakeChannel()
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise Boom("handler failed")

    await decorate(handler, wait=_raising_wait, on_park=events.append, on_retry=events.append)(
        message
    )
    [event] = events
    assert event.decision.reason == "internal-error"
    assert "user wait broke" in str(event.exception)
    assert channel.settlement_of(message) == [("ack", False)]


async def test_no_hook_is_told_when_the_message_goes_back_unhandled() -> None:
    from delayed_retry.consumer.hooks import FailureEvent

    events: list[FailureEvent] = []
    channel = FakeChannel(default_answer="nack")  # every hand-over refused: given back
    message = fake_message(channel)

    async def handler(msg: AbstractIncomingMessage) -> None:
        raise Boom("handler failed")

    await decorate(handler, on_park=events.append, on_retry=events.append)(message)
    assert channel.settlement_of(message) == [("nack", True)]
    assert events == []


async def test_immediate_retries_make_no_publish_until_the_last_run_fails() -> None:
    channel = FakeChannel()
    message = fake_message(channel)
    runs: list[int] = []

    async def handler(msg: AbstractIncomingMessage) -> None:
        state = current_retry_state()
        assert state is not None
        runs.append(state.immediate_retries)
        raise Boom("still failing")

    await decorate(handler, immediate_retries=3)(message)
    assert runs == [0, 1, 2, 3]
    [headers] = retries(channel)
    assert headers["x-retry-immediate-runs"] == [4]
    assert channel.settlement_of(message) == [("ack", False)]
