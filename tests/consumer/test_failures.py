"""FailureHandling with its hand-over timing and publisher passed in: no module patched.

Runs on the fake channel of :mod:`delayed_retry.testing`; the publisher given
to :class:`FailureHandling` is the real one behind a counter that refuses the
first tries, as a broker that nacks would.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import aiormq.abc
from pamqp import commands as spec

from delayed_retry.amqp.publish import publish_confirmed
from delayed_retry.chain.topology import DelayTopology
from delayed_retry.consumer.failures import FailureHandling
from delayed_retry.consumer.handover import HandOverTiming
from delayed_retry.errors import PublishError, PublishNotConfirmedError
from delayed_retry.headers import X_PARKED_REASON, X_RETRY, parse_retry_state
from delayed_retry.observability.instrumentation import NoInstrumentation
from delayed_retry.recovery.policy import Decision
from delayed_retry.testing import FakeChannel, fake_message

QUEUE = "work"
TOPOLOGY = DelayTopology(prefix="fake", levels=20, unit=timedelta(milliseconds=1))
QUICK = HandOverTiming(
    window=0.05, first_pause=0.0, max_pause=0.0, requeue_first_pause=0.0, requeue_max_pause=0.0
)


class Refusing:
    """The real publisher, refusing its first ``refusals`` calls with ``error``."""

    def __init__(self, refusals: int, error: PublishError | None = None) -> None:
        self.refusals = refusals
        self.error = error or PublishNotConfirmedError("the broker nacked it")
        self.calls = 0

    async def __call__(
        self,
        channel: aiormq.abc.AbstractChannel,
        *,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: spec.Basic.Properties,
        timeout: float = 30.0,
    ) -> None:
        self.calls += 1
        if self.calls <= self.refusals:
            raise self.error
        await publish_confirmed(
            channel,
            exchange=exchange,
            routing_key=routing_key,
            body=body,
            properties=properties,
            timeout=timeout,
        )


def failures(publish: Refusing, **options: Any) -> FailureHandling:
    return FailureHandling(
        queue=QUEUE,
        topology=TOPOLOGY,
        parking_queue=None,
        publish_timeout=1.0,
        return_to="queue",
        timing=QUICK,
        publish=publish,
        **options,
    )


async def fail(handling: FailureHandling, decision: Decision) -> tuple[FakeChannel, Any]:
    channel = FakeChannel()
    message = fake_message(channel, routing_key=QUEUE)
    state = parse_retry_state(message.headers, exchange="", routing_key=QUEUE, queue=QUEUE)
    with NoInstrumentation().attempt(message, state, queue=QUEUE) as scope:
        await handling.failed(message, state, RuntimeError("down"), decision, scope)
    return channel, message


async def test_a_refused_retry_is_published_again_by_the_same_publisher_then_acked() -> None:
    publisher = Refusing(2)
    channel, message = await fail(failures(publisher), Decision.retry_after(0.5))
    assert publisher.calls == 3
    assert [p.exchange for p in channel.published] == [TOPOLOGY.level_name(8)]
    assert channel.published[0].headers[X_RETRY] == 1
    assert channel.settlement_of(message) == [("ack", False)]


async def test_a_retry_never_confirmed_is_given_back_within_the_injected_window() -> None:
    publisher = Refusing(10**6)
    channel, message = await fail(failures(publisher), Decision.retry_after(0.5))
    assert publisher.calls >= 1
    assert channel.published == []
    assert channel.settlement_of(message) == [("nack", True)]


async def test_a_retry_due_at_once_goes_to_the_queue_through_the_publisher() -> None:
    publisher = Refusing(0)
    channel, message = await fail(failures(publisher), Decision.retry_after(0))
    assert publisher.calls == 1
    assert [(p.exchange, p.routing_key) for p in channel.published] == [("", QUEUE)]
    assert channel.settlement_of(message) == [("ack", False)]


async def test_a_retry_that_cannot_be_encoded_is_parked_by_the_same_publisher() -> None:
    unencodable = PublishError("cannot encode")
    unencodable.__cause__ = TypeError("bytes in a header")
    publisher = Refusing(1, unencodable)
    channel, message = await fail(failures(publisher), Decision.retry_after(0.5))
    assert publisher.calls == 2
    assert [p.exchange for p in channel.published] == [TOPOLOGY.parking_exchange]
    assert channel.published[0].headers[X_PARKED_REASON] == "unencodable"
    assert channel.settlement_of(message) == [("ack", False)]


async def test_a_park_refused_past_the_window_is_given_back_after_one_try() -> None:
    # A window of zero: the first refusal gives the message back. The module's own
    # timing (a 30 s window, a first pause of 0.5 s) would have tried again.
    publisher = Refusing(10**6)
    handling = FailureHandling(
        queue=QUEUE,
        topology=TOPOLOGY,
        parking_queue=None,
        publish_timeout=1.0,
        return_to="queue",
        timing=HandOverTiming(window=0.0),
        publish=publisher,
    )
    channel, message = await fail(handling, Decision.park("max-retries"))
    assert publisher.calls == 1
    assert channel.published == []
    assert channel.settlement_of(message) == [("nack", True)]
