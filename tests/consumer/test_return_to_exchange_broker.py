"""``@with_delayed_retry(return_to="exchange")``: a retry goes back to the delivery's exchange."""

from __future__ import annotations

import asyncio
from typing import Literal

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import ConfigurationError, consume, current_retry_state, with_delayed_retry
from delayed_retry.delivery.forwarder import Forwarder
from tests.support.chain import Inbox, Scenario


def test_return_to_is_checked_when_decorating() -> None:
    with pytest.raises(ConfigurationError, match="return_to='topic'"):
        with_delayed_retry(return_to="topic")  # type: ignore[call-overload]


@pytest.mark.parametrize("return_to", ["exchange", "queue"])
async def test_retry_returns_through_the_original_exchange_and_key(
    quorum: Scenario, return_to: Literal["queue", "exchange"]
) -> None:
    s = quorum
    exchange = s.name("x")
    s.track_exchange(exchange)
    forward = s.topology.forward_queue(exchange)
    s.track_queue(forward, f"{forward}.parking")
    x = await s.ch.declare_exchange(exchange, "topic", durable=True)
    failing = await s.queue("failing")
    await failing.bind(x, routing_key="orders.*")
    other = await s.queue("other")  # another consumer of the same key
    await other.bind(x, routing_key="orders.*")
    other_inbox = Inbox()
    await other.consume(other_inbox)
    attempts: asyncio.Queue[tuple[int, str | None, str | None]] = asyncio.Queue()

    @with_delayed_retry(
        max_retries=2,
        wait=tenacity.wait_fixed(0.1),
        topology=s.topology,
        return_to=return_to,
    )
    async def handler(message: AbstractIncomingMessage) -> None:
        state = current_retry_state()
        assert state is not None
        attempts.put_nowait((state.attempt, message.exchange, message.routing_key))
        if state.attempt == 1:
            raise RuntimeError("database down")

    async with Forwarder(s.connection, exchanges=[exchange], topology=s.topology):
        await consume(failing, handler)
        await x.publish(aio_pika.Message(b"order"), routing_key="orders.new")
        first = await asyncio.wait_for(attempts.get(), 15)
        second = await asyncio.wait_for(attempts.get(), 15)
        assert first == (1, exchange, "orders.new")
        assert second[0] == 2
        if return_to == "exchange":
            # Delivered again through X with the original key: the other queue gets it too.
            assert second[1:] == (exchange, "orders.new")
            assert [a.message.body for a in await other_inbox.take(2)] == [b"order", b"order"]
        else:
            assert second[1] != exchange
            await other_inbox.get()
            await s.wait_for_depth(forward, 0)
            assert other_inbox.pending() == 0
