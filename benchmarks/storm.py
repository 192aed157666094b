"""Retry storm, crash and long-delay workloads: delayed-retry beside every peer.

Each subject is a worker process from :mod:`peer_workers` (its own public API,
on the same broker); the messages are sent before it starts, and it writes an
event line per handler call, so these workloads count what was handled, how
often and when, even across ``kill -9``.

* ``storm``: ``messages`` messages fail ``fail`` times each, then succeed; the
  backoff before retry r is ``base * 2**r``. Time from the first handler call
  to the last success, divided into the ideal: the backoffs every message must
  wait (``base * (2**fail - 1)``) plus one pass of a plain aio-pika consumer
  over the ``messages`` (the time before the last message's first failure),
  measured in the same run from ``messages * (fail + 1)`` plain deliveries.
  Ratio 1.0 = ideal; 0.5 = twice as long.
* ``crash``: the same storm; the worker is killed with SIGKILL ``kill_after``
  seconds after its first handler call and started again at once. Per subject:
  ids sent, ids never handled (lost), extra successes (duplicates).
* ``long-delay``: on a second private node whose ``consumer_timeout`` is lower
  than the backoff, each message fails once and waits ``delay`` seconds. A
  peer that holds the waiting message unacked in the worker gets its channel
  closed by the broker; counted: channel closures, extra deliveries,
  duplicates, losses, and whether all finished within ``2 * delay + grace``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aio_pika
import peer_workers
import throughput
from peer_workers import Job
from workloads import Row, Suite

WORKER = str(Path(peer_workers.__file__).resolve())

NAMES = {
    "plain": "plain aio-pika consumer",
    "delayed-retry": "delayed-retry (quorum TTL chain)",
    "sleep": "hand-rolled asyncio.sleep + re-publish",
    "ttl-queue": "hand-rolled TTL queue per delay",
    "celery-classic": "Celery autoretry, classic queue (ETA in worker)",
    "celery-quorum": "Celery autoretry, quorum + native delayed delivery",
    "dramatiq": "Dramatiq Retries (delay queue held in worker)",
}

# What the broker says when it closes a channel for a delivery held too long; the
# peers log it (Celery, Dramatiq) or the benchmark's close callback does (aio-pika).
TIMEOUT_TEXT = re.compile(r"delivery acknowledgement on channel \d+ timed out", re.I)


class WorkerProcess:
    """One peer worker process, started niced like its parent, stopped by its own pid."""

    def __init__(self, job: Job, directory: Path) -> None:
        self.job = job
        self.log = directory / f"{job.queue}.events"
        self.stderr = directory / f"{job.queue}.stderr"
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        args = [
            sys.executable,
            WORKER,
            self.job.subject,
            "--url",
            self.job.url,
            "--queue",
            self.job.queue,
            "--log",
            str(self.log),
            "--fail",
            str(self.job.fail),
            "--base",
            str(self.job.base),
            "--prefix",
            self.job.prefix,
        ]
        env = {**os.environ, "PYTHONPATH": str(Path(WORKER).parent)}
        with open(self.stderr, "ab") as err:
            self._proc = subprocess.Popen(
                args, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True
            )
        self.starts += 1

    def kill(self) -> None:
        """SIGKILL, as a crash would; wait until it is gone."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def stop(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        os.kill(self._proc.pid, signal.SIGTERM)
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def exit_code(self) -> int | None:
        """The exit code if the worker ended on its own (or was killed), else ``None``."""
        return None if self._proc is None else self._proc.poll()

    def events(self) -> list[peer_workers.Event]:
        return peer_workers.read_events(str(self.log))

    def timeouts_logged(self) -> int:
        try:
            text = self.stderr.read_text(errors="replace")
        except OSError:
            return 0
        return len(TIMEOUT_TEXT.findall(text))


@dataclass
class Outcome:
    """What one subject did with the messages it was sent."""

    subject: str
    sent: int
    handled: int = 0
    successes: int = 0
    deliveries: int = 0
    first_try: float | None = None
    last_ok: float | None = None
    finished: bool = False
    closures: int = 0
    timeouts_logged: int = 0
    starts: int = 1
    left_in_broker: int = 0
    stderr_tail: str = ""
    killed_at: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def not_done(self) -> int:
        return self.sent - self.handled

    @property
    def lost(self) -> int:
        """Ids never handled and not waiting in the broker either (when the run ended)."""
        return max(0, self.not_done - self.left_in_broker)

    @property
    def duplicates(self) -> int:
        return self.successes - self.handled

    @property
    def elapsed(self) -> float | None:
        if self.first_try is None or self.last_ok is None:
            return None
        return self.last_ok - self.first_try


def _summarise(outcome: Outcome, worker: WorkerProcess, ids: set[str]) -> None:
    events = worker.events()
    tries = [e for e in events if e.kind == "try"]
    oks = [e for e in events if e.kind == "ok" and e.ident in ids]
    outcome.deliveries = len(tries)
    outcome.successes = len(oks)
    outcome.handled = len({e.ident for e in oks})
    outcome.first_try = min((e.at for e in tries), default=None)
    outcome.last_ok = max((e.at for e in oks), default=None)
    outcome.finished = outcome.handled == len(ids)
    outcome.closures = sum(1 for e in events if e.kind == "closed")
    outcome.timeouts_logged = worker.timeouts_logged()
    outcome.starts = worker.starts


def _wait(worker: WorkerProcess, ids: set[str], deadline: float) -> bool:
    """Poll the worker's events until every id succeeded (True) or ``deadline`` passes."""
    while time.monotonic() < deadline:
        done = {e.ident for e in worker.events() if e.kind == "ok"}
        if ids <= done:
            return True
        time.sleep(0.1)
    return False


def _first_try(worker: WorkerProcess, deadline: float) -> float | None:
    while time.monotonic() < deadline:
        tries = [e.at for e in worker.events() if e.kind == "try"]
        if tries:
            return min(tries)
        time.sleep(0.02)
    return None


def run_subject(
    url: str,
    subject: str,
    directory: Path,
    *,
    messages: int,
    fail: int,
    base: float,
    timeout: float,
    prefix: str,
    kill_after: float | None = None,
) -> Outcome:
    """Send ``messages``, run the subject's worker until all succeed or ``timeout``; clean up."""
    queue = f"bench-{subject}-{uuid.uuid4().hex[:6]}"
    job = Job(subject=subject, url=url, queue=queue, fail=fail, base=base, prefix=prefix)
    ids = [str(i) for i in range(messages)]
    peer_workers.send(job, ids)
    worker = WorkerProcess(job, directory)
    outcome = Outcome(subject, sent=messages)
    started = time.monotonic()
    deadline = started + timeout
    worker.start()
    try:
        if kill_after is not None:
            first = _first_try(worker, deadline)
            if first is None:
                outcome.notes.append("never started")
            else:
                pause = first + kill_after - time.time()
                if pause > 0:
                    time.sleep(pause)
                worker.kill()
                outcome.killed_at = time.time() - first
                worker.start()
        _wait(worker, set(ids), deadline)
        if kill_after is not None:
            # Anything still coming after a crash (redeliveries, duplicates) arrives
            # within a few seconds of the last success.
            time.sleep(min(3.0, max(0.0, deadline - time.monotonic())))
        code = worker.exit_code()
        if code is not None:
            why = _first_line(worker.stderr, "Unrecoverable error")
            outcome.notes.append(
                f"worker exited by itself (code {code}{'; ' + why if why else ''})"
            )
    finally:
        worker.stop()
    _summarise(outcome, worker, set(ids))
    outcome.left_in_broker = asyncio.run(_left_in_broker(url, job))
    if not outcome.finished:
        outcome.stderr_tail = _tail(worker.stderr)
    asyncio.run(_cleanup(url, job))
    return outcome


def _first_line(path: Path, text: str) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip()[:160] for line in lines if text in line), "")


def _tail(path: Path, lines: int = 6) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _queues_of(job: Job) -> list[str]:
    """Every queue where one of the subject's messages may wait."""
    from delayed_retry import DelayTopology

    names = [job.queue, f"{job.queue}.parking", f"{job.queue}.DQ", f"{job.queue}.XQ"]
    names += [f"{job.queue}.delay.{round(job.base * 1000 * 2**r)}" for r in range(job.fail + 1)]
    if job.subject == "delayed-retry":
        names += [spec.name for spec in DelayTopology(prefix=job.prefix).queues()]
    if job.subject == "celery-quorum":
        names += [f"celery_delayed_{level}" for level in range(28)]
    return names


async def _left_in_broker(url: str, job: Job) -> int:
    """Messages still in the subject's queues once its worker is stopped (ready + returned)."""
    total = 0
    connection = await aio_pika.connect(url)
    async with connection:
        for name in _queues_of(job):
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
                total += queue.declaration_result.message_count or 0
                await channel.close()
            except Exception:
                continue  # not declared by this subject: the passive declare closed the channel
    return total


async def _cleanup(url: str, job: Job) -> None:
    names = [job.queue, f"{job.queue}.parking", f"{job.queue}.DQ", f"{job.queue}.XQ"]
    names += [f"{job.queue}.delay.{round(job.base * 1000 * 2**r)}" for r in range(job.fail + 1)]
    connection = await aio_pika.connect(url)
    async with connection:
        for name in names:
            channel = await connection.channel()
            with contextlib.suppress(Exception):
                await channel.queue_delete(name)
            with contextlib.suppress(Exception):
                await channel.close()
        channel = await connection.channel()
        with contextlib.suppress(Exception):
            await channel.exchange_delete(job.queue)


async def delete_peer_topology(url: str, prefix: str) -> None:
    """Remove Kombu's delay ladder and the benchmark's delayed-retry topology."""
    from delayed_retry import DelayTopology

    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for level in range(28):
            await channel.queue_delete(f"celery_delayed_{level}")
            await channel.exchange_delete(f"celery_delayed_{level}")
        await channel.exchange_delete("celery_delayed_delivery")
        await throughput.delete_topology(channel, DelayTopology(prefix=prefix))


async def _plain_seconds(url: str, deliveries: int) -> float:
    """Seconds a plain aio-pika consumer takes for ``deliveries`` (the ideal's work part)."""
    connection = await aio_pika.connect(url)
    async with connection:
        sample = await throughput.measure(connection, throughput.plain(), deliveries)
    return deliveries / sample.rate


def _row(workload: str, outcome: Outcome, **fields: Any) -> dict[str, Any]:
    return {
        "workload": workload,
        "subject": NAMES[outcome.subject],
        "peer": outcome.subject,
        "sent": outcome.sent,
        "handled": outcome.handled,
        "not_done": outcome.not_done,
        "left_in_broker": outcome.left_in_broker,
        "lost": outcome.lost,
        "duplicates": outcome.duplicates,
        "deliveries": outcome.deliveries,
        "finished": outcome.finished,
        "elapsed_s": None if outcome.elapsed is None else round(outcome.elapsed, 2),
        "channel_closures": outcome.closures,
        "timeouts_logged": outcome.timeouts_logged,
        "worker_starts": outcome.starts,
        "killed_after_s": None if outcome.killed_at is None else round(outcome.killed_at, 2),
        "notes": outcome.notes,
        "stderr_tail": outcome.stderr_tail,
        **fields,
    }


def _note(outcome: Outcome, expected_deliveries: int) -> str:
    parts = [f"{outcome.handled}/{outcome.sent} done"]
    if outcome.not_done:
        parts.append(f"left in broker {outcome.left_in_broker}")
    parts += [f"lost {outcome.lost}", f"dup {outcome.duplicates}"]
    extra = outcome.deliveries - expected_deliveries
    if extra:
        parts.append(f"deliveries {extra:+d}")
    closures = max(outcome.closures, outcome.timeouts_logged)
    if closures:
        parts.append(f"closed by broker {closures}")
    return ", ".join(parts + outcome.notes)


async def run_storm(
    url: str, *, subjects: tuple[str, ...], messages: int, fail: int, base: float, prefix: str
) -> list[dict[str, Any]]:
    waits = base * (2**fail - 1)
    # A plain consumer's time for every delivery of the storm; one pass of it (the
    # first deliveries) must precede the last message's backoffs, the later passes
    # overlap them.
    all_work = await _plain_seconds(url, messages * (fail + 1))
    work = all_work / (fail + 1)
    ideal = waits + work
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp:
        for subject in subjects:
            outcome = await asyncio.to_thread(
                run_subject,
                url,
                subject,
                Path(tmp),
                messages=messages,
                fail=fail,
                base=base,
                timeout=ideal * 4 + 60,
                prefix=prefix,
            )
            elapsed = outcome.elapsed
            ok = outcome.finished and elapsed is not None
            rows.append(
                _row(
                    "storm",
                    outcome,
                    baseline=f"ideal: {waits:g} s backoffs + plain pass {work:.2f} s",
                    unit="s",
                    value=round(elapsed, 2) if ok and elapsed is not None else float("nan"),
                    baseline_value=round(ideal, 2),
                    ratio=round(ideal / elapsed, 3) if ok and elapsed else None,
                    note=_note(outcome, messages * (fail + 1)),
                    plain_seconds_all_deliveries=round(all_work, 3),
                    parameters={"messages": messages, "fail": fail, "base_s": base},
                )
            )
            print(f"  storm {subject}: {rows[-1]['value']} s, {rows[-1]['note']}")
    return rows


async def run_success(
    url: str, *, subjects: tuple[str, ...], messages: int, prefix: str
) -> list[dict[str, Any]]:
    """Every message succeeds at once: each peer's worker against a plain aio-pika consumer.

    Wall-clock (first handler call to last success) in each peer's own worker
    process; the baseline is a plain aio-pika consumer that acks, run and timed
    the same way in a process of its own before and after the subjects (mean).
    Ratio = baseline time / subject time.
    """
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-success-") as tmp:

        async def plain_seconds() -> float:
            outcome = await asyncio.to_thread(
                run_subject,
                url,
                "plain",
                Path(tmp),
                messages=messages,
                fail=0,
                base=1.0,
                timeout=120,
                prefix=prefix,
            )
            if outcome.elapsed is None or not outcome.finished:
                raise RuntimeError(f"the plain consumer did not finish {messages} messages")
            return outcome.elapsed

        # The baseline before and after the subjects, so drift hits both alike.
        before = await plain_seconds()
        outcomes = []
        for subject in subjects:
            outcome = await asyncio.to_thread(
                run_subject,
                url,
                subject,
                Path(tmp),
                messages=messages,
                fail=0,
                base=1.0,
                timeout=before * 20 + 60,
                prefix=prefix,
            )
            outcomes.append(outcome)
        plain = (before + await plain_seconds()) / 2
        for outcome in outcomes:
            elapsed = outcome.elapsed
            ok = outcome.finished and elapsed is not None
            rows.append(
                _row(
                    "peer success (wall)",
                    outcome,
                    baseline="plain aio-pika consumer, own process",
                    unit="s",
                    value=round(elapsed, 2) if ok and elapsed is not None else float("nan"),
                    baseline_value=round(plain, 2),
                    ratio=round(plain / elapsed, 3) if ok and elapsed else None,
                    note=_note(outcome, messages),
                    parameters={"messages": messages},
                )
            )
            print(f"  success {outcome.subject}: {rows[-1]['value']} s, {rows[-1]['note']}")
    return rows


async def run_crash(
    url: str,
    *,
    subjects: tuple[str, ...],
    messages: int,
    fail: int,
    base: float,
    kill_after: float,
    grace: float,
    prefix: str,
) -> list[dict[str, Any]]:
    """Every subject at once: what is counted (lost, duplicated) does not depend on speed."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-crash-") as tmp:
        outcomes = await asyncio.gather(
            *(
                asyncio.to_thread(
                    run_subject,
                    url,
                    subject,
                    Path(tmp),
                    messages=messages,
                    fail=fail,
                    base=base,
                    timeout=base * (2**fail - 1) + kill_after + grace,
                    prefix=prefix,
                    kill_after=kill_after,
                )
                for subject in subjects
            )
        )
        for outcome in outcomes:
            rows.append(
                _row(
                    "crash (kill -9, restart)",
                    outcome,
                    baseline="ids sent",
                    unit="lost",
                    value=outcome.lost,
                    baseline_value=outcome.sent,
                    ratio=round(outcome.handled / outcome.sent, 3),
                    note=_note(outcome, messages * (fail + 1)),
                    parameters={
                        "messages": messages,
                        "fail": fail,
                        "base_s": base,
                        "kill_after_s": kill_after,
                    },
                )
            )
            print(f"  crash {outcome.subject}: {rows[-1]['note']}")
    return rows


async def run_long_delay(
    *,
    subjects: tuple[str, ...],
    messages: int,
    delay: float,
    consumer_timeout: float,
    grace: float,
    prefix: str,
    url: str | None = None,
) -> list[dict[str, Any]]:
    """Every subject at once (they mostly wait) on a node with a low ``consumer_timeout``."""
    from harness import RabbitMQNode

    node = None
    if url is None:
        # The broker checks consumer timeouts on each channel's tick, every 60 s by
        # default; tick every second so the timeout acts when it is due (RabbitMQ's own
        # consumer-timeout tests do the same).
        node = RabbitMQNode(
            config={"consumer_timeout": str(round(consumer_timeout * 1000))},
            rabbit_env={"channel_tick_interval": 1000},
        )
        await asyncio.to_thread(node.start)
        url = node.url
    try:
        with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
            outcomes = await asyncio.gather(
                *(
                    asyncio.to_thread(
                        run_subject,
                        url,
                        subject,
                        Path(tmp),
                        messages=messages,
                        fail=1,
                        base=delay,
                        timeout=2 * delay + grace,
                        prefix=prefix,
                    )
                    for subject in subjects
                )
            )
        await delete_peer_topology(url, prefix)
    finally:
        if node is not None:
            await asyncio.to_thread(node.close)
    rows = []
    for outcome in outcomes:
        elapsed = outcome.elapsed if outcome.finished else None
        rows.append(
            _row(
                f"long delay {delay:g} s > consumer_timeout {consumer_timeout:g} s",
                outcome,
                baseline="the delay",
                unit="s to finish",
                value=round(elapsed, 2) if elapsed is not None else float("nan"),
                baseline_value=delay,
                ratio=round(delay / elapsed, 3) if elapsed else None,
                note=_note(outcome, messages * 2),
                parameters={
                    "messages": messages,
                    "delay_s": delay,
                    "consumer_timeout_s": consumer_timeout,
                    "channel_tick_interval_ms": 1000,
                },
            )
        )
        print(f"  long delay {outcome.subject}: {rows[-1]['note']}")
    return rows


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("peer-success, storm, crash, long-delay, peer-precision")
    group.add_argument(
        "--peer-subjects",
        nargs="+",
        choices=peer_workers.SUBJECTS,
        default=list(peer_workers.SUBJECTS),
    )
    group.add_argument("--success-messages", type=int, help="messages per peer-success subject")
    group.add_argument("--storm-messages", type=int, help="messages per storm subject")
    group.add_argument("--storm-fail", type=int, default=2, help="failures before success")
    group.add_argument(
        "--storm-base", type=float, default=1.0, help="first backoff, s (Celery: whole s, >= 1)"
    )
    group.add_argument("--kill-after", type=float, default=1.5, help="crash: s after first call")
    group.add_argument("--crash-messages", type=int, help="messages per crash subject")
    group.add_argument("--crash-grace", type=float, help="crash: s to wait beyond the backoffs")
    group.add_argument("--long-delay", type=float, help="long-delay: the backoff, s")
    group.add_argument("--long-consumer-timeout", type=float, help="long-delay: s, < the delay")
    group.add_argument("--long-messages", type=int, default=20)
    group.add_argument("--long-grace", type=float, default=20.0)
    group.add_argument("--long-url", help="long-delay: a broker already set that way")
    group.add_argument("--peer-precision-seconds", type=float)


def suite_prefix() -> str:
    """A fresh delayed-retry prefix for one peer workload (removed with its Celery ladder)."""
    return f"bench-storm-{int(time.time())}"


async def peer_success(suite: Suite) -> list[Row]:
    """The ``peer-success`` workload: every peer's worker with no failure."""
    messages = suite.args.success_messages or (1000 if suite.quick else 5000)
    print(f"peer-success: {messages} messages per subject, no failure ...")
    prefix = suite_prefix()
    subjects = tuple(suite.args.peer_subjects)
    rows = await run_success(suite.url, subjects=subjects, messages=messages, prefix=prefix)
    await delete_peer_topology(suite.url, prefix)
    return rows


async def storm(suite: Suite) -> list[Row]:
    """The ``storm`` workload: every message fails ``--storm-fail`` times, then succeeds."""
    args = suite.args
    messages = args.storm_messages or (100 if suite.quick else 1000)
    print(f"storm: {messages} messages, {args.storm_fail} failures, {args.storm_base} s ...")
    prefix = suite_prefix()
    rows = await run_storm(
        suite.url,
        subjects=tuple(args.peer_subjects),
        messages=messages,
        fail=args.storm_fail,
        base=args.storm_base,
        prefix=prefix,
    )
    await delete_peer_topology(suite.url, prefix)
    return rows


async def crash(suite: Suite) -> list[Row]:
    """The ``crash`` workload: a storm, every worker killed with -9 and started again."""
    args = suite.args
    messages = args.crash_messages or (100 if suite.quick else 300)
    print(
        f"crash: a storm of {messages}, all subjects at once, kill -9 after "
        f"{args.kill_after} s, restart ..."
    )
    prefix = suite_prefix()
    rows = await run_crash(
        suite.url,
        subjects=tuple(args.peer_subjects),
        prefix=prefix,
        kill_after=args.kill_after,
        grace=args.crash_grace or (30.0 if suite.quick else 60.0),
        messages=messages,
        fail=args.storm_fail,
        base=args.storm_base,
    )
    await delete_peer_topology(suite.url, prefix)
    return rows


async def long_delay(suite: Suite) -> list[Row]:
    """The ``long-delay`` workload: backoffs past ``consumer_timeout``, a node of its own."""
    args = suite.args
    delay = args.long_delay or (8.0 if suite.quick else 20.0)
    timeout = args.long_consumer_timeout or (4.0 if suite.quick else 10.0)
    print(f"long-delay: {delay} s backoffs, consumer_timeout {timeout} s (a second node) ...")
    return await run_long_delay(
        subjects=tuple(args.peer_subjects),
        messages=args.long_messages,
        delay=delay,
        consumer_timeout=timeout,
        grace=args.long_grace,
        prefix=suite_prefix(),
        url=args.long_url,
    )
