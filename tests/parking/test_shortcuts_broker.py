"""Parking: the record people read, peeking leaves messages in place, replay sends them back."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import ConfigurationError, DelayTopology, ParkMessage, with_delayed_retry
from delayed_retry.headers import (
    X_PARKED_REASON,
    X_REPLAYED,
    X_RETRY,
)
from delayed_retry.parking.shortcuts import (
    parse_parked,
    peek_parked,
    replay_headers,
    replay_parked,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


def test_parse_parked_reads_foreign_messages_as_unknown() -> None:
    parked = parse_parked(None, message_id=None, body=b"\xff\x00binary")
    assert parked.reason == "unknown"
    assert parked.attempts == 1
    assert parked.exception_type is None
    assert parked.body_preview.startswith("base64:")


def test_parse_parked_names_unroutable_arrivals() -> None:
    parked = parse_parked(
        {}, message_id="m", body=b"{}", exchange="delayed-retry.unroutable", routing_key="k"
    )
    assert parked.reason == "unroutable"


def test_replay_headers_reset_the_budget_and_drop_the_record() -> None:
    from datetime import UTC, datetime

    headers = {
        X_RETRY: 5,
        X_PARKED_REASON: "max-retries",
        "x-exception-type": "ValueError",
        "x-death": [{"count": 1}],
        "app": "kept",
        X_REPLAYED: 2,
        "x-retry-immediate-runs": [3, 3],
    }
    out = replay_headers(headers, due_at=datetime(2030, 1, 1, tzinfo=UTC))
    assert "x-retry-immediate-runs" not in out, "a replay starts a fresh history"
    assert out[X_RETRY] == 0
    assert out[X_REPLAYED] == 3
    assert out["app"] == "kept"
    assert X_PARKED_REASON not in out and "x-exception-type" not in out and "x-death" not in out


async def _park_one(
    connection: AbstractRobustConnection, unique: str, topology: DelayTopology, body: bytes
) -> tuple[aio_pika.abc.AbstractQueue, asyncio.Queue[AbstractIncomingMessage]]:
    channel = await connection.channel()
    queue = await channel.declare_queue(unique, durable=True)
    seen: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()

    @with_delayed_retry(queue=unique, topology=topology)
    async def handle(message: AbstractIncomingMessage) -> None:
        await seen.put(message)
        if message.headers.get(X_REPLAYED) is None:
            raise ParkMessage("customer does not exist")

    await queue.consume(handle)
    await channel.default_exchange.publish(
        aio_pika.Message(body, message_id="m-1"), routing_key=unique
    )
    await asyncio.wait_for(seen.get(), 10)
    return queue, seen


async def _wait_parked(
    channel: aio_pika.abc.AbstractChannel, queue: str, topology: DelayTopology, depth: int
) -> None:
    # Peeking, not the declare-ok message count: on quorum queues (3.10) that count leaves
    # out messages returned by a closed channel, which is exactly what peeking produces.
    async def parked() -> bool:
        return len(await peek_parked(channel, queue=queue, topology=topology)) == depth

    await wait_until(parked, what=f"{depth} parked messages for {queue!r}")


async def test_peek_leaves_parked_messages_and_replay_returns_them(
    connection: AbstractRobustConnection, unique: str
) -> None:
    topology = DelayTopology(prefix=unique, levels=12)
    _, seen = await _park_one(connection, unique, topology, b'{"order": 7}')
    channel = await connection.channel()
    await _wait_parked(channel, unique, topology, 1)

    for _ in range(2):  # peeking twice sees the same message: nothing was taken
        parked = await peek_parked(channel, queue=unique, topology=topology)
        assert [p.message_id for p in parked] == ["m-1"]
        assert parked[0].reason == "park-requested"
        assert parked[0].exception_type == "delayed_retry.errors.ParkMessage"
        assert parked[0].exception_message == "customer does not exist"
        assert parked[0].queue == unique
        assert parked[0].body_preview == '{"order": 7}'
    await _wait_parked(channel, unique, topology, 1)

    result = await replay_parked(channel, queue=unique, topology=topology)
    assert result.replayed == 1 and result.to_queue == unique
    again = await asyncio.wait_for(seen.get(), 10)
    assert again.body == b'{"order": 7}'
    assert again.headers[X_REPLAYED] == 1
    assert again.headers[X_RETRY] == 0
    assert X_PARKED_REASON not in again.headers
    await _wait_parked(channel, unique, topology, 0)


async def test_replay_to_another_queue_only_when_asked(
    connection: AbstractRobustConnection, unique: str
) -> None:
    topology = DelayTopology(prefix=unique, levels=12)
    await _park_one(connection, unique, topology, b"payload")
    channel = await connection.channel()
    await _wait_parked(channel, unique, topology, 1)
    other = await channel.declare_queue(f"{unique}.other", durable=True)
    result = await replay_parked(
        channel, queue=unique, to_queue=other.name, limit=1, topology=topology
    )
    assert result.replayed == 1
    message = await asyncio.wait_for(_get(other), 10)
    assert message.body == b"payload"
    await message.ack()


async def _get(queue: aio_pika.abc.AbstractQueue) -> AbstractIncomingMessage:
    while True:
        message = await queue.get(fail=False)
        if message is not None:
            return message
        await asyncio.sleep(0.02)


async def test_peek_missing_parking_queue_is_a_clear_error(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel = await connection.channel()
    with pytest.raises(ConfigurationError, match=r"parking queue .*\.parking' does not exist"):
        await peek_parked(channel, queue=unique, topology=DelayTopology(prefix=unique, levels=4))
    with pytest.raises(ConfigurationError, match="limit=0"):
        await peek_parked(channel, queue=unique, limit=0)
