"""Where 1,000 delayed messages a second stop keeping up: the client or the broker.

``benchmarks/precision.py`` schedules and consumes in one process. This one
puts the producer (``publish_delayed`` at a fixed rate, delays uniform in
``[min_delay, max_delay]``) in a process of its own, as a real service would,
and measures, for each subject, the lateness the consumer sees and the CPU
each party used: the broker's Erlang VM, the consumer process and the
producer process, in cores. The baseline is the same stream with no delay to
a classic queue, in the same run. A subject is a chain (queue type, levels,
unit) and a hold; each gets a chain of its own on one private node.

Each row also says what arrived: every message exactly once (``received``,
``duplicates``, ``missing``), the level queues each waited in as its
``x-death`` header counts them (``hops_seen``), the most messages the
consumer held at once (sampled every 5 ms) and the consumer process's peak
RSS. ``benchmarks/broker_cost.py`` turns these rows into the broker's cost per
delayed message.

``--limit-eprof SECONDS`` profiles the broker (Erlang's ``eprof`` over every
process) for that long in the middle of the first delayed subject and prints
the functions that took the most time, and the share of the topic exchange's
routing (``rabbit_exchange_type_topic`` and the mnesia reads its trie makes).
eprof slows the broker down while it runs; read shares, not times.

The suite's ``broker-limit`` workload: ``benchmarks/run --only broker-limit --limit-rate
1000``; run as a script, the module is the producer process :func:`measure` starts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import re
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import precision
from aio_pika.abc import AbstractIncomingMessage
from throughput import broker_cpu_seconds, delete_topology
from workloads import Row, Suite

import delayed_retry
from delayed_retry import (
    DEFAULT_HOLD,
    DelayTopology,
    Hold,
    consume,
    declare_topology,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.recovery.hold import chain_units
from harness import RabbitMQNode

DUE_HEADER = "bench-due-us"
"""Due time (or publish time, for the baseline) in integer microseconds since the epoch.

An integer: pamqp sends a Python float as a 32-bit float, which cannot hold an epoch time."""

MIN_DELAY, MAX_DELAY = 0.5, 3.0
"""Seconds; each delayed message's delay is drawn uniformly from this range."""


@dataclass(frozen=True)
class Subject:
    """One stream: no delay (baseline), or a chain of ``levels`` x ``unit_ms`` with a hold.

    ``work_queue`` is the type of the queue the stream ends in (and the baseline's only queue).
    """

    name: str
    delayed: bool = True
    queue_type: str = "quorum"
    levels: int = 36
    unit_ms: int = 1
    hold: Hold | None = DEFAULT_HOLD
    work_queue: str = "classic"

    def topology(self, prefix: str) -> DelayTopology:
        return DelayTopology(
            prefix=prefix,
            levels=self.levels,
            unit=timedelta(milliseconds=self.unit_ms),
            queue_type=self.queue_type,  # type: ignore[arg-type]
        )


SUBJECTS = {
    "baseline": Subject("plain publish→consume, classic queue", delayed=False),
    "baseline-quorum": Subject(
        "plain publish→consume, quorum queue", delayed=False, work_queue="quorum"
    ),
    "held": Subject("quorum chain, 36 levels, held (default)"),
    "unheld": Subject("quorum chain, 36 levels, no hold", hold=None),
    "classic": Subject("classic chain, 36 levels, held", queue_type="classic"),
    "levels-20": Subject("quorum chain, 20 levels, held", levels=20),
    "unit-32": Subject("quorum chain, 31 levels of 32 ms, held", levels=31, unit_ms=32),
}

TOPIC_ROUTING = re.compile(r"^(rabbit_exchange_type_topic|mnesia|mnesia_lib):")


def _own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def _status_kb(field: str) -> int | None:
    """A ``kB`` field of /proc/self/status (``VmRSS``, ``VmHWM``); ``None`` where unreadable."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak_rss() -> bool:
    """Reset this process's ``VmHWM`` to its current RSS (Linux 4.0+); ``False`` if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def level_hops(topology: DelayTopology, headers: Mapping[str, Any]) -> int:
    """The level queues a message waited in, as its ``x-death`` header counts them.

    Each queue a message dead-lettered from has one entry with a ``count``; a
    message sent back into the chain and through a level queue again counts twice.
    """
    deaths = headers.get("x-death") or []
    return sum(
        int(death.get("count", 1))
        for death in deaths
        if isinstance(death, Mapping) and topology.is_level_queue(str(death.get("queue", "")))
    )


async def produce(
    url: str,
    subject: Subject,
    prefix: str,
    queue: str,
    rate: float,
    seconds: float,
    min_delay: float = MIN_DELAY,
    max_delay: float = MAX_DELAY,
    linger: float = 0.0,
) -> dict[str, Any]:
    """The producer process: publish at ``rate`` for ``seconds``; report hops and CPU.

    ``linger``: seconds to keep the connection open after the last publish. The
    broker drops the statistics a channel has not yet emitted when it closes, so
    the management API's per-exchange counts need a few stats intervals of it.
    """
    topology = subject.topology(prefix)
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    if subject.delayed:
        # A service declares the chain once per connection, at start-up: outside the
        # measured stream (its cost is per connection, not per message).
        await declare_topology(channel, topology)
    print("ready", flush=True)
    rng = random.Random(7)
    hops: list[int] = []
    pending: set[asyncio.Task[Any]] = set()
    async for i in precision.paced(rate, int(rate * seconds)):
        if subject.delayed:
            now = datetime.now(UTC)
            due_at = now + timedelta(seconds=rng.uniform(min_delay, max_delay))
            hops.append(chain_units(topology, due_at, now=now, hold=subject.hold).bit_count())
            message = aio_pika.Message(
                b"x" * 200,
                message_id=str(i),
                headers={DUE_HEADER: int(due_at.timestamp() * 1e6)},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            publish = publish_delayed(
                channel,
                message,
                queue=queue,
                delay=due_at,
                topology=topology,
                hold=subject.hold,
                now=now,
            )
        else:
            message = aio_pika.Message(
                b"x" * 200,
                message_id=str(i),
                headers={DUE_HEADER: int(time.time() * 1e6)},
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            publish = channel.default_exchange.publish(message, routing_key=queue)
        task = asyncio.create_task(publish)
        pending.add(task)
        task.add_done_callback(pending.discard)
    await asyncio.gather(*pending)
    await asyncio.sleep(linger)
    await connection.close()
    return {
        "hops_per_message": sum(hops) / max(len(hops), 1),
        "cpu_seconds": _own_cpu(),
        "sent": int(rate * seconds),
        "library": delayed_retry.__file__,
    }


async def _profile_broker(node: RabbitMQNode, seconds: float, out: Path) -> None:
    expression = (
        "eprof:start(), eprof:start_profiling(processes()), "
        f"timer:sleep({int(seconds * 1000)}), eprof:stop_profiling(), "
        f'eprof:log("{out}"), eprof:analyze(total, [{{sort, time}}]), eprof:stop().'
    )
    await asyncio.to_thread(node.rabbitmqctl, "eval", expression, timeout=seconds + 120)


def read_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """The top functions of an eprof ``total`` analysis and the topic routing's share."""
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and ":" in parts[0] and "/" in parts[0]:
            try:
                rows.append((parts[0], float(parts[2])))
            except ValueError:
                continue
    rows.sort(key=lambda row: -row[1])
    topic = sum(share for name, share in rows if TOPIC_ROUTING.match(name))
    return {"topic_routing_percent": round(topic, 1), "top": rows[:top]}


Probe = Callable[[], Awaitable[dict[str, float]]]
"""Reads broker-side counters (for the chain of one subject) before and after its stream."""


async def measure(
    node: RabbitMQNode,
    key: str,
    *,
    rate: float,
    seconds: float,
    side_rate: float,
    eprof: float = 0.0,
    min_delay: float = MIN_DELAY,
    max_delay: float = MAX_DELAY,
    idle: float = 0.0,
    grace: float = 300.0,
    probe: Callable[[DelayTopology], Probe] | None = None,
    linger: float = 0.0,
) -> dict[str, Any]:
    """One subject's stream, measured; see the module's docstring for the row's fields.

    ``idle``: seconds of broker CPU read before the stream, with nothing sent
    (``broker_idle_cores``), so a reader can take the broker's own background
    work out. ``grace``: how long past the last due time to wait for messages
    that have not arrived (they count as ``missing``). ``probe(topology)`` makes
    a reader of broker counters, read before and after the stream
    (``counters``: the differences). ``linger``: see :func:`produce`.
    """
    subject = SUBJECTS[key]
    prefix = f"bench-limit-{uuid.uuid4().hex[:6]}"
    topology = subject.topology(prefix)
    connection = await aio_pika.connect(node.url)
    channel = await connection.channel()
    # Held messages are unacked deliveries: room for everything held at this rate.
    await channel.set_qos(prefetch_count=2000)
    if subject.delayed:
        await declare_topology(channel, topology)
    name = f"{prefix}.work"
    arguments: dict[str, Any] = {"x-queue-type": "quorum"} if subject.work_queue == "quorum" else {}
    queue = await channel.declare_queue(name, durable=True, arguments=arguments)
    late: list[float] = []
    hops_seen: list[int] = []
    seen: dict[str, int] = {}
    total = int(rate * seconds)
    done = asyncio.Event()

    def record(message: AbstractIncomingMessage) -> None:
        message_id = message.message_id or ""
        seen[message_id] = seen.get(message_id, 0) + 1
        if seen[message_id] > 1:
            return  # a duplicate: counted, its lateness not
        late.append((time.time() * 1e6 - int(message.headers[DUE_HEADER])) / 1000)  # type: ignore[arg-type]
        if subject.delayed:
            hops_seen.append(level_hops(topology, message.headers))
        if len(seen) == total:
            done.set()

    held_now: Callable[[], int] | None = None
    if subject.delayed:

        async def handler(message: AbstractIncomingMessage) -> None:
            record(message)

        retrying = with_delayed_retry(topology=topology, hold=subject.hold)(handler)
        held = getattr(getattr(retrying, "options", None), "held", None)
        if subject.hold is not None and held is not None:
            held_now = held.__len__
        tag = await consume(queue, retrying)
    else:

        async def plain(message: AbstractIncomingMessage) -> None:
            record(message)
            await message.ack()

        tag = await queue.consume(plain)

    peak_held = 0

    async def sample_held() -> None:
        nonlocal peak_held
        assert held_now is not None
        while True:
            peak_held = max(peak_held, held_now())
            await asyncio.sleep(0.005)

    beam = node.beam_pid
    assert beam is not None
    idle_cores = None
    if idle > 0:
        before, began = broker_cpu_seconds(beam), time.monotonic()
        await asyncio.sleep(idle)
        idle_cores = (broker_cpu_seconds(beam) - before) / (time.monotonic() - began)
    read_counters = probe(topology) if probe is not None else None
    counters0 = await read_counters() if read_counters is not None else {}
    rss0 = _status_kb("VmRSS")
    rss_reset = _reset_peak_rss()
    sampler = asyncio.create_task(sample_held()) if held_now is not None else None
    profile: dict[str, Any] | None = None
    async with precision.SideLoad(connection, side_rate):
        producer = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--produce",
            json.dumps(
                {
                    "url": node.url,
                    "subject": key,
                    "prefix": prefix,
                    "queue": name,
                    "rate": rate,
                    "seconds": seconds,
                    "min_delay": min_delay,
                    "max_delay": max_delay,
                    "linger": linger,
                }
            ),
            stdout=asyncio.subprocess.PIPE,
        )
        assert producer.stdout is not None
        # The producer has connected and declared the chain: the stream starts now.
        ready = await producer.stdout.readline()
        if ready.strip() != b"ready":
            raise RuntimeError(f"the producer did not start: {ready!r}")
        broker0, own0, began = broker_cpu_seconds(beam), _own_cpu(), time.monotonic()
        if eprof > 0 and subject.delayed:
            await asyncio.sleep(min(seconds / 3, 2.0))
            with tempfile.TemporaryDirectory() as folder:
                out = Path(folder) / "eprof.txt"
                await _profile_broker(node, eprof, out)
                profile = read_profile(out)
        stdout, _ = await producer.communicate()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), timeout=max_delay + grace)
        # Room for a late duplicate, and for the last acks to reach the broker.
        await asyncio.sleep(0.5)
    elapsed = time.monotonic() - began
    broker, own = broker_cpu_seconds(beam) - broker0, _own_cpu() - own0
    if sampler is not None:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    rss_peak = _status_kb("VmHWM") if rss_reset else None
    produced = json.loads(stdout)
    if produced["library"] != delayed_retry.__file__:
        raise RuntimeError(
            f"the producer imported {produced['library']}, the consumer "
            f"{delayed_retry.__file__}: set PYTHONPATH for both"
        )
    await queue.cancel(tag)
    counters: dict[str, float] = {}
    if read_counters is not None:
        counters1 = await read_counters()
        counters = {k: counters1[k] - counters0.get(k, 0.0) for k in counters1}
    await channel.queue_delete(name)
    await channel.queue_delete(f"{name}.parking")
    if subject.delayed:
        await delete_topology(channel, topology)
    await connection.close()
    row: dict[str, Any] = {
        "subject": subject.name,
        "key": key,
        "rate": rate,
        "lateness_ms": precision._percentiles(late),
        "hops_per_message": round(produced["hops_per_message"], 2),
        "cores": {
            "broker": round(broker / elapsed, 2),
            "consumer": round(own / elapsed, 2),
            "producer": round(produced["cpu_seconds"] / elapsed, 2),
        },
        "cpu_seconds": {
            "broker": round(broker, 4),
            "consumer": round(own, 4),
            "producer": round(produced["cpu_seconds"], 4),
        },
        "broker_idle_cores": None if idle_cores is None else round(idle_cores, 4),
        "sent": produced["sent"],
        "received": len(seen),
        "duplicates": sum(count - 1 for count in seen.values()),
        "missing": produced["sent"] - len(seen),
        "hops_seen_per_message": round(sum(hops_seen) / len(hops_seen), 3) if hops_seen else None,
        "peak_held": peak_held if held_now is not None else None,
        "rss_mb": {
            "start": None if rss0 is None else round(rss0 / 1024, 1),
            "peak": None if rss_peak is None else round(rss_peak / 1024, 1),
        },
        "counters": counters,
        "seconds": round(elapsed, 1),
    }
    if profile is not None:
        row["broker_profile"] = profile
    return row


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    profiled = False
    with RabbitMQNode() as node:
        for key in ["baseline", *args.subjects]:
            eprof = args.eprof if SUBJECTS[key].delayed and not profiled else 0.0
            profiled = profiled or eprof > 0
            row = await measure(
                node,
                key,
                rate=args.rate,
                seconds=args.seconds,
                side_rate=args.side_rate,
                eprof=eprof,
            )
            print(_line(row), flush=True)
            if "broker_profile" in row:
                profile = row["broker_profile"]
                print(
                    f"  broker profile: topic routing {profile['topic_routing_percent']} % of time"
                )
                for name, share in profile["top"]:
                    print(f"    {share:6.2f} %  {name}")
            rows.append(row)
    base = rows[0]["lateness_ms"]["p99"]
    for row in rows:
        row["ratio_p99_to_baseline"] = round(row["lateness_ms"]["p99"] / base, 1) if base else None
    return rows


def _line(row: dict[str, Any]) -> str:
    late, cores = row["lateness_ms"], row["cores"]
    return (
        f"{row['subject']:<42} late ms p50 {late['p50']:>8g} p99 {late['p99']:>8g} "
        f"earliest {late['min']:g}; hops/msg {row['hops_per_message']:g}; cores: broker "
        f"{cores['broker']:g}, consumer {cores['consumer']:g}, producer {cores['producer']:g}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker-limit")
    group.add_argument("--limit-rate", type=float, default=1000.0, help="messages/s per stream")
    group.add_argument("--limit-seconds", type=float, help="s per stream (5; --quick: 3)")
    group.add_argument(
        "--limit-subjects",
        nargs="+",
        choices=[k for k in SUBJECTS if k != "baseline"],
        default=["held", "unheld", "classic"],
    )
    group.add_argument("--limit-eprof", type=float, default=0.0, help="profile the broker, s")


async def broker_limit(suite: Suite) -> list[Row]:
    """The ``broker-limit`` workload: each subject's p99 lateness and cores, a node of its own."""
    args = suite.args
    seconds = args.limit_seconds or (3.0 if suite.quick else 5.0)
    print(f"broker-limit: {seconds} s at {args.limit_rate} msg/s per subject ...")
    limits = argparse.Namespace(
        rate=args.limit_rate,
        seconds=seconds,
        side_rate=args.side_rate,
        subjects=args.limit_subjects,
        eprof=args.limit_eprof,
    )
    rows = await run(limits)
    base = rows[0]
    return [
        {
            **row,
            "workload": f"broker limit {args.limit_rate:g}/s",
            "unit": "ms late (p99)",
            "value": row["lateness_ms"]["p99"],
            "baseline": base["subject"],
            "baseline_value": base["lateness_ms"]["p99"],
            "ratio": row["ratio_p99_to_baseline"],
            "note": "cores: broker {broker:g}, consumer {consumer:g}, producer {producer:g}".format(
                **row["cores"]
            ),
        }
        for row in rows[1:]
    ]


def main(argv: list[str] | None = None) -> None:
    """The producer process :func:`measure` starts (``--produce SPEC``, a JSON object)."""
    parser = argparse.ArgumentParser(description="broker-limit's producer process")
    parser.add_argument("--produce", required=True)
    args = parser.parse_args(argv)
    spec = json.loads(args.produce)
    result = asyncio.run(
        produce(
            spec["url"],
            SUBJECTS[spec["subject"]],
            spec["prefix"],
            spec["queue"],
            spec["rate"],
            spec["seconds"],
            spec.get("min_delay", MIN_DELAY),
            spec.get("max_delay", MAX_DELAY),
            spec.get("linger", 0.0),
        )
    )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
