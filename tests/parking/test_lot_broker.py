"""The parking-lot operations against a real broker: browse, replay, purge, canary, dry run."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import (
    DelayOutOfRangeError,
    DelayTopology,
    ParkMessage,
    with_delayed_retry,
)
from delayed_retry.amqp.declarer import declare_topology
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import ConfigurationError, NotFoundError
from delayed_retry.headers import (
    X_FIRST_FAILURE_AT,
    X_PARKED_AT,
    X_PARKED_REASON,
    X_REPLAYED,
    X_REPLAYED_BY,
    X_RETRY,
)
from delayed_retry.parking.lot import (
    CanaryNews,
    MoveProgress,
    ParkedFilter,
    browse_parked,
    group_parked,
    iter_parked,
    purge_matching,
    replay_matching,
)
from delayed_retry.parking.moving import canary as parking_canary
from delayed_retry.parking.moving.report import CANARY_CONFIRMED, CANARY_PARKED_AGAIN
from delayed_retry.parking.shortcuts import replay_parked
from tests.support.queues import exists, wait_for_depth

pytestmark = pytest.mark.broker


async def _park(
    channel: AbstractChannel, queue: str, *, ident: str, exception: str, body: bytes = b"{}"
) -> None:
    headers: dict[str, aio_pika.abc.FieldValue] = {
        X_PARKED_REASON: "max-retries",
        X_PARKED_AT: to_epoch_ms(utcnow() - timedelta(minutes=5)),
        X_RETRY: 4,
        # Retried for a second before parking: a canary of these is watched 2 x 1 s + 5 s.
        X_FIRST_FAILURE_AT: to_epoch_ms(utcnow() - timedelta(minutes=5, seconds=1)),
        "x-retry-queue": queue,
        "x-exception-type": exception,
        "x-exception-message": f"{ident} failed",
    }
    await channel.default_exchange.publish(
        aio_pika.Message(body, message_id=ident, headers=headers), routing_key=f"{queue}.parking"
    )


async def _lot(
    connection: AbstractRobustConnection, unique: str
) -> tuple[AbstractChannel, DelayTopology, aio_pika.abc.AbstractQueue]:
    """A work queue with its chain and parking queue holding 3 CardDeclined, 2 TimeoutError."""
    topology = DelayTopology(prefix=unique, levels=4)
    channel = await connection.channel()
    work = await channel.declare_queue(unique, durable=True)
    await declare_topology(channel, topology, queues=[unique])
    for n in range(5):
        kind = "billing.CardDeclined" if n < 3 else "TimeoutError"
        await _park(channel, unique, ident=f"m-{n}", exception=kind, body=f"order {n}".encode())
    return channel, topology, work


async def _ids(channel: AbstractChannel, queue: str, topology: DelayTopology) -> list[str]:
    return [r.id async for r in iter_parked(channel, queue=queue, topology=topology)]


async def _drain(queue: aio_pika.abc.AbstractQueue, count: int) -> list[AbstractIncomingMessage]:
    got: list[AbstractIncomingMessage] = []

    async def poll() -> None:
        while len(got) < count:
            message = await queue.get(fail=False)
            if message is None:
                await asyncio.sleep(0.02)
                continue
            await message.ack()
            got.append(message)

    await asyncio.wait_for(poll(), 15)
    return got


async def test_browse_pages_through_a_filter_and_takes_nothing(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel, topology, _ = await _lot(connection, unique)
    where = ParkedFilter(exception_type="CardDeclined")
    first = await browse_parked(channel, queue=unique, where=where, limit=2, topology=topology)
    assert [r.id for r in first.records] == ["m-0", "m-1"]
    assert first.next_offset == 2
    second = await browse_parked(
        channel, queue=unique, where=where, offset=2, limit=2, topology=topology
    )
    assert [r.id for r in second.records] == ["m-2"] and second.next_offset is None
    assert second.records[0].body == b"order 2"
    assert sorted(await _ids(channel, unique, topology)) == [f"m-{n}" for n in range(5)]
    groups = await group_parked(channel, queue=unique, topology=topology)
    assert [(g.exception_type, g.count) for g in groups] == [
        ("billing.CardDeclined", 3),
        ("TimeoutError", 2),
    ]


async def test_replay_by_filter_moves_only_the_selection_with_a_fresh_budget(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel, topology, work = await _lot(connection, unique)
    seen: list[MoveProgress] = []
    report = await replay_matching(
        channel,
        queue=unique,
        where=ParkedFilter(exception_type="CardDeclined"),
        rate=200,
        progress=seen.append,
        replayed_by="ops@test",
        topology=topology,
    )
    assert report.done == 3 and report.stopped is None and report.to_queue == unique
    assert [p.done for p in seen if p.record is not None] == [1, 2, 3]
    copies = await _drain(work, 3)
    assert sorted(m.message_id or "" for m in copies) == ["m-0", "m-1", "m-2"]
    for copy in copies:
        assert copy.headers[X_RETRY] == 0 and X_FIRST_FAILURE_AT not in copy.headers
        assert copy.headers[X_REPLAYED] == 1 and copy.headers[X_REPLAYED_BY] == "ops@test"
        assert X_PARKED_REASON not in copy.headers
    assert sorted(await _ids(channel, unique, topology)) == ["m-3", "m-4"]


async def test_a_dry_run_moves_nothing_and_says_what_would_move(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel, topology, work = await _lot(connection, unique)
    would: list[str] = []
    report = await replay_matching(
        channel,
        queue=unique,
        where=ParkedFilter(exception_type="TimeoutError"),
        dry_run=True,
        progress=lambda p: would.extend([p.record.id] if p.record else []),
        topology=topology,
    )
    purge = await purge_matching(channel, queue=unique, dry_run=True, topology=topology)
    assert report.done == 2 and report.dry_run and would == ["m-3", "m-4"]
    assert purge.done == 5
    assert len(await _ids(channel, unique, topology)) == 5
    assert await work.get(fail=False) is None


async def test_purge_by_id_deletes_only_those(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel, topology, _ = await _lot(connection, unique)
    report = await purge_matching(
        channel, queue=unique, where=ParkedFilter(ids=frozenset({"m-1", "m-4"})), topology=topology
    )
    assert report.done == 2
    assert sorted(await _ids(channel, unique, topology)) == ["m-0", "m-2", "m-3"]


async def test_a_canary_that_parks_again_stops_the_replay(
    connection: AbstractRobustConnection, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel, topology, work = await _lot(connection, unique)

    async def no_scanning(*args: object, **kwargs: object) -> bool:
        raise AssertionError("the canary is seen on the parking exchange, not by scanning")

    monkeypatch.setattr(parking_canary, "scan_for_canary", no_scanning)
    watches: list[parking_canary.ParkWatch | None] = []
    open_watch = parking_canary.ParkWatch.open

    async def recorded(*args: Any, **kwargs: Any) -> parking_canary.ParkWatch | None:
        watch = await open_watch(*args, **kwargs)
        watches.append(watch)
        return watch

    monkeypatch.setattr(parking_canary.ParkWatch, "open", recorded)

    @with_delayed_retry(queue=unique, topology=topology)
    async def still_broken(message: AbstractIncomingMessage) -> None:
        raise ParkMessage("still broken")

    await work.consume(still_broken)
    report = await replay_matching(
        channel,
        queue=unique,
        where=ParkedFilter(exception_type="CardDeclined"),
        canary=1,
        canary_wait=30,
        canary_poll=0.1,
        topology=topology,
    )
    assert report.stopped == "canary-parked-again"
    assert report.canary_verdict == CANARY_PARKED_AGAIN and report.canary_failed
    assert report.done == 1 and report.canary_ids == ("m-0",)
    assert watches and all(w is not None for w in watches)
    for watch in watches:  # the canary's watch queue is gone with the replay
        assert watch is not None and not await exists(connection, watch._name)
    records = [r async for r in iter_parked(channel, queue=unique, topology=topology)]
    assert sorted(r.id for r in records) == [f"m-{n}" for n in range(5)]
    again = next(r for r in records if r.id == "m-0")
    assert again.reason == "park-requested" and again.replays == 1


async def test_a_canary_that_is_handled_lets_the_rest_follow(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel, topology, work = await _lot(connection, unique)
    handled: list[str] = []

    @with_delayed_retry(queue=unique, topology=topology)
    async def fixed(message: AbstractIncomingMessage) -> None:
        handled.append(message.message_id or "")

    await work.consume(fixed)
    news: list[CanaryNews] = []
    report = await replay_matching(
        channel,
        queue=unique,
        canary=2,
        canary_wait=1,
        canary_poll=0.1,
        canary_news=news.append,
        topology=topology,
    )
    assert report.stopped is None and report.done == 5
    assert report.canary_ids == ("m-0", "m-1")
    # Confirmed only once the records' 7 s have passed, although 1 s let the rest go.
    assert report.canary_verdict == CANARY_CONFIRMED and not report.canary_failed
    assert report.canary_wait is not None
    assert (report.canary_wait.seconds, report.canary_wait.derived) == (1, 7)
    assert [n.phase for n in news] == ["watching", "passed", "confirming", "confirmed"]
    assert news[2].rest == 3

    async def all_handled() -> None:
        while len(handled) < 5:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(all_handled(), 15)
    assert await _ids(channel, unique, topology) == []


async def test_replay_parked_refuses_before_taking_anything_and_keeps_the_callers_channel(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel, topology, _ = await _lot(connection, unique)
    with pytest.raises(DelayOutOfRangeError, match="longer than the maximum"):
        await replay_parked(channel, queue=unique, delay=timedelta(days=1), topology=topology)
    with pytest.raises(ConfigurationError, match=r"parking queue 'no-such-queue\.parking'"):
        await replay_parked(channel, queue="no-such-queue", to_queue=unique, topology=topology)
    with pytest.raises(ConfigurationError, match=r"queue 'no-such-target' does not exist"):
        await replay_parked(channel, queue=unique, to_queue="no-such-target", topology=topology)
    assert not channel.is_closed
    assert len(await _ids(channel, unique, topology)) == 5


async def test_a_replay_that_cannot_publish_moves_nothing(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel, topology, work = await _lot(connection, unique)
    # The chain's exchanges are gone (deleted by hand): a replay due at once would enter
    # at the delivery exchange, and a delayed one at a level exchange.
    await channel.exchange_delete(topology.delivery_exchange)
    with pytest.raises(NotFoundError, match=re.escape(topology.delivery_exchange)):
        await replay_matching(channel, queue=unique, topology=topology)
    assert sorted(await _ids(channel, unique, topology)) == [f"m-{n}" for n in range(5)]
    assert await work.get(fail=False) is None
    # The next try declares the chain again and moves them all.
    await replay_matching(channel, queue=unique, topology=topology)
    assert await _ids(channel, unique, topology) == []
    await wait_for_depth(channel, unique, 5)


async def test_a_replay_acts_on_the_set_as_asked_not_on_what_parks_meanwhile(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel, topology, work = await _lot(connection, unique)

    @with_delayed_retry(queue=unique, topology=topology)
    async def still_broken(message: AbstractIncomingMessage) -> None:
        raise ParkMessage("still broken")

    await work.consume(still_broken)
    # Slow enough that copies park again while the replay is still going through the queue.
    report = await replay_matching(channel, queue=unique, rate=20, topology=topology)
    assert report.done == 5

    async def all_parked_again() -> list[int]:
        while True:
            records = [r async for r in iter_parked(channel, queue=unique, topology=topology)]
            if len(records) == 5 and all(r.replays == 1 for r in records):
                return [r.replays for r in records]
            await asyncio.sleep(0.05)

    assert await asyncio.wait_for(all_parked_again(), 15) == [1] * 5
