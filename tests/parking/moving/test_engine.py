"""The parts of a replay or purge that need no broker: tally, canary slots, copies, hand-overs."""

from __future__ import annotations

import asyncio
import functools
from datetime import UTC, datetime, timedelta

import pytest

from delayed_retry import DelayTopology
from delayed_retry.durations import to_epoch_ms
from delayed_retry.errors import PublishError
from delayed_retry.headers import (
    X_DUE_AT,
    X_FIRST_FAILURE_AT,
    X_LAST_FAILURE_AT,
    X_PARKED_AT,
    X_PARKED_REASON,
    X_REPLAY_CANARY,
    X_REPLAYED,
    X_REPLAYED_BY,
    X_RETRY,
    read_epoch_ms,
)
from delayed_retry.parking.moving.canary_rules import (
    CanarySlots,
    CanaryWait,
    derived_wait,
    retry_span,
)
from delayed_retry.parking.moving.engine import HandOvers, MoveRequest
from delayed_retry.parking.moving.report import CANARY_PARKED_AGAIN, MoveProgress, MoveTally
from delayed_retry.parking.records import ParkedRecord, read_record, replay_copy
from tests.support.waiting import wait_until

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
TOPOLOGY = DelayTopology(prefix="t-moves", levels=12)


def _record(ident: str) -> ParkedRecord:
    return read_record({X_PARKED_REASON: "max-retries"}, message_id=ident, body=b"{}")


# -- the tally -----------------------------------------------------------------
def test_the_tally_tells_each_skipped_and_each_acted_on_message_and_reports_the_counts() -> None:
    told: list[MoveProgress] = []
    tally = MoveTally(action="purge", dry_run=False, progress=told.append)
    tally.depth = 3
    tally.looked_at(selected=False)
    tally.looked_at(selected=True)
    assert [(p.record, p.done, p.scanned) for p in told] == [(None, 0, 1)]
    tally.acted_on(_record("m-1"))
    assert told[-1].record is not None and told[-1].record.id == "m-1"
    assert (told[-1].done, told[-1].scanned, told[-1].depth) == (1, 2, 3)
    assert not tally.reached(2) and tally.reached(1) and not tally.reached(None)

    tally.stopped = CANARY_PARKED_AGAIN
    report = tally.report(canary_ids=("m-1",))
    assert (report.action, report.done, report.scanned, report.depth) == ("purge", 1, 2, 3)
    assert report.stopped == CANARY_PARKED_AGAIN and report.canary_ids == ("m-1",)
    assert report.to_queue is None and not report.dry_run


def test_a_tally_without_a_progress_callback_still_counts() -> None:
    tally = MoveTally(action="replay", dry_run=True, to_queue="orders")
    tally.looked_at(selected=True)
    tally.acted_on(_record("m-1"))
    report = tally.report()
    assert (report.done, report.scanned, report.to_queue, report.dry_run) == (
        1,
        1,
        "orders",
        True,
    )


# -- canary slots ----------------------------------------------------------------
def test_only_the_first_messages_get_the_canary_token() -> None:
    slots = CanarySlots(size=2)
    assert not slots.some_out and not slots.all_out
    assert slots.take(_record("m-0")) == slots.token
    assert slots.some_out and not slots.all_out
    assert slots.take(_retried("m-1", span=7)) == slots.token
    assert slots.all_out and not slots.some_out
    assert slots.take(_record("m-2")) is None
    assert slots.ids == ["m-0", "m-1"]
    assert slots.spans == [None, 7.0]  # what the canary wait is derived from
    assert CanarySlots(size=2).token != slots.token  # one token per replay


# -- the canary wait ------------------------------------------------------------------
def _retried(ident: str, *, span: float, retries: int = 3) -> ParkedRecord:
    """A record parked ``span`` seconds after its first failure, as the decorator writes it."""
    first = NOW - timedelta(seconds=span)
    return read_record(
        {
            X_PARKED_REASON: "max-retries",
            X_RETRY: retries,
            X_FIRST_FAILURE_AT: to_epoch_ms(first),
            X_LAST_FAILURE_AT: to_epoch_ms(NOW),
            X_PARKED_AT: to_epoch_ms(NOW),
        },
        message_id=ident,
        body=b"{}",
    )


def test_the_canary_wait_covers_twice_the_retry_span_of_the_slowest_canary() -> None:
    # Retried after 1, 2 and 4 s, then parked: 7 s from the first failure to the last.
    assert retry_span(_retried("m-0", span=7)) == 7.0
    assert derived_wait([7.0]) == 2 * 7 + 5
    assert derived_wait([7.0, 30.0, 0.0]) == 2 * 30 + 5  # the slowest canary decides
    assert derived_wait([0.0]) == 5  # parked at its first failure: one handling
    assert retry_span(_record("m-1")) is None  # no failure times: a foreign message
    assert derived_wait([None]) == 60
    wait = CanaryWait.choose([7.0], given=None)
    assert (wait.seconds, wait.derived, wait.short, wait.warning()) == (19.0, 19.0, False, None)
    assert (
        wait.describe()
        == "19 s: twice the canary's retry span of 7 s (first to last failure) plus 5 s"
    )


def test_a_given_canary_wait_shorter_than_the_records_call_for_is_warned_about() -> None:
    wait = CanaryWait.choose([7.0], given=5)
    assert wait.seconds == 5 and wait.derived == 19 and wait.short
    warning = wait.warning()
    assert warning is not None
    assert warning.startswith("canary wait 5 s is shorter than the 19 s: twice the canary's")
    assert "Leave the wait out" in warning
    longer = CanaryWait.choose([7.0], given=60)
    assert longer.seconds == 60 and not longer.short and longer.warning() is None


# -- replayed copies ----------------------------------------------------------------
def test_a_replayed_copy_is_routed_for_its_delay_with_a_fresh_budget() -> None:
    parked = {X_PARKED_REASON: "max-retries", X_RETRY: 5, "tenant": "acme"}
    route, headers = replay_copy(
        parked, topology=TOPOLOGY, target="orders", delay=1.5, now=NOW, replayed_by="ops"
    )
    assert route == TOPOLOGY.route(1500, "orders")
    assert headers[X_RETRY] == 0 and headers[X_REPLAYED] == 1 and headers[X_REPLAYED_BY] == "ops"
    assert X_PARKED_REASON not in headers and headers["tenant"] == "acme"
    assert read_epoch_ms(headers[X_DUE_AT]) == NOW + timedelta(seconds=1.5)
    assert X_REPLAY_CANARY not in headers


def test_a_canary_copy_carries_the_token() -> None:
    route, headers = replay_copy(
        None, topology=TOPOLOGY, target="orders", delay=0, now=NOW, canary_token="abc"
    )
    assert headers[X_REPLAY_CANARY] == "abc"
    assert route.units == 0


def test_a_move_request_names_the_default_parking_queue() -> None:
    assert MoveRequest(queue="orders", topology=TOPOLOGY).parking == "orders.parking"
    named = MoveRequest(queue="orders", parking_queue="lot", topology=TOPOLOGY)
    assert named.parking == "lot"


# -- hand-overs (asyncio only) -----------------------------------------------------
async def test_hand_overs_run_one_per_key_and_at_most_the_window() -> None:
    log: list[str] = []
    gates = {name: asyncio.Event() for name in ("a1", "a2", "b1", "c1")}

    async def work(name: str) -> None:
        log.append(f"start {name}")
        await gates[name].wait()
        log.append(f"end {name}")

    async with HandOvers(2) as hand_overs:
        await hand_overs.start("a", functools.partial(work, "a1"))
        # Same key: waits until a1 is done, although the window has room.
        second = asyncio.create_task(hand_overs.start("a", functools.partial(work, "a2")))
        await wait_until(lambda: "start a1" in log, what="a1 to start")
        assert not second.done() and "start a2" not in log
        gates["a1"].set()
        await second
        await hand_overs.start("b", functools.partial(work, "b1"))
        # Window of 2 full (a2, b1): c1 waits for room.
        third = asyncio.create_task(hand_overs.start("c", functools.partial(work, "c1")))
        await wait_until(lambda: "start b1" in log, what="b1 to start")
        assert not third.done() and "start c1" not in log
        gates["b1"].set()
        await third
        gates["a2"].set()
        gates["c1"].set()
        await hand_overs.settle()
    assert log.index("end a1") < log.index("start a2")
    assert log.index("end b1") < log.index("start c1")  # a2 still ran: c1 took b1's place
    assert sorted(line for line in log if line.startswith("end")) == [
        "end a1",
        "end a2",
        "end b1",
        "end c1",
    ]
    assert hand_overs.failure is None


async def test_a_failing_hand_over_is_kept_and_the_others_finish() -> None:
    done: list[str] = []

    async def fails() -> None:
        raise PublishError("no confirm for the copy")

    async def works() -> None:
        done.append("b")

    async with HandOvers(4) as hand_overs:
        await hand_overs.start("a", fails)
        await hand_overs.start("b", works)
        await hand_overs.settle()
    assert isinstance(hand_overs.failure, PublishError) and done == ["b"]


async def test_leaving_the_hand_overs_cancels_what_still_runs() -> None:
    started = asyncio.Event()
    cancelled: list[bool] = []

    async def never_ends() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def scan_fails() -> None:
        async with HandOvers(1) as hand_overs:
            await hand_overs.start("a", never_ends)
            await started.wait()
            raise RuntimeError("the scan failed")

    with pytest.raises(RuntimeError, match="the scan failed"):
        await scan_fails()
    assert cancelled == [True]
