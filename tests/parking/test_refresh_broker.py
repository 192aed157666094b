"""``parking refresh``: long-parked messages moved to the tail of their parking queue.

The pure parts (the copy's headers, which records are selected, which
brokers need it) as functions; the move itself against a real broker: order,
records, counts, a refused copy, the command line, and the disk it frees on
a private node with a small write-ahead log.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from delayed_retry.amqp.channels import underlay_channel
from delayed_retry.amqp.publish import publish_confirmed
from delayed_retry.chain.topology import DelayTopology, amqp_arguments
from delayed_retry.cli import main
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.errors import PublishNotConfirmedError
from delayed_retry.headers import (
    X_DEATH,
    X_DELIVERY_COUNT,
    X_PARKED_AT,
    X_PARKED_REASON,
    X_PARKED_REFRESHED_AT,
)
from delayed_retry.parking.lot import (
    ParkedFilter,
    ParkedRecord,
    iter_parked,
    purge_matching,
    read_record,
)
from delayed_retry.parking.moving import actions as actions_module
from delayed_retry.parking.records import replay_headers
from delayed_retry.parking.refresh import refresh_headers, refresh_needed, refresh_parked
from delayed_retry.rabbitmq.versions import broker_version
from harness import RabbitMQNode
from tests.support.nodes import private_node

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def _record(headers: dict[str, object]) -> ParkedRecord:
    return read_record(headers, message_id="m-1", body=b"{}")


# -- pure ----------------------------------------------------------------------
def test_a_refreshed_copy_keeps_its_record_and_says_when_it_moved() -> None:
    parked = {
        X_PARKED_REASON: "max-retries",
        X_PARKED_AT: to_epoch_ms(NOW - timedelta(days=30)),
        "x-exception-type": "billing.CardDeclined",
        "x-exception-message": "card 4 declined",
        X_DEATH: [{"queue": "orders", "reason": "rejected", "count": 1}],
        X_DELIVERY_COUNT: 3,
    }
    headers = refresh_headers(parked, now=NOW)
    assert headers[X_PARKED_REFRESHED_AT] == to_epoch_ms(NOW)
    assert X_DEATH not in headers and X_DELIVERY_COUNT not in headers
    before, after = _record(parked), _record(headers)
    assert after.parked_at == before.parked_at and after.fingerprint == before.fingerprint
    assert after.refreshed_at == NOW and before.refreshed_at is None


def test_the_time_in_the_queue_counts_from_the_last_refresh() -> None:
    parked_at = NOW - timedelta(days=30)
    fresh = _record({X_PARKED_AT: to_epoch_ms(parked_at)})
    moved = _record({X_PARKED_AT: to_epoch_ms(parked_at), X_PARKED_REFRESHED_AT: to_epoch_ms(NOW)})
    assert fresh.in_queue_since == parked_at and moved.in_queue_since == NOW
    week = ParkedFilter(in_queue_longer_than=timedelta(days=7))
    assert week.matches(fresh, now=NOW) and not week.matches(moved, now=NOW)
    assert week.matches(moved, now=NOW + timedelta(days=8))
    # The parking age is still the first parking's, for every other filter.
    assert ParkedFilter(older_than=timedelta(days=7)).matches(moved, now=NOW)
    assert not week.matches(_record({}), now=NOW)


def test_a_replayed_copy_drops_the_refresh_time() -> None:
    headers = {X_PARKED_AT: to_epoch_ms(NOW), X_PARKED_REFRESHED_AT: to_epoch_ms(NOW)}
    assert X_PARKED_REFRESHED_AT not in replay_headers(headers, due_at=NOW, now=NOW)


def test_only_brokers_before_4_3_need_refreshing() -> None:
    assert refresh_needed((3, 10)) and refresh_needed((4, 0)) and refresh_needed((4, 2))
    assert not refresh_needed((4, 3)) and not refresh_needed((5, 0))
    assert refresh_needed(None)


# -- against a broker ------------------------------------------------------------
async def _park(channel: AbstractChannel, parking: str, ident: str, *, age: timedelta) -> None:
    headers: dict[str, aio_pika.abc.FieldValue] = {
        X_PARKED_REASON: "max-retries",
        X_PARKED_AT: to_epoch_ms(utcnow() - age),
        "x-exception-type": "TimeoutError",
        "x-exception-message": f"{ident} timed out",
    }
    await channel.default_exchange.publish(
        aio_pika.Message(ident.encode(), message_id=ident, headers=headers, content_type="x/y"),
        routing_key=parking,
    )


async def _lot(connection: AbstractRobustConnection, queue: str) -> AbstractChannel:
    """A parking queue declared as the library does: old-1, new-1, old-2, new-2."""
    channel = await connection.channel()
    spec = DelayTopology().parking_queue_spec(queue)
    await channel.declare_queue(spec.name, durable=True, arguments=amqp_arguments(spec.arguments))
    for ident in ("old-1", "new-1", "old-2", "new-2"):
        age = timedelta(days=30) if ident.startswith("old") else timedelta(minutes=1)
        await _park(channel, spec.name, ident, age=age)
    return channel


async def _records(channel: AbstractChannel, queue: str) -> list[ParkedRecord]:
    return [r async for r in iter_parked(channel, queue=queue)]


async def test_refresh_moves_the_old_ones_to_the_tail_and_changes_no_record(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel = await _lot(connection, unique)
    before = {r.id: r for r in await _records(channel, unique)}
    report = await refresh_parked(channel, queue=unique, older_than=timedelta(days=7))
    assert (report.action, report.done, report.scanned) == ("refresh", 2, 4)
    assert report.to_queue == f"{unique}.parking"
    after = await _records(channel, unique)
    assert [r.id for r in after] == ["new-1", "new-2", "old-1", "old-2"]
    for record in after:
        was = before[record.id]
        assert (record.body, record.parked_at, record.fingerprint, record.content_type) == (
            was.body,
            was.parked_at,
            was.fingerprint,
            was.content_type,
        )
        assert (record.refreshed_at is not None) == record.id.startswith("old")
    # Just refreshed: not in the queue a week any more.
    again = await refresh_parked(channel, queue=unique, older_than=timedelta(days=7))
    assert again.done == 0 and again.scanned == 4


async def test_refreshing_everything_takes_each_message_once(
    connection: AbstractRobustConnection, unique: str
) -> None:
    channel = await _lot(connection, unique)
    report = await refresh_parked(channel, queue=unique)
    # The copies land behind the scan; it stops at them instead of going round again.
    assert report.done == 4 and report.scanned == 4
    assert [r.id for r in await _records(channel, unique)] == ["old-1", "new-1", "old-2", "new-2"]


async def test_a_dry_run_moves_nothing(connection: AbstractRobustConnection, unique: str) -> None:
    channel = await _lot(connection, unique)
    report = await refresh_parked(channel, queue=unique, older_than=86400, dry_run=True)
    assert report.done == 2 and report.dry_run
    records = await _records(channel, unique)
    assert [r.id for r in records] == ["old-1", "new-1", "old-2", "new-2"]
    assert all(r.refreshed_at is None for r in records)


async def test_a_copy_that_is_not_confirmed_leaves_the_original_in_place(
    connection: AbstractRobustConnection, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = await _lot(connection, unique)
    real = publish_confirmed

    async def refused(own: Any, **kwargs: Any) -> None:
        if kwargs["properties"].message_id == "old-2":
            raise PublishNotConfirmedError("the broker nacked the copy of old-2")
        await real(own, **kwargs)

    monkeypatch.setattr(actions_module, "publish_confirmed", refused)
    with pytest.raises(PublishNotConfirmedError, match="old-2"):
        await refresh_parked(channel, queue=unique, older_than=timedelta(days=7))
    records = {r.id: r for r in await _records(channel, unique)}
    assert sorted(records) == ["new-1", "new-2", "old-1", "old-2"]
    assert records["old-2"].refreshed_at is None


def test_the_command_refreshes_and_reports(
    rabbitmq_url: str, unique: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async def setup() -> None:
        connection = await aio_pika.connect_robust(rabbitmq_url)
        async with connection:
            await _lot(connection, unique)

    asyncio.run(setup())
    command = ["--url", rabbitmq_url, "parking", "refresh", "--queue", unique]
    assert main([*command, "--older-than", "7d", "--dry-run"]) == 0
    assert "dry run: would have refreshed 2 of 4 parked message(s)" in capsys.readouterr().out
    assert main([*command, "--older-than", "7d"]) == 0
    out = capsys.readouterr().out
    assert f"refreshed 2 message(s) of 4 looked at to the tail of '{unique}.parking'" in out
    assert main([*command, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["action"], report["done"], report["scanned"]) == ("refresh", 4, 4)
    assert main(["--url", rabbitmq_url, "parking", "show", "old-1", "--queue", unique]) == 0
    assert re.search(r"refreshed: \d{4}-\d\d-\d\d ", capsys.readouterr().out)


# -- the disk it frees -----------------------------------------------------------
WAL_BYTES = 1_000_000
"""A small write-ahead log: entries reach the queue's segment files at each roll-over."""


@pytest.fixture(scope="module")
def small_wal_node() -> Iterator[RabbitMQNode]:
    """A private node whose quorum WAL rolls over every megabyte."""
    version = os.environ.get("DELAYED_RETRY_TEST_RABBITMQ") or None
    # 4.3 sizes the quorum queues' WAL with its own key; 3.10 and 4.0 know only raft.*.
    key = "quorum_queue.wal_max_size_bytes" if version == "4.3" else "raft.wal_max_size_bytes"
    yield from private_node(config={key: str(WAL_BYTES)})


def _quorum_dir(node: RabbitMQNode) -> Path:
    return node.base_dir / "mnesia" / node.name / "quorum" / node.name


def _du(folder: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in folder.rglob("*") if p.is_file())


async def _park_many(channel: AbstractChannel, parking: str, first: int, count: int) -> None:
    body = bytes(range(256)) * 4  # 1 KB
    for start in range(first, first + count, 100):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    aio_pika.Message(
                        body,
                        message_id=str(i),
                        headers={X_PARKED_AT: to_epoch_ms(utcnow())},
                        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    ),
                    routing_key=parking,
                )
                for i in range(start, min(start + 100, first + count))
            )
        )


async def test_refreshing_an_old_message_lets_the_log_shrink(
    small_wal_node: RabbitMQNode, unique: str
) -> None:
    node = small_wal_node
    connection = await aio_pika.connect_robust(node.url)
    async with connection:
        channel = await connection.channel()
        spec = DelayTopology().parking_queue_spec(unique)
        before = {p.name for p in _quorum_dir(node).iterdir()}
        await channel.declare_queue(
            spec.name, durable=True, arguments=amqp_arguments(spec.arguments)
        )
        (folder,) = {p for p in _quorum_dir(node).iterdir() if p.name not in before}
        await _park(channel, spec.name, "old", age=timedelta(days=30))
        # Park and take away 3,000 messages, 1 KB each, as parking and replaying do; the
        # old one is taken and given back each time, and stays at the head of the log.
        recent = ParkedFilter(newer_than=timedelta(days=1))
        for first in range(0, 3000, 1000):
            await _park_many(channel, spec.name, first, 1000)
            cleared = await purge_matching(channel, queue=unique, where=recent)
            assert cleared.done == 1000
        held = _du(folder)
        underlay = await underlay_channel(channel)
        needed = refresh_needed(broker_version(underlay.connection.server_properties))
        if needed:
            # Most of the 3,000 x 1 KB stays in segments behind the old message. (4.3
            # compacts them in its own time: benchmarks/parking_disk.py shows it at scale.)
            assert held > 2_000_000, f"{held} bytes"
        report = await refresh_parked(channel, queue=unique, older_than=timedelta(days=7))
        assert report.done == 1
        deadline = asyncio.get_running_loop().time() + 30
        # The segment being written stays; the ones behind the old message go.
        while needed and (now := _du(folder)) > held // 2:
            assert asyncio.get_running_loop().time() < deadline, f"{held} -> {now} bytes"
            await asyncio.sleep(0.5)
        assert [r.id for r in await _records(channel, unique)] == ["old"]
