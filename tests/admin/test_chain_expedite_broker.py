"""Retry now: a waiting retry delivered at once, its retry state intact, the others untouched."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage
from tenacity import wait_fixed

from delayed_retry import consume, current_retry_state, publish_delayed, with_delayed_retry
from delayed_retry.admin.chain_discard import expedite_waiting
from delayed_retry.cli import main
from delayed_retry.durations import utcnow
from delayed_retry.errors import PublishError
from delayed_retry.headers.retry_state import RetryState
from delayed_retry.observability.instrumentation import NoInstrumentation
from tests.support.chain import Inbox, Scenario

pytestmark = pytest.mark.broker


class DatabaseDown(Exception):
    """What the first attempt raises; the retry waits a minute for it."""


def _chain(scenario: Scenario) -> list[str]:
    t = scenario.topology
    return ["--prefix", t.prefix, "--levels", str(t.levels), "--queue-type", t.queue_type]


async def test_an_expedited_retry_arrives_once_now_with_its_retry_state(
    scenario: Scenario, rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = await scenario.queue()
    other = await scenario.queue("other")
    handled: asyncio.Queue[tuple[str, RetryState | None]] = asyncio.Queue()

    @with_delayed_retry(
        max_retries=3,
        wait=wait_fixed(60),
        topology=scenario.topology,
        instrumentation=NoInstrumentation(),
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        state = current_retry_state()
        await handled.put((str(message.message_id), state))
        if state is not None and state.attempt == 1:
            raise DatabaseDown("the database is restarting")

    await consume(queue, handle)
    await scenario.ch.default_exchange.publish(
        aio_pika.Message(b"{}", message_id="order-1"), routing_key=queue.name
    )
    assert (await asyncio.wait_for(handled.get(), 15))[0] == "order-1"
    # Beside the retry, a scheduled message for the same queue and one for another.
    for ident, to in (("later", queue.name), ("elsewhere", other.name)):
        await publish_delayed(
            scenario.ch,
            aio_pika.Message(b"{}", message_id=ident),
            queue=to,
            delay=utcnow() + timedelta(seconds=60),
            topology=scenario.topology,
        )

    expedite = ["--url", rabbitmq_url, "topology", "expedite", *_chain(scenario)]
    assert await asyncio.to_thread(main, [*expedite, "--id", "order-1", "--yes", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in report["selected"]] == ["order-1"]
    assert report["delivered_to"] == [queue.name] and report["scanned"] == 3

    ident, state = await asyncio.wait_for(handled.get(), 15)
    assert ident == "order-1" and state is not None
    assert state.attempt == 2 and state.retries == 1  # the retry it was waiting to be
    assert state.last_error is not None and "DatabaseDown" in state.last_error
    # Once: nothing else arrives, and the other two still wait in the chain.
    dry = ["--url", rabbitmq_url, "topology", "discard", *_chain(scenario), "--dry-run"]
    assert await asyncio.to_thread(main, [*dry, "--json", "--queue", queue.name]) == 0
    waiting = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in waiting["selected"]] == ["later"] and waiting["scanned"] == 2
    assert handled.empty()


async def test_a_whole_queue_is_expedited_and_a_missing_destination_keeps_the_message(
    scenario: Scenario,
) -> None:
    queue = await scenario.queue()
    for ident in ("a", "b"):
        await publish_delayed(
            scenario.ch,
            aio_pika.Message(ident.encode(), message_id=ident),
            queue=queue.name,
            delay=timedelta(seconds=60),
            topology=scenario.topology,
        )
    # A destination deleted while its message waits: the copy is refused, the message stays.
    gone = scenario.name("gone")
    await scenario.ch.declare_queue(gone, durable=True)
    await publish_delayed(
        scenario.ch,
        aio_pika.Message(b"c", message_id="c"),
        queue=gone,
        delay=timedelta(seconds=60),
        topology=scenario.topology,
    )
    await scenario.ch.queue_delete(gone)
    with pytest.raises(PublishError):
        await expedite_waiting(scenario.ch, queue=gone, topology=scenario.topology)

    report = await expedite_waiting(scenario.ch, queue=queue.name, topology=scenario.topology)
    assert sorted(m.id for m in report.selected) == ["a", "b"]
    inbox = Inbox()
    await queue.consume(inbox)
    assert sorted(a.message.message_id or "" for a in await inbox.take(2)) == ["a", "b"]
    still = await expedite_waiting(
        scenario.ch, queue=gone, dry_run=True, topology=scenario.topology
    )
    assert [m.id for m in still.selected] == ["c"]
