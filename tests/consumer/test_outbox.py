"""The outbox's pure half: ids, what a publish holds, and the handle outside a delivery."""

from __future__ import annotations

from typing import Any

import aio_pika
import pytest

from delayed_retry import ConfigurationError, current_outbox
from delayed_retry.consumer.outbox import Outbox, outbox_message_id


class Incoming:
    """What an :class:`Outbox` reads of the incoming message: its id and body."""

    def __init__(self, message_id: str | None, body: bytes = b"job") -> None:
        self.message_id = message_id
        self.body = body


def outbox_of(message_id: str | None, body: bytes = b"job") -> Outbox:
    incoming: Any = Incoming(message_id, body)
    return Outbox(incoming)


def test_ids_are_the_incoming_id_and_the_position() -> None:
    outbox = outbox_of("in-1")
    ids = [outbox.publish(b"a", routing_key="q"), outbox.publish(b"b", routing_key="q")]
    assert ids == ["in-1:outbox:1", "in-1:outbox:2"]
    assert [held.properties.message_id for held in outbox.held] == ids
    assert [held.body for held in outbox.held] == [b"a", b"b"]


def test_the_same_message_delivered_again_gives_the_same_ids() -> None:
    first, again = outbox_of(None, b"same body"), outbox_of(None, b"same body")
    assert first.publish(b"a", routing_key="q") == again.publish(b"a", routing_key="q")
    assert (
        outbox_of(None, b"other").publish(b"a", routing_key="q")
        != again.held[0].properties.message_id
    )
    assert outbox_message_id(None, b"same body", 1).endswith(":outbox:1")


def test_a_message_keeps_its_own_id_and_properties() -> None:
    outbox = outbox_of("in-1")
    message = aio_pika.Message(b"a", message_id="mine", content_type="application/json")
    assert outbox.publish(message, exchange="x", routing_key="k", headers={"h": 1}) == "mine"
    (held,) = outbox.held
    assert (held.exchange, held.routing_key) == ("x", "k")
    assert held.properties.content_type == "application/json"
    assert held.properties.headers == {"h": 1}
    # Positions count every publish: the next one is the second.
    assert outbox.publish(b"b", routing_key="k") == "in-1:outbox:2"


def test_bodies_are_sent_persistent() -> None:
    outbox = outbox_of("in-1")
    outbox.publish(b"a", routing_key="q")
    assert outbox.held[0].properties.delivery_mode == 2


def test_current_outbox_outside_an_outbox_run_says_how_to_get_one() -> None:
    with pytest.raises(ConfigurationError, match="outbox=True"):
        current_outbox()
