"""Edit and replay one parked message against a real broker: the edited copy arrives with the
record of the edit and a fresh retry budget, the original is gone; bad edits move nothing."""

from __future__ import annotations

import asyncio
import hashlib
import json

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import DelayTopology, ParkMessage, with_delayed_retry
from delayed_retry.amqp.declarer import declare_topology
from delayed_retry.errors import ConfigurationError, NotFoundError
from delayed_retry.headers import X_PARKED_REASON, X_REPLAYED, X_RETRY
from delayed_retry.headers.names import (
    X_EDITED_BY,
    X_EDITED_HEADERS,
    X_EDITED_OLD_BODY_SHA256,
)
from delayed_retry.parking.edit import EditAction, MessageEdit, edit_and_replay
from delayed_retry.parking.lot import ParkedFilter, iter_parked
from delayed_retry.parking.moving.engine import MoveRequest, move
from tests.support.queues import cleaned, depth
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker

ORDER = b'{"order": 7, "amount": -5}'


async def _park(channel: AbstractChannel, queue: str, ident: str, body: bytes) -> None:
    headers: dict[str, aio_pika.abc.FieldValue] = {
        X_PARKED_REASON: "not-retryable",
        X_RETRY: 3,
        "x-retry-queue": queue,
        "x-exception-type": "ValueError",
        "tenant": "eu",
        "trace": "abc",
    }
    await channel.default_exchange.publish(
        aio_pika.Message(body, message_id=ident, headers=headers, content_type="application/json"),
        routing_key=f"{queue}.parking",
    )


async def _lot(
    connection: AbstractRobustConnection, topology: DelayTopology, unique: str
) -> tuple[AbstractChannel, str, aio_pika.abc.AbstractQueue]:
    channel = await connection.channel()
    queue = f"{unique}.q"
    work = await channel.declare_queue(queue, durable=True)
    await declare_topology(channel, topology, queues=[queue])
    await _park(channel, queue, "order-7-a", ORDER)
    await _park(channel, queue, "order-8", b'{"order": 8}')
    return channel, queue, work


async def _ids(channel: AbstractChannel, queue: str, topology: DelayTopology) -> list[str]:
    return sorted([r.id async for r in iter_parked(channel, queue=queue, topology=topology)])


async def _arrival(work: aio_pika.abc.AbstractQueue) -> AbstractIncomingMessage:
    async with work.iterator() as messages:
        async for message in messages:
            await message.ack()
            return message
    raise AssertionError("the work queue closed")


async def test_an_edited_message_is_replayed_with_its_edit_recorded(
    connection: AbstractRobustConnection, topology: DelayTopology, unique: str
) -> None:
    channel, queue, work = await _lot(connection, topology, unique)
    new_body = b'{"order": 7, "amount": 5}'
    result = await edit_and_replay(
        channel,
        queue=queue,
        id="order-7",
        edit=MessageEdit(
            body=new_body, set_headers={"tenant": "us"}, unset_headers=frozenset({"trace"})
        ),
        edited_by="ops@box",
        topology=topology,
    )
    assert result.replayed and result.id == "order-7-a" and result.to_queue == queue
    assert '+  "amount": 5' in result.diff
    copy = await asyncio.wait_for(_arrival(work), 15)
    assert copy.body == new_body and copy.message_id == "order-7-a"
    assert copy.content_type == "application/json"
    assert copy.headers["tenant"] == "us" and "trace" not in copy.headers
    assert copy.headers[X_EDITED_BY] == "ops@box"
    assert copy.headers[X_EDITED_HEADERS] == "set: tenant; removed: trace"
    assert copy.headers[X_EDITED_OLD_BODY_SHA256] == hashlib.sha256(ORDER).hexdigest()
    assert copy.headers[X_RETRY] == 0 and copy.headers[X_REPLAYED] == 1
    assert X_PARKED_REASON not in copy.headers
    assert await _ids(channel, queue, topology) == ["order-8"]


async def test_an_edit_on_a_quorum_parking_queue_replays_the_edited_copy(
    connection: AbstractRobustConnection, unique: str
) -> None:
    topology = DelayTopology(prefix=unique, levels=4, queue_type="quorum")
    async with cleaned(connection, topology, [f"{unique}.q"]):
        channel, queue, work = await _lot(connection, topology, unique)
        await edit_and_replay(
            channel,
            queue=queue,
            id="order-8",
            edit=MessageEdit(set_headers={"tenant": "us"}),
            edited_by="ops@box",
            topology=topology,
        )
        copy = await asyncio.wait_for(_arrival(work), 15)
        assert copy.message_id == "order-8" and copy.headers["tenant"] == "us"
        assert copy.headers[X_EDITED_HEADERS] == "set: tenant"
        assert await _ids(channel, queue, topology) == ["order-7-a"]


async def test_a_dry_run_shows_the_diff_and_moves_nothing(
    connection: AbstractRobustConnection, topology: DelayTopology, unique: str
) -> None:
    channel, queue, _work = await _lot(connection, topology, unique)
    result = await edit_and_replay(
        channel,
        queue=queue,
        id="order-8",
        edit=MessageEdit(body=json.dumps({"order": 9}).encode()),
        dry_run=True,
        topology=topology,
    )
    assert not result.replayed
    assert '-  "order": 8\n+  "order": 9\n' in result.diff
    assert await _ids(channel, queue, topology) == ["order-7-a", "order-8"]
    assert await depth(channel, queue) == 0


@pytest.mark.parametrize(
    ("id", "edit", "error", "match"),
    [
        ("nope", MessageEdit(set_headers={"a": "b"}), NotFoundError, "no parked message with id"),
        ("order-", MessageEdit(set_headers={"a": "b"}), ConfigurationError, "selects 2 parked"),
        (
            "order-8",
            MessageEdit(body=b'{"order": 8,}'),
            ConfigurationError,
            r"not JSON \(line 1 column 13",
        ),
        (
            "order-8",
            MessageEdit(set_headers={"x-retry": "0"}),
            ConfigurationError,
            "header 'x-retry' cannot be edited",
        ),
    ],
)
async def test_bad_edits_are_refused_and_move_nothing(
    connection: AbstractRobustConnection,
    topology: DelayTopology,
    unique: str,
    id: str,
    edit: MessageEdit,
    error: type[Exception],
    match: str,
) -> None:
    channel, queue, _work = await _lot(connection, topology, unique)
    with pytest.raises(error, match=match):
        await edit_and_replay(channel, queue=queue, id=id, edit=edit, topology=topology)
    assert await _ids(channel, queue, topology) == ["order-7-a", "order-8"]
    assert await depth(channel, queue) == 0


async def test_a_message_edited_and_parked_again_keeps_the_record_of_its_edit(
    connection: AbstractRobustConnection, topology: DelayTopology, unique: str
) -> None:
    channel, queue, work = await _lot(connection, topology, unique)
    seen: asyncio.Queue[bytes] = asyncio.Queue()

    @with_delayed_retry(queue=queue, topology=topology)
    async def handle(message: AbstractIncomingMessage) -> None:
        await seen.put(message.body)
        raise ParkMessage("still wrong")

    tag = await work.consume(handle)
    try:
        await edit_and_replay(
            channel,
            queue=queue,
            id="order-8",
            edit=MessageEdit(body=b'{"order": 8, "fixed": true}'),
            edited_by="ops@box",
            topology=topology,
        )
        assert await asyncio.wait_for(seen.get(), 15) == b'{"order": 8, "fixed": true}'

        async def parked_again() -> bool:
            return await _ids(channel, queue, topology) == ["order-7-a", "order-8"]

        await wait_until(parked_again, timeout=15)
    finally:
        await work.cancel(tag)
    (record,) = [
        r async for r in iter_parked(channel, queue=queue, topology=topology) if r.id == "order-8"
    ]
    assert record.body == b'{"order": 8, "fixed": true}' and record.replays == 1
    assert record.headers[X_EDITED_BY] == "ops@box"
    assert record.headers[X_EDITED_OLD_BODY_SHA256] == hashlib.sha256(b'{"order": 8}').hexdigest()
    assert record.exception_message == "still wrong"


async def test_an_edit_checked_against_another_body_leaves_the_message_parked(
    connection: AbstractRobustConnection, topology: DelayTopology, unique: str
) -> None:
    channel, queue, _work = await _lot(connection, topology, unique)
    action = EditAction(
        topology=topology,
        target=queue,
        edit=MessageEdit(set_headers={"tenant": "us"}),
        body_sha256=hashlib.sha256(b"the body the operator saw").hexdigest(),
    )
    request = MoveRequest(
        queue=queue, topology=topology, where=ParkedFilter(ids=frozenset({"order-8"})), limit=1
    )
    with pytest.raises(ConfigurationError, match="changed since the edit was checked"):
        await move(channel, action, request)
    assert await _ids(channel, queue, topology) == ["order-7-a", "order-8"]
    assert await depth(channel, queue) == 0
