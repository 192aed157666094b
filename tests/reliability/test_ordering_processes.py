"""Order per key with two consumer processes: kept across a kill -9 of one; lost without it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from ._ordering import missing, out_of_order, run_order_scenario
from .test_crash import Child

pytestmark = pytest.mark.broker


def last_write(child: Child) -> float:
    handled = Path(child.args[4])
    return handled.stat().st_mtime if handled.exists() else 0.0


async def kill_the_busy_one(children: list[Child]) -> None:
    """SIGKILL the process that handled last: it holds partitions (the other stands by)."""
    busy = max(children, key=last_write)
    await asyncio.to_thread(busy.kill)


@pytest.mark.timeout(600)
async def test_keys_keep_their_order_across_a_consumer_killed_halfway(
    rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    killed: list[Child] = []
    killed_at = 0

    async def fault(children: list[Child]) -> None:
        nonlocal killed_at
        await kill_the_busy_one(children)
        killed_at = time.time_ns()
        killed.extend(child for child in children if child.deaths)
        killed.extend(child for child in children if not child.deaths)  # then the survivor

    by_key = await run_order_scenario(rabbitmq_url, unique, tmp_path, mode="ordered", fault=fault)
    assert missing(by_key) == 0
    assert out_of_order(by_key) == {}
    # The survivor took the killed one's partitions over, with the keys waiting there.
    dead, survivor = killed
    assert dead.deaths == 1
    after_kill = [
        line
        for line in Path(survivor.args[4]).read_text().splitlines()  # noqa: ASYNC240
        if int(line.split()[0]) > killed_at
    ]
    assert after_kill, "the survivor handled nothing after the kill"


@pytest.mark.timeout(600)
async def test_without_ordered_by_the_same_run_handles_keys_out_of_order(
    rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    by_key = await run_order_scenario(rabbitmq_url, unique, tmp_path, mode="plain", fault=None)
    assert missing(by_key) == 0
    assert len(out_of_order(by_key)) >= 10  # a key with a failing message is out of order
