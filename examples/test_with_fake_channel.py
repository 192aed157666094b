"""Unit-test a handler decorated with @with_delayed_retry, without a broker.

``delayed_retry.testing`` gives a fake channel that records every publish and
settlement and confirms each publish (or nacks, returns, times out, as told),
and ``fake_message``, a real aio-pika ``IncomingMessage`` delivered on it. The
handler runs as it would under ``consume``: these tests check that a success
is acked, that a transient failure is sent into the delay chain and then
acked, and that a bad order is parked at once. They take milliseconds, need
pytest alone and no event-loop plugin, and run from the checkout with
``.venv/bin/pytest examples/test_with_fake_channel.py``.
"""

import asyncio
import json
from datetime import timedelta

from aio_pika.abc import AbstractIncomingMessage
from tenacity import retry_if_exception_type, wait_fixed

from delayed_retry import DelayTopology, with_delayed_retry
from delayed_retry.testing import FakeChannel, Published, fake_message

TOPOLOGY = DelayTopology(prefix="orders-test", levels=20)


class GatewayDown(Exception):
    """The payment gateway did not answer: worth trying again later."""


charged: list[str] = []


@with_delayed_retry(
    queue="orders",
    max_retries=3,
    wait=wait_fixed(timedelta(seconds=30)),
    retry=retry_if_exception_type(GatewayDown),
    topology=TOPOLOGY,
)
async def handle(message: AbstractIncomingMessage) -> None:
    order = json.loads(message.body)
    if "customer" not in order:
        raise ValueError("order has no customer")  # not worth retrying: parked at once
    if order.get("gateway") == "down":
        raise GatewayDown("payment gateway timed out")
    charged.append(order["id"])


def deliver(channel: FakeChannel, order: dict[str, str]) -> AbstractIncomingMessage:
    """Run the decorated handler on one order delivered on ``channel``."""
    message = fake_message(channel, body=json.dumps(order).encode(), routing_key="orders")
    asyncio.run(handle(message))
    return message


def parked(channel: FakeChannel) -> list[Published]:
    return [p for p in channel.published if p.exchange == TOPOLOGY.parking_exchange]


def retried(channel: FakeChannel) -> list[Published]:
    return [p for p in channel.published if p.exchange != TOPOLOGY.parking_exchange]


def test_a_good_order_is_charged_and_acked() -> None:
    channel = FakeChannel()
    message = deliver(channel, {"id": "o-1", "customer": "c-7"})
    assert charged[-1] == "o-1"
    assert channel.settlement_of(message) == [("ack", False)]
    assert channel.published == []


def test_a_gateway_timeout_goes_into_the_chain_then_the_message_is_acked() -> None:
    channel = FakeChannel()
    message = deliver(channel, {"id": "o-2", "customer": "c-7", "gateway": "down"})
    (copy,) = retried(channel)
    assert copy.exchange.startswith(f"{TOPOLOGY.prefix}.")  # a level of the delay chain
    assert copy.headers["x-retry"] == 1
    assert json.loads(copy.body)["id"] == "o-2"
    # Acked only after the broker confirmed the copy: the message is never in neither place.
    assert channel.settlement_of(message) == [("ack", False)]


def test_an_order_without_a_customer_is_parked_at_once() -> None:
    channel = FakeChannel()
    message = deliver(channel, {"id": "o-3"})
    (record,) = parked(channel)
    assert record.headers["x-parked-reason"] == "not-retryable"
    assert "order has no customer" in record.headers["x-exception-message"]
    assert retried(channel) == []
    assert channel.settlement_of(message) == [("ack", False)]
