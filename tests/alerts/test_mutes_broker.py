"""Muting a failure group on a real broker: the command line, two alerts processes, a restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import DelayTopology, consume, declare_topology, with_delayed_retry
from delayed_retry.alerts import Alert, CallbackSink, ParkingAlerts
from delayed_retry.cli.main import main
from delayed_retry.observability.instrumentation import NoInstrumentation
from tests.support.queues import cleaned, depth
from tests.support.waiting import wait_until

pytestmark = pytest.mark.broker


class CardDeclined(Exception):
    """A failure the team knows of and mutes."""


class LedgerDown(Exception):
    """A failure nobody muted."""


@pytest.fixture
async def topology(
    connection: AbstractRobustConnection, unique: str
) -> AsyncIterator[DelayTopology]:
    topo = DelayTopology(prefix=unique, levels=4, queue_type="classic")
    async with cleaned(connection, topo, [f"{unique}.q"]):
        await declare_topology(await connection.channel(), topo)
        yield topo


async def _park(
    connection: AbstractRobustConnection,
    topology: DelayTopology,
    queue_name: str,
    failures: dict[str, type[Exception]],
) -> None:
    """Park one message per id in ``failures``, raising its exception; wait for the alert copies."""
    channel = await connection.channel()
    queue = await channel.declare_queue(queue_name, durable=True)
    before = await depth(connection, topology.alerts_queue)

    @with_delayed_retry(max_retries=0, topology=topology, instrumentation=NoInstrumentation())
    async def handle(message: AbstractIncomingMessage) -> None:
        raise failures[str(message.message_id)](f"failed on {message.message_id}")

    tag = await consume(queue, handle)
    for message_id in failures:
        await channel.default_exchange.publish(
            aio_pika.Message(b"{}", message_id=message_id), routing_key=queue_name
        )

    async def arrived() -> bool:
        return await depth(connection, topology.alerts_queue) == before + len(failures)

    await wait_until(arrived, what=f"{len(failures)} copies in {topology.alerts_queue}")
    await queue.cancel(tag)
    await channel.close()


def _cli(url: str, topology: DelayTopology, *argv: str) -> list[str]:
    return ["--url", url, *argv, "--prefix", topology.prefix, "--levels", "4"]


async def _group_of(
    url: str,
    topology: DelayTopology,
    queue: str,
    message_id: str,
    capsys: pytest.CaptureFixture[str],
) -> str:
    argv = _cli(url, topology, "parking", "list", "--queue", queue, "--json")
    assert await asyncio.to_thread(main, [*argv, "--queue-type", "classic"]) == 0
    records = json.loads(capsys.readouterr().out)["records"]
    return str(next(r["fingerprint"] for r in records if r["id"] == message_id))


async def _alerts_until_one(
    connection: AbstractRobustConnection, topology: DelayTopology, got: list[Alert]
) -> dict[str, int]:
    """Run an alerts process until it delivered one alert; what it counted as muted."""
    async with ParkingAlerts(
        connection, sinks=[CallbackSink(got.append)], topology=topology, window=0.3
    ) as alerts:
        await asyncio.wait_for(alerts.wait_delivered(1), 20)

        async def acked() -> bool:
            return await depth(connection, topology.alerts_queue) == 0

        await wait_until(acked, what="every alert copy acked")
        return alerts.muted


async def test_a_muted_group_is_counted_not_alerted_by_every_process_until_lifted(
    connection: AbstractRobustConnection,
    rabbitmq_url: str,
    unique: str,
    topology: DelayTopology,
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue = f"{unique}.q"
    await _park(connection, topology, queue, {"declined-1": CardDeclined})
    group = await _group_of(rabbitmq_url, topology, queue, "declined-1", capsys)
    mute = _cli(rabbitmq_url, topology, "mute", group, "--for", "1h", "--reason", "INC-42")
    assert await asyncio.to_thread(main, mute) == 0
    assert f"muted group {group!r} for 1 h" in capsys.readouterr().out

    # A first alerts process: the muted arrival is counted, the other one alerted.
    await _park(connection, topology, queue, {"ledger-1": LedgerDown})
    got: list[Alert] = []
    muted = await _alerts_until_one(connection, topology, got)
    assert muted == {group: 1}
    assert [g.exception_type for a in got for g in a.groups] == [f"{__name__}.LedgerDown"] and got[
        0
    ].message_ids == ("ledger-1",)

    # A second process, started afresh, reads the same mute from the broker.
    await _park(connection, topology, queue, {"declined-2": CardDeclined, "ledger-2": LedgerDown})
    got.clear()
    assert await _alerts_until_one(connection, topology, got) == {group: 1}
    assert [a.message_ids for a in got] == [("ledger-2",)]

    listed = _cli(rabbitmq_url, topology, "mute", "--list", "--json")
    assert await asyncio.to_thread(main, listed) == 0
    [shown] = json.loads(capsys.readouterr().out)["mutes"]
    assert shown["fingerprint"] == group and shown["reason"] == "INC-42"

    # Lifted: the group's arrivals are alerted again; parked messages were never touched.
    lift = _cli(rabbitmq_url, topology, "mute", group, "--lift")
    assert await asyncio.to_thread(main, lift) == 0
    assert "lifted the mute" in capsys.readouterr().out
    await _park(connection, topology, queue, {"declined-3": CardDeclined})
    got.clear()
    assert await _alerts_until_one(connection, topology, got) == {}
    assert [a.message_ids for a in got] == [("declined-3",)]
    assert await depth(connection, topology.default_parking_queue(queue)) == 5

    # The chain's teardown takes the mutes with it when asked to purge the alerts' queues.
    teardown = _cli(rabbitmq_url, topology, "teardown", "--purge-alerts", "--dry-run", "--json")
    assert await asyncio.to_thread(main, [*teardown, "--queue-type", "classic"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert topology.mutes_stream in plan["queues"], plan


def test_mute_refuses_what_it_cannot_mean(capsys: pytest.CaptureFixture[str]) -> None:
    for argv, words in (
        (["mute"], "needs a GROUP"),
        (["mute", "a1b2"], "either --for DURATION or --lift"),
        (["mute", "a1b2", "--for", "1h", "--lift"], "either --for DURATION or --lift"),
        (["mute", "--list", "a1b2"], "takes no GROUP"),
        (["mute", "a1b2", "--for", "400d"], "longer than 365 days"),
    ):
        assert main(["--url", "amqp://guest:guest@127.0.0.1:1/", *argv]) == 2, argv
        assert words in capsys.readouterr().err, argv
