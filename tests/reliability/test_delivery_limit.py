"""Quorum queue delivery limits (RabbitMQ 4.0+ default: 20) and the retry count.

The retry count lives in delayed-retry's own header; a delayed retry is a new
message with a fresh delivery count. So a queue with a tiny ``x-delivery-limit``
still gets every retry its policy allows, and ``consume()`` warns that such a
limit leaves little room for redeliveries after crashes.
"""

from __future__ import annotations

import json
import logging
from collections import Counter

import aio_pika
import pytest
import tenacity
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import DelayTopology, consume, current_retry_state, with_delayed_retry
from delayed_retry.rabbitmq.delivery_limits import (
    BROKER_DEFAULT_DELIVERY_LIMIT,
    check_delivery_limit,
    kept_queue_risk,
)
from delayed_retry.rabbitmq.versions import broker_major_version
from tests.support.queues import delete_all
from tests.support.waiting import wait_until

from ._support import Ledger

# --- the pure check ----------------------------------------------------------


def test_classic_queues_have_no_delivery_limit() -> None:
    args = {"x-queue-type": "classic", "x-delivery-limit": 1}
    assert check_delivery_limit(queue="q", arguments=args, max_retries=5) is None


def test_unknown_arguments_are_not_guessed() -> None:
    assert check_delivery_limit(queue="q", arguments=None, max_retries=5, broker_major=4) is None


def test_explicit_small_limit_is_a_risk_that_names_queue_limit_and_fix() -> None:
    risk = check_delivery_limit(
        queue="orders", arguments={"x-queue-type": "quorum", "x-delivery-limit": 2}, max_retries=5
    )
    assert risk is not None
    assert risk.limit == 2
    assert not risk.from_broker_default
    assert "'orders'" in risk.message
    assert "x-delivery-limit=2" in risk.message
    assert "drops them" in risk.message
    assert "at least 100" in risk.message
    assert "30 s" in risk.message  # names what really redelivers: unconfirmed hand-overs


def test_dead_letter_exchange_is_named_in_the_warning() -> None:
    args = {"x-queue-type": "quorum", "x-delivery-limit": "3", "x-dead-letter-exchange": "dlx"}
    risk = check_delivery_limit(queue="q", arguments=args, max_retries=5)
    assert risk is not None
    assert risk.dead_letter_exchange == "dlx"
    assert "'dlx'" in risk.message


@pytest.mark.parametrize("limit", [-1, 100, 1_000_000_000, True, "many"])
def test_off_large_or_unreadable_limits_are_not_reported(limit: object) -> None:
    args = {"x-queue-type": "quorum", "x-delivery-limit": limit}
    assert check_delivery_limit(queue="q", arguments=args, max_retries=5) is None


def test_broker_default_applies_from_4_0_only() -> None:
    args = {"x-queue-type": "quorum"}
    assert check_delivery_limit(queue="q", arguments=args, max_retries=15, broker_major=3) is None
    risk = check_delivery_limit(queue="q", arguments=args, max_retries=15, broker_major=4)
    assert risk is not None
    assert risk.from_broker_default
    assert risk.limit == BROKER_DEFAULT_DELIVERY_LIMIT
    assert "default delivery limit of 20" in risk.message
    # Retries never count toward the limit, so few of them do not make the default safe:
    # 20 returns is 10 minutes of unconfirmed hand-overs.
    assert check_delivery_limit(queue="q", arguments=args, max_retries=0, broker_major=4)


def test_small_explicit_limit_is_a_risk_whatever_max_retries() -> None:
    args = {"x-queue-type": "quorum", "x-delivery-limit": 15}
    assert check_delivery_limit(queue="q", arguments=args, max_retries=0) is not None
    assert check_delivery_limit(queue="q", arguments=args) is not None


@pytest.mark.parametrize(
    ("major", "words"), [(4, "dropped after about 20 peeks"), (3, "upgrading")]
)
def test_kept_queue_risk_names_queue_version_and_fix(major: int, words: str) -> None:
    text = kept_queue_risk(queue="work.parking", broker_major=major)
    assert "'work.parking'" in text
    assert words in text
    assert "delete 'work.parking'" in text


@pytest.mark.parametrize(
    ("props", "major"),
    [
        ({"version": "3.10.8"}, 3),
        ({"version": b"4.0.1"}, 4),
        ({"version": "x"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_broker_major_version(props: dict[str, object] | None, major: int | None) -> None:
    assert broker_major_version(props) == major


# --- on the broker -------------------------------------------------------------


async def test_tiny_delivery_limit_does_not_cut_retries_short_and_is_warned_about(
    connection: AbstractRobustConnection, unique: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="delayed_retry.rabbitmq.delivery_limits")
    channel = await connection.channel()
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=12)
    ledger = Ledger(sent={1, 2})
    attempts: Counter[int] = Counter()

    # Message 1 fails 5 times and succeeds on attempt 6; message 2 always fails.
    @with_delayed_retry(max_retries=5, wait=tenacity.wait_fixed(0.05), topology=topology)
    async def handle(message: AbstractIncomingMessage) -> None:
        i = json.loads(message.body)["id"]
        attempts[i] += 1
        state = current_retry_state()
        assert state is not None
        assert state.attempt == attempts[i], "the retry count must not come from the broker"
        if i == 2 or state.attempt <= 5:
            raise RuntimeError(f"attempt {state.attempt} fails")
        ledger.handled[i] += 1

    q = await channel.declare_queue(
        queue, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 2}
    )
    try:
        await consume(q, handle)
        warnings = [
            r.getMessage()
            for r in caplog.records
            if r.name == "delayed_retry.rabbitmq.delivery_limits"
        ]
        assert len(warnings) == 1
        assert queue in warnings[0]
        assert "x-delivery-limit=2" in warnings[0]
        for i in sorted(ledger.sent):
            # A forged broker delivery count changes nothing either.
            await channel.default_exchange.publish(
                aio_pika.Message(
                    json.dumps({"id": i}).encode(),
                    message_id=str(i),
                    headers={"x-delivery-count": 50},
                ),
                routing_key=queue,
            )
        parking = await channel.declare_queue(topology.default_parking_queue(queue), passive=True)

        async def parked() -> bool:
            message = await parking.get(fail=False, no_ack=False)
            if message is None:
                return False
            ledger.parked[json.loads(message.body)["id"]] += 1
            assert message.headers["x-parked-reason"] == "max-retries"
            await message.ack()
            return True

        await wait_until(lambda: ledger.handled[1] == 1, timeout=30, what="message 1 handled")
        await wait_until(parked, timeout=30, what="message 2 parked")
        assert attempts == {1: 6, 2: 6}
        assert ledger.report("delivery-limit-2-max-retries-5")["lost"] == 0
    finally:
        await delete_all(channel, topology=topology, queues=[queue])
