"""A consumer process killed with SIGKILL, while handling and between re-publish and ack.

The consumer runs as a child process (``crash_consumer.py``) so that it can
really be killed. Duplicates are allowed and counted; a loss fails the test.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from aio_pika.abc import AbstractChannel

from delayed_retry import DelayTopology
from tests.support.queues import delete_all, depth
from tests.support.waiting import wait_until

from ._support import QUORUM, Ledger, drain_ids, publish_ids

CHILD = Path(__file__).with_name("crash_consumer.py")
MESSAGES = 300
FAIL_ALWAYS = 99


def plan(i: int) -> dict[str, object]:
    """Fails never, once, twice, or always (parked after 2 retries), by id."""
    return {"fail": (0, 1, 2, 1, FAIL_ALWAYS)[i % 5]}


class Child:
    """Starts the consumer process again and again, and counts how often it died."""

    def __init__(self, args: list[str], log: Path, *, script: Path = CHILD) -> None:
        self.args = args
        self.log = log
        self.script = script
        self.proc: subprocess.Popen[bytes] | None = None
        self.deaths = 0

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(self.script), *self.args], stdout=out, stderr=subprocess.STDOUT
            )

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
            self.deaths += 1

    def restart_if_dead(self, *, max_deaths: int) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            assert self.proc.returncode == -signal.SIGKILL, self.log.read_text()[-3000:]
            self.deaths += 1
            if self.deaths >= max_deaths:
                self.args[5] = "0"  # enough crashes seen: let the rest finish
            self.start()


async def run_crash_scenario(
    channel: AbstractChannel, rabbitmq_url: str, unique: str, tmp_path: Path, *, mode: str
) -> Ledger:
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=12)
    await channel.declare_queue(queue, durable=True, arguments=QUORUM)
    handled_file = tmp_path / "handled.txt"
    handled_file.touch()
    probability = "0.05" if mode == "after-publish" else "0"
    child = Child(
        [rabbitmq_url, queue, unique, str(handled_file), mode, probability, "7"],
        tmp_path / "child.log",
    )
    ledger = Ledger(sent=set(range(MESSAGES)))
    expect_handled = {i for i in ledger.sent if plan(i)["fail"] != FAIL_ALWAYS}
    expect_parked = len(ledger.sent) - len(expect_handled)
    rng = random.Random(3)

    def handled() -> Counter[int]:
        return Counter(int(x) for x in handled_file.read_text().split())

    try:
        await publish_ids(channel, queue, sorted(ledger.sent), extra=plan)
        child.start()

        async def settled() -> bool:
            if mode == "handling" and child.deaths < 6:
                # Kill it from outside at a random moment while messages are being handled.
                await asyncio.sleep(rng.uniform(0.5, 1.5))
                child.kill()
                child.start()
                return False
            child.restart_if_dead(max_deaths=8)
            if not expect_handled <= set(handled()):
                return False
            # Duplicated parking records can arrive before the last original one: count ids.
            for i in await drain_ids(channel, topology.default_parking_queue(queue)):
                ledger.parked[i] += 1
            return len(ledger.parked) >= expect_parked

        await wait_until(settled, timeout=150, what="every message handled or parked")
        assert child.deaths >= 3, f"only {child.deaths} crash(es): the test proved little"
        child.kill()
        ledger.handled = handled()
        for i in await drain_ids(channel, topology.default_parking_queue(queue)):
            ledger.parked[i] += 1
        assert await depth(channel, topology.unroutable_queue) == 0
        return ledger
    finally:
        child.kill()
        await delete_all(
            channel,
            queues=[
                queue,
                topology.default_parking_queue(queue),
                *(spec.name for spec in topology.queues()),
            ],
        )


async def test_sigkill_while_handling_loses_nothing(
    channel: AbstractChannel, rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    ledger = await run_crash_scenario(channel, rabbitmq_url, unique, tmp_path, mode="handling")
    counts = ledger.report("sigkill-while-handling")
    assert counts["lost"] == 0, sorted(ledger.lost)[:20]
    assert counts["handled"] == MESSAGES * 4 // 5
    assert counts["parked"] == MESSAGES // 5


async def test_sigkill_between_republish_and_ack_loses_nothing(
    channel: AbstractChannel, rabbitmq_url: str, unique: str, tmp_path: Path
) -> None:
    ledger = await run_crash_scenario(channel, rabbitmq_url, unique, tmp_path, mode="after-publish")
    counts = ledger.report("sigkill-between-republish-and-ack")
    assert counts["lost"] == 0, sorted(ledger.lost)[:20]
    assert counts["handled"] == MESSAGES * 4 // 5
    assert counts["parked"] == MESSAGES // 5
    # Each crash after a confirmed copy leaves the original to be redelivered: a duplicate.
    assert counts["duplicates"] > 0


def test_plan_covers_every_outcome() -> None:
    assert {json.dumps(plan(i)) for i in range(5)} == {
        json.dumps({"fail": k}) for k in (0, 1, 2, FAIL_ALWAYS)
    }
