"""A replay's canary against a real broker and a consumer whose retries take time.

The consumer retries each message after 1 s and 2 s, then parks it: its
parking records span about 3 s, and a replayed copy needs as long again to
park. The canary's wait must cover that, and a canary that parks again after
the rest was replayed must still be reported.
"""

from __future__ import annotations

import pytest

from delayed_retry.parking.lot import CanaryNews, replay_matching
from delayed_retry.parking.moving.report import CANARY_PARKED_AFTER_THE_REST, CANARY_PARKED_AGAIN
from tests.support.chain import Scenario
from tests.support.retrying import fail_with_retries, park_after_retries
from tests.support.waiting import wait_until
from tests.support.web import ids_in

pytestmark = pytest.mark.broker


async def test_the_derived_canary_wait_covers_the_retries_and_keeps_the_rest_parked(
    lot: Scenario,
) -> None:
    queue = lot.name("orders")
    stop = await fail_with_retries(lot, queue)
    try:
        ids = await park_after_retries(lot, queue, 4)
        news: list[CanaryNews] = []
        report = await replay_matching(
            lot.ch,
            queue=queue,
            canary=1,
            canary_poll=0.1,
            canary_news=news.append,
            topology=lot.topology,
        )
        parking = queue + ".parking"

        async def all_parked() -> bool:
            return await lot.depth(parking) == 4

        await wait_until(all_parked, timeout=30, what="the canary to be parked again")
    finally:
        await stop()
    assert report.stopped == CANARY_PARKED_AGAIN == report.canary_verdict
    assert report.done == 1
    wait = report.canary_wait
    assert wait is not None and wait.given is None
    # Parked after retries of 1 s and 2 s: the record spans at least 3 s, so the canary is
    # watched at least 2 x 3 s + 5 s: longer than the 5 s that let the rest go too early.
    assert wait.span is not None and 3 <= wait.span < 6
    assert wait.seconds == wait.derived == 2 * wait.span + 5
    assert [n.phase for n in news] == ["watching", "parked-again"]
    assert sorted(await ids_in(lot, parking)) == ids


async def test_a_canary_that_parks_again_after_the_rest_was_replayed_is_reported(
    lot: Scenario, caplog: pytest.LogCaptureFixture
) -> None:
    queue = lot.name("orders")
    stop = await fail_with_retries(lot, queue)
    try:
        ids = await park_after_retries(lot, queue, 3)
        news: list[CanaryNews] = []
        # Half a second: the canary is still retrying when the rest follows.
        report = await replay_matching(
            lot.ch,
            queue=queue,
            canary=1,
            canary_wait=0.5,
            canary_poll=0.1,
            canary_news=news.append,
            topology=lot.topology,
        )
        parking = queue + ".parking"

        async def all_parked() -> bool:
            return await lot.depth(parking) == 3

        await wait_until(all_parked, timeout=30, what="the replayed messages to park again")
    finally:
        await stop()
    assert report.done == 3 and report.stopped is None
    assert report.canary_verdict == CANARY_PARKED_AFTER_THE_REST and report.canary_failed
    assert [n.phase for n in news] == [
        "watching",
        "passed",
        "confirming",
        "parked-again-after-the-rest",
    ]
    assert news[2].rest == 2 and news[2].until is not None
    assert "canary wait 500 ms is shorter than the" in caplog.text
    assert sorted(await ids_in(lot, parking)) == ids
