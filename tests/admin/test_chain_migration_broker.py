"""``topology migrate`` against a real broker: an older chain of ours, and Kombu's ladder."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from datetime import timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel, AbstractRobustConnection

from delayed_retry import DelayTopology, publish_delayed
from delayed_retry.amqp.declarer import declare_topology
from delayed_retry.cli import main
from delayed_retry.headers import X_DUE_AT
from tests.support.chain import Scenario
from tests.support.waiting import WAIT

pytestmark = pytest.mark.broker

OLD_OPTIONS = ["--from-levels", "12", "--from-unit-ms", "1000"]
NEW_LEVELS = 24


@pytest.fixture
async def chains(
    connection: AbstractRobustConnection, unique: str, rabbitmq_url: str
) -> AsyncIterator[tuple[Scenario, Scenario]]:
    """An old chain (12 levels of 1 s) and a new one (24 levels of 1 ms), both classic."""
    old = Scenario(
        connection,
        unique,
        DelayTopology(
            prefix=f"{unique}-old", levels=12, unit=timedelta(seconds=1), queue_type="classic"
        ),
    )
    new = Scenario(
        connection,
        unique,
        DelayTopology(prefix=f"{unique}-new", levels=NEW_LEVELS, queue_type="classic"),
    )
    await old.open()
    await new.open()
    try:
        yield old, new
    finally:
        await old.close(rabbitmq_url)
        await new.close(rabbitmq_url)


def _new_options(new: Scenario) -> list[str]:
    return [
        "--prefix",
        new.topology.prefix,
        "--levels",
        str(NEW_LEVELS),
        "--queue-type",
        "classic",
    ]


async def _take(channel: AbstractChannel, queue: str) -> aio_pika.abc.AbstractIncomingMessage:
    q = await channel.get_queue(queue)
    message = await q.get(timeout=WAIT)
    assert message is not None
    await message.ack()
    return message


async def test_migrate_from_an_older_chain_of_ours(
    chains: tuple[Scenario, Scenario], rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    old, new = chains
    orders = (await old.queue("orders", queue_type="classic")).name
    await declare_topology(old.ch, old.topology)
    # One whose destination does not exist: it must stay where it is,
    # and, ahead in its queue, must not hold up the message behind it.
    stray = old.topology.route(3600, "no-such-queue")
    await (await old.ch.get_exchange(stray.exchange)).publish(
        aio_pika.Message(b"nowhere"), routing_key=stray.routing_key
    )
    for delay in (timedelta(hours=1), timedelta(minutes=10)):
        await publish_delayed(
            old.ch, aio_pika.Message(b"due later"), queue=orders, delay=delay, topology=old.topology
        )
    old_11, old_09 = old.topology.level_name(11), old.topology.level_name(9)
    await old.wait_for_depth(old_11, 2)
    await old.wait_for_depth(old_09, 1)

    base = ["--url", rabbitmq_url, "topology", "migrate", *_new_options(new)]
    source = ["--from", "delayed-retry", "--from-prefix", old.topology.prefix, *OLD_OPTIONS]
    assert await asyncio.to_thread(main, [*base, *source, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"{old_11}: 2 message(s), due within 1 h 9 m" in out
    assert "dry run: would move 3 message(s)" in out
    assert await old.depth(old_11) == 2  # nothing read

    started = time.time()
    assert await asyncio.to_thread(main, [*base, *source, "--json"]) == 1  # one stayed
    report = json.loads(capsys.readouterr().out)
    assert (report["moved"], report["left"]) == (2, 1)
    (level11,) = [r for r in report["levels"] if r["level"] == 11]
    assert "destination 'no-such-queue' unusable" in next(iter(level11["problems"]))
    assert await old.depth(old_11) == 1 and await old.depth(old_09) == 0

    # In the new chain, each at the level of its remaining delay, due exactly as recorded.
    new_21, new_19 = new.topology.level_name(21), new.topology.level_name(19)
    await new.wait_for_depth(new_21, 1)
    await new.wait_for_depth(new_19, 1)
    hour = await _take(new.ch, new_21)
    ten_minutes = await _take(new.ch, new_19)
    for message, seconds in ((hour, 3600), (ten_minutes, 600)):
        headers = message.headers or {}
        due_ms = headers[X_DUE_AT]
        assert isinstance(due_ms, int)
        assert started + seconds - 60 < due_ms / 1000 <= started + seconds + 1
        assert headers["x-retry-migrated-from"] in (old_11, old_09)
        assert message.body == b"due later"


async def _kombu_level(channel: AbstractChannel, prefix: str, level: int) -> str:
    """One level of Kombu's ladder, declared as kombu's native_delayed_delivery does."""
    name = f"{prefix}_celery_delayed_{level}"
    exchange = await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
    queue = await channel.declare_queue(
        name,
        durable=True,
        arguments={
            "x-queue-type": "classic",
            "x-overflow": "reject-publish",
            "x-message-ttl": (1 << level) * 1000,
            "x-dead-letter-exchange": f"{prefix}_celery_delayed_{level - 1}",
        },
    )
    await queue.bind(exchange, routing_key="*." * (27 - level) + "1.#")
    return name


def _kombu_key(countdown: int, routing_key: str) -> str:
    """Kombu's calculate_routing_key: 28 binary digits of the countdown, then the key."""
    return ".".join(f"{countdown:028b}") + f".{routing_key}"


async def test_migrate_from_kombu(
    chains: tuple[Scenario, Scenario], rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, new = chains
    prefix = new.unique
    level = await _kombu_level(new.ch, prefix, 11)
    new.track_queue(level)
    new.track_exchange(level)
    tasks = (await new.queue("tasks", queue_type="classic")).name
    exchange = await new.ch.get_exchange(level)
    eta = "2099-01-01T00:00:00+00:00"  # not believable for level 11: the bound wins
    await exchange.publish(aio_pika.Message(b"a"), routing_key=_kombu_key(3600, "celery"))
    await exchange.publish(
        aio_pika.Message(b"b", headers={"eta": eta}), routing_key=_kombu_key(3600, "celery")
    )
    await new.wait_for_depth(level, 2)

    base = ["--url", rabbitmq_url, "topology", "migrate", *_new_options(new)]
    kombu = ["--from", "kombu", "--from-prefix", prefix]
    # Kombu's keys end in a routing key, not a queue: without --to nothing moves.
    assert await asyncio.to_thread(main, [*base, *kombu]) == 1
    out = capsys.readouterr().out
    assert "2 stayed: no destination queue for routing key 'celery' (--to or --map)" in out
    assert await new.depth(level) == 2

    started = time.time()
    assert await asyncio.to_thread(main, [*base, *kombu, "--map", f"celery={tasks}"]) == 0
    assert "moved 2 message(s) from the Kombu native delayed delivery" in capsys.readouterr().out
    assert await new.depth(level) == 0
    new_21 = new.topology.level_name(21)
    await new.wait_for_depth(new_21, 2)
    for _ in range(2):
        message = await _take(new.ch, new_21)
        due_ms = (message.headers or {})[X_DUE_AT]
        assert isinstance(due_ms, int)
        # At most 2048 s left in level 11, then 1552 s of lower bits: 3600 s.
        assert started + 3600 <= due_ms / 1000 <= time.time() + 3600 + 1


async def test_migrate_refuses_a_missing_source_and_the_same_chain(
    chains: tuple[Scenario, Scenario], rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, new = chains
    base = ["--url", rabbitmq_url, "topology", "migrate", *_new_options(new)]
    assert (
        await asyncio.to_thread(main, [*base, "--from", "kombu", "--from-prefix", "absent-xyz"])
        == 2
    )
    assert "no queue of the Kombu native delayed delivery with prefix 'absent-xyz'" in (
        capsys.readouterr().err
    )
    assert await asyncio.to_thread(main, [*base, "--from", "delayed-retry"]) == 2
    assert "--from delayed-retry needs --from-prefix" in capsys.readouterr().err
    await declare_topology(new.ch, new.topology)
    same = ["--from", "delayed-retry", "--from-prefix", new.topology.prefix]
    same += ["--from-levels", str(NEW_LEVELS), "--from-unit-ms", "1"]
    assert await asyncio.to_thread(main, [*base, *same]) == 2
    assert "the source and target chains are the same" in capsys.readouterr().err
