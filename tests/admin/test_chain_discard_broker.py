"""Discarding (or parking) chosen messages waiting in the delay chain, on a real broker.

The others must arrive once and never early; a discarded one never arrives; a parked one
leaves a record that ``parking replay`` sends back; reading a level never brings a message
closer to a drop (the delivery limit of RabbitMQ 4.x quorum queues).
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from datetime import timedelta

import aio_pika
import pytest
from aio_pika.abc import AbstractChannel

from delayed_retry import DelayTopology, publish_delayed
from delayed_retry.admin.chain_discard import discard_waiting
from delayed_retry.admin.level_reads import FEW
from delayed_retry.admin.waiting import READ_BUDGET, reads_are_counted
from delayed_retry.cli import main
from delayed_retry.durations import utcnow
from delayed_retry.errors import ConfigurationError, NotFoundError, ReadsCountedError
from delayed_retry.headers import X_DUE_AT, read_epoch_ms
from delayed_retry.rabbitmq.versions import broker_version
from tests.support.chain import Arrival, Inbox, Scenario

pytestmark = pytest.mark.broker

DUE_IN = 3.0
"""Seconds until the test messages are due: the discard happens well before."""


async def _schedule(scenario: Scenario, queue: str, *ids: str, due_in: float = DUE_IN) -> None:
    due = utcnow() + timedelta(seconds=due_in)
    for ident in ids:
        await publish_delayed(
            scenario.ch,
            aio_pika.Message(ident.encode(), message_id=ident),
            queue=queue,
            delay=due,
            topology=scenario.topology,
        )


async def _chain_empty(scenario: Scenario) -> None:
    for level in range(scenario.topology.levels):
        await scenario.wait_for_depth(scenario.topology.level_name(level), 0)


def _never_early(arrival: Arrival) -> None:
    due = read_epoch_ms(arrival.headers.get(X_DUE_AT))
    assert due is not None
    assert arrival.at >= due.timestamp(), f"{arrival.message.message_id} arrived early"


def _topology_args(scenario: Scenario) -> list[str]:
    t = scenario.topology
    return ["--prefix", t.prefix, "--levels", str(t.levels), "--queue-type", t.queue_type]


async def test_a_discarded_message_never_arrives_and_the_others_arrive_once_never_early(
    scenario: Scenario,
) -> None:
    queue = await scenario.queue()
    other = await scenario.queue("other")
    await _schedule(scenario, queue.name, "keep-1", "drop", "keep-2")
    # Same id, another destination: --queue keeps it out of the selection.
    await _schedule(scenario, other.name, "drop")

    report = await discard_waiting(
        scenario.ch, ids=("drop",), queue=queue.name, topology=scenario.topology
    )

    assert [m.id for m in report.selected] == ["drop"]
    assert report.selected[0].destination == queue.name
    assert report.scanned == 4 and report.unmatched == ()
    inbox, other_inbox = Inbox(), Inbox()
    await queue.consume(inbox)
    await other.consume(other_inbox)
    arrivals = await inbox.take(2)
    assert sorted(a.message.message_id or "" for a in arrivals) == ["keep-1", "keep-2"]
    (kept,) = await other_inbox.take(1)
    assert kept.message.message_id == "drop"
    for arrival in (*arrivals, kept):
        _never_early(arrival)
    # Nothing left anywhere that could still bring "drop" (or a second copy of the others).
    await _chain_empty(scenario)
    await scenario.wait_for_depth(queue.name, 0)
    assert inbox.pending() == 0


async def test_a_level_with_many_messages_is_read_whole_and_given_back_whole(
    scenario: Scenario,
) -> None:
    # More than FEW ready in one level: read by a consumer, then basic.get.
    queue = await scenario.queue()
    ids = [f"m-{i}" for i in range(3 * FEW)]
    await _schedule(scenario, queue.name, *ids)

    report = await discard_waiting(scenario.ch, ids=("m-17", "m-40"), topology=scenario.topology)

    assert sorted(m.id for m in report.selected) == ["m-17", "m-40"]
    assert report.scanned == len(ids)
    inbox = Inbox()
    await queue.consume(inbox)
    arrivals = await inbox.take(len(ids) - 2)
    assert sorted(a.message.message_id or "" for a in arrivals) == sorted(
        set(ids) - {"m-17", "m-40"}
    )
    for arrival in arrivals:
        _never_early(arrival)
    await _chain_empty(scenario)
    await scenario.wait_for_depth(queue.name, 0)
    assert inbox.pending() == 0


async def test_park_leaves_a_discarded_record_that_parking_replay_sends_back(
    scenario: Scenario, rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = await scenario.queue()
    await _schedule(scenario, queue.name, "stay", "later", due_in=60.0)
    url = ["--url", rabbitmq_url]
    chain = _topology_args(scenario)

    dry = [*url, "topology", "discard", *chain, "--queue", queue.name, "--dry-run"]
    assert await asyncio.to_thread(main, dry) == 0
    out = capsys.readouterr().out
    assert "stay" in out and "later" in out and "would have parked" not in out
    assert "dry run: would have discarded 2 of 2 waiting message(s)" in out

    park = [*url, "topology", "discard", *chain, "--id", "later", "--park", "--yes", "--json"]
    assert await asyncio.to_thread(main, park) == 0
    report = json.loads(capsys.readouterr().out)
    assert [m["id"] for m in report["selected"]] == ["later"]
    assert report["parked_to"] == [f"{queue.name}.parking"]

    listing = [*url, "parking", "list", "--queue", queue.name, "--json", *chain[:4]]
    assert await asyncio.to_thread(main, listing) == 0
    (record,) = json.loads(capsys.readouterr().out)["records"]
    assert record["id"] == "later" and record["reason"] == "discarded"

    inbox = Inbox()
    await queue.consume(inbox)
    replay = [*url, "parking", "replay", "--queue", queue.name, "--id", "later", "--yes", *chain]
    assert await asyncio.to_thread(main, replay) == 0
    (back,) = await inbox.take(1)
    assert back.message.message_id == "later" and back.message.body == b"later"
    await scenario.wait_for_depth(f"{queue.name}.parking", 0)
    # "stay" still waits for its own time.
    remaining = await discard_waiting(
        scenario.ch, queue=queue.name, dry_run=True, topology=scenario.topology
    )
    assert [m.id for m in remaining.selected] == ["stay"]


async def test_an_unknown_id_a_missing_chain_and_no_selection_are_refused(
    scenario: Scenario, rabbitmq_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    queue = await scenario.queue()
    await _schedule(scenario, queue.name, "known", due_in=60.0)
    url = ["--url", rabbitmq_url]
    chain = _topology_args(scenario)

    unknown = [*url, "topology", "discard", *chain, "--id", "nope", "--yes"]
    assert await asyncio.to_thread(main, unknown) == 1
    err = capsys.readouterr().err
    assert "no message with id 'nope' waits in the delay chain" in err
    assert len(err.strip().splitlines()) == 1

    missing = ["--prefix", f"{scenario.unique}-none", "--levels", "16"]
    no_chain = [*url, "topology", "discard", *missing, "--id", "known", "--yes"]
    assert await asyncio.to_thread(main, no_chain) == 1
    assert "there is no delay chain" in capsys.readouterr().err
    with pytest.raises(NotFoundError, match=r"level queue .* does not exist"):
        await discard_waiting(
            scenario.ch,
            ids=("known",),
            topology=DelayTopology(prefix=f"{scenario.unique}-none", levels=16),
        )

    assert await asyncio.to_thread(main, [*url, "topology", "discard", *chain]) == 2
    assert "needs a selection" in capsys.readouterr().err
    with pytest.raises(ConfigurationError, match="needs a selection"):
        await discard_waiting(scenario.ch, topology=scenario.topology)

    # Nothing was taken by any of it.
    left = await discard_waiting(
        scenario.ch, ids=("known",), dry_run=True, topology=scenario.topology
    )
    assert left.done == 1


async def _version(channel: AbstractChannel) -> tuple[int, int] | None:
    underlay = await channel.get_underlay_channel()
    return broker_version(getattr(underlay.connection, "server_properties", None))


async def test_repeated_scans_never_bring_a_waiting_message_to_its_delivery_limit(
    quorum: Scenario,
) -> None:
    # RabbitMQ 4.0-4.2 count each return toward a quorum queue's limit of 20 and then
    # dead-letter the message to the next level: early. A discard returns by basic.nack,
    # which 4.3 does not count; where returns count, it stops reading at READ_BUDGET.
    queue = await quorum.queue()
    # More than FEW in one level, so its consumer's deliveries are given back too.
    others = [f"w-{i}" for i in range(FEW)]
    await _schedule(quorum, queue.name, "waits", *others, due_in=60.0)
    version = await _version(quorum.ch)
    major = None if version is None else version[0]
    budgeted = reads_are_counted(broker_major=major, queue_type="quorum") and (
        version is None or version < (4, 3)
    )
    scans = READ_BUDGET if budgeted else 25  # 25: past the broker's default limit of 20
    for _ in range(scans):
        report = await discard_waiting(
            quorum.ch, queue=queue.name, dry_run=True, topology=quorum.topology
        )
        assert sorted(m.id for m in report.selected) == sorted(["waits", *others])
    (level,) = {quorum.topology.level_name(m.level) for m in report.selected}
    if budgeted:
        with pytest.raises(ReadsCountedError, match=f"returned {READ_BUDGET} times already"):
            await discard_waiting(quorum.ch, ids=("waits",), topology=quorum.topology)
        # Refused, and all still waiting in their level: none taken, none moved on.
        await quorum.wait_for_depth(level, 1 + FEW)
        return
    if version is not None and version >= (4, 3):
        assert {m.returns for m in report.selected} == {0}
    # Still waiting in their level (not dead-lettered on), and a discard still takes one.
    await quorum.wait_for_depth(level, 1 + FEW)
    taken = await discard_waiting(quorum.ch, ids=("waits",), topology=quorum.topology)
    assert taken.done == 1
    await quorum.wait_for_depth(level, FEW)


class _Terminal(io.StringIO):
    """Standard input that is a terminal, answering what it was given."""

    def isatty(self) -> bool:
        return True


async def test_without_yes_it_counts_what_it_found_and_asks_first(
    scenario: Scenario,
    rabbitmq_url: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = await scenario.queue()
    await _schedule(scenario, queue.name, "twin", "twin", "other", due_in=60.0)
    discard = ["--url", rabbitmq_url, "topology", "discard", *_topology_args(scenario)]
    discard += ["--id", "twin"]

    assert await asyncio.to_thread(main, discard) == 2  # no terminal to ask on, no --yes
    err = capsys.readouterr().err
    assert "delete 2 waiting message(s) with id 'twin' for good?" in err and "--yes" in err

    monkeypatch.setattr("sys.stdin", _Terminal("n\n"))
    assert await asyncio.to_thread(main, discard) == 1
    captured = capsys.readouterr()
    assert "[y/N]" in captured.out and "nothing discarded" in captured.err

    monkeypatch.setattr("sys.stdin", _Terminal("y\n"))
    assert await asyncio.to_thread(main, discard) == 0
    # It stops at the count agreed to: "other" may not even have been read.
    assert re.search(r"discarded 2 of [23] waiting message\(s\)", capsys.readouterr().out)

    left = await discard_waiting(
        scenario.ch, queue=queue.name, dry_run=True, topology=scenario.topology
    )
    assert [m.id for m in left.selected] == ["other"]
