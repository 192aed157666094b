"""Peer precision: how late Celery and Dramatiq run delayed tasks, beside delayed-retry's row.

Each peer's worker runs as its own process (:mod:`peer_workers`, a handler
that succeeds at once); the parent sends at a fixed rate, each message due
``uniform(min_delay, max_delay)`` seconds later, through the peer's own API:

* Celery, classic queue: ``apply_async(eta=...)``; the worker holds the task
  until its ETA.
* Celery, quorum queue on a topic exchange: the same call goes through
  Kombu's native delayed delivery ladder (whole seconds, rounded down), and the
  worker holds the rest.
* Dramatiq: ``send_with_options(delay=ms)``; the ``.DQ`` consumer holds it.

Lateness = the handler's clock - due time, in ms (p50/p99/max and the
earliest, with :func:`precision._percentiles`, as for delayed-retry's own
precision rows). Baseline: the same peer, the same stream, no delay (its
publish→handler latency). Ratio: p99 / baseline p99.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import peer_workers
import precision
import storm
from peer_workers import Job
from workloads import Row, Suite

SUBJECTS = ("celery-classic", "celery-quorum", "dramatiq")


def _stream(
    url: str,
    subject: str,
    directory: Path,
    *,
    rate: float,
    seconds: float,
    min_delay: float,
    max_delay: float,
    delayed: bool,
) -> Stream:
    queue = f"bench-precision-{subject}-{uuid.uuid4().hex[:6]}"
    job = Job(subject=subject, url=url, queue=queue, fail=0, base=1.0)
    worker = storm.WorkerProcess(job, directory)
    worker.start()
    deadline = time.monotonic() + 120
    while not any(e.kind == "ready" for e in worker.events()):
        if time.monotonic() > deadline:
            worker.stop()
            raise RuntimeError(f"{subject} worker not ready in 120 s; see {worker.stderr}")
        time.sleep(0.05)
    total = int(rate * seconds)
    rng = random.Random(7)
    delays = [rng.uniform(min_delay, max_delay) if delayed else 0.0 for _ in range(total)]
    due: dict[str, float] = {}
    started = time.monotonic()
    lock = threading.Lock()

    def when(i: int) -> datetime | None:
        # Keep to the schedule: message i leaves at started + i / rate.
        pause = started + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        now = datetime.now(UTC)
        at = now + timedelta(seconds=delays[i])
        with lock:
            due[str(i)] = at.timestamp()
        return at if delayed else None

    ids = [str(i) for i in range(total)]
    refused = peer_workers.send(job, ids, due=when)
    try:
        storm._wait(worker, set(ids) - set(refused), time.monotonic() + max_delay + 60)
    finally:
        worker.stop()
    late = [(e.at - due[e.ident]) * 1000 for e in worker.events() if e.kind == "ok"]
    left = asyncio.run(storm._left_in_broker(url, job))
    asyncio.run(storm._cleanup(url, job))
    return Stream(late, total, refused, left)


@dataclass(frozen=True)
class Stream:
    """Lateness (ms) of the messages handled; how many were sent; which the peer refused."""

    late: list[float]
    sent: int
    refused: dict[str, str]
    left_in_broker: int


def run(
    url: str,
    *,
    rate: float,
    seconds: float,
    min_delay: float,
    max_delay: float,
    subjects: tuple[str, ...] = SUBJECTS,
) -> list[dict[str, Any]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-peer-precision-") as tmp:
        for subject in subjects:
            streams = {}
            for delayed in (False, True):
                streams[delayed] = _stream(
                    url,
                    subject,
                    Path(tmp),
                    rate=rate,
                    seconds=seconds,
                    min_delay=min_delay,
                    max_delay=max_delay,
                    delayed=delayed,
                )
            b = precision._percentiles(streams[False].late)
            s = precision._percentiles(streams[True].late)
            refused = streams[True].refused
            note = (
                f"p50 {s['p50']:g}, p99 {s['p99']:g}, max {s['max']:g}, "
                f"earliest {s['min']:+g} ms; {len(streams[True].late)}/{streams[True].sent} handled"
            )
            if refused:
                note += f", {len(refused)} refused at send: {next(iter(refused.values()))}"
            unhandled = streams[True].sent - len(streams[True].late) - len(refused)
            if unhandled:
                note += (
                    f", {unhandled} not handled within {max_delay:g} + 60 s "
                    f"({streams[True].left_in_broker} left in its queues)"
                )
            rows.append(
                {
                    "workload": f"peer precision {rate:g}/s",
                    "subject": storm.NAMES[subject],
                    "peer": subject,
                    "baseline": "the same peer, no delay",
                    "unit": "ms late (p99)",
                    "value": s["p99"],
                    "baseline_value": b["p99"],
                    "ratio": round(s["p99"] / b["p99"], 2) if b["p99"] > 0 else None,
                    "lateness_ms": s,
                    "baseline_lateness_ms": b,
                    "never_early": s["min"] >= 0,
                    "messages": len(streams[True].late),
                    "sent": streams[True].sent,
                    "refused": len(refused),
                    "not_handled": streams[True].sent - len(streams[True].late) - len(refused),
                    "left_in_broker": streams[True].left_in_broker,
                    "refused_error": next(iter(refused.values()), None),
                    "note": note,
                    "parameters": {
                        "rate": rate,
                        "seconds": seconds,
                        "min_delay": min_delay,
                        "max_delay": max_delay,
                    },
                }
            )
            print(f"  peer precision {subject}: {rows[-1]['note']}")
    return rows


async def peer_precision(suite: Suite) -> list[Row]:
    """The ``peer-precision`` workload: 100 msg/s for the peers among ``--peer-subjects``."""
    args = suite.args
    seconds = args.peer_precision_seconds or (3.0 if suite.quick else 10.0)
    peers_here = tuple(p for p in SUBJECTS if p in args.peer_subjects)
    print(f"peer-precision: {seconds} s at 100 msg/s for {peers_here} ...")
    rows = await asyncio.to_thread(
        run,
        suite.url,
        rate=100,
        seconds=seconds,
        min_delay=args.min_delay,
        max_delay=args.max_delay,
        subjects=peers_here,
    )
    # Celery's delay ladder: the peers measured here declare no delayed-retry chain.
    await storm.delete_peer_topology(suite.url, storm.suite_prefix())
    return rows
