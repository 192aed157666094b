"""Where 1,000 delayed messages a second stop keeping up: the client or the broker.

``benchmarks/precision.py`` schedules and consumes in one process. This one
puts the producer (``publish_delayed`` at a fixed rate, delays uniform in
``[min_delay, max_delay]``) in a process of its own, as a real service would,
and measures, for each subject, the lateness the consumer sees and the CPU
each party used: the broker's Erlang VM, the consumer process and the
producer process, in cores. The baseline is the same stream with no delay to
a classic queue, in the same run. A subject is a chain (queue type, levels,
unit) and a hold; each gets a chain of its own on one private node.

``--eprof SECONDS`` profiles the broker (Erlang's ``eprof`` over every
process) for that long in the middle of the first delayed subject and prints
the functions that took the most time, and the share of the topic exchange's
routing (``rabbit_exchange_type_topic`` and the mnesia reads its trie makes).
eprof slows the broker down while it runs; read shares, not times.

Run: ``.venv/bin/python benchmarks/broker_limit.py --rate 1000 --seconds 5``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
import precision
from aio_pika.abc import AbstractIncomingMessage
from throughput import broker_cpu_seconds, delete_topology

from delayed_retry import (
    DEFAULT_HOLD,
    DelayTopology,
    Hold,
    consume,
    declare_topology,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.hold import chain_units
from delayed_retry.testing import RabbitMQNode

DUE_HEADER = "bench-due-us"
"""Due time (or publish time, for the baseline) in integer microseconds since the epoch.

An integer: pamqp sends a Python float as a 32-bit float, which cannot hold an epoch time."""

MIN_DELAY, MAX_DELAY = 0.5, 3.0
"""Seconds; each delayed message's delay is drawn uniformly from this range."""


@dataclass(frozen=True)
class Subject:
    """One stream: no delay (baseline), or a chain of ``levels`` x ``unit_ms`` with a hold."""

    name: str
    delayed: bool = True
    queue_type: str = "quorum"
    levels: int = 36
    unit_ms: int = 1
    hold: Hold | None = DEFAULT_HOLD

    def topology(self, prefix: str) -> DelayTopology:
        return DelayTopology(
            prefix=prefix,
            levels=self.levels,
            unit=timedelta(milliseconds=self.unit_ms),
            queue_type=self.queue_type,  # type: ignore[arg-type]
        )


SUBJECTS = {
    "baseline": Subject("plain publish→consume, classic queue", delayed=False),
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


async def produce(
    url: str, subject: Subject, prefix: str, queue: str, rate: float, seconds: float
) -> dict[str, float]:
    """The producer process: publish at ``rate`` for ``seconds``; report hops and CPU."""
    topology = subject.topology(prefix)
    connection = await aio_pika.connect(url)
    channel = await connection.channel()
    rng = random.Random(7)
    hops: list[int] = []
    pending: set[asyncio.Task[Any]] = set()
    async for i in precision.paced(rate, int(rate * seconds)):
        if subject.delayed:
            now = datetime.now(UTC)
            due_at = now + timedelta(seconds=rng.uniform(MIN_DELAY, MAX_DELAY))
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
    await connection.close()
    return {"hops_per_message": sum(hops) / max(len(hops), 1), "cpu_seconds": _own_cpu()}


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


async def measure(
    node: RabbitMQNode,
    key: str,
    *,
    rate: float,
    seconds: float,
    side_rate: float,
    eprof: float = 0.0,
) -> dict[str, Any]:
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
    queue = await channel.declare_queue(name, durable=True)
    late: list[float] = []
    total = int(rate * seconds)
    done = asyncio.Event()

    def record(message: AbstractIncomingMessage) -> None:
        late.append((time.time() * 1e6 - int(message.headers[DUE_HEADER])) / 1000)  # type: ignore[arg-type]
        if len(late) == total:
            done.set()

    if subject.delayed:

        async def handler(message: AbstractIncomingMessage) -> None:
            record(message)

        tag = await consume(
            queue, with_delayed_retry(topology=topology, hold=subject.hold)(handler)
        )
    else:

        async def plain(message: AbstractIncomingMessage) -> None:
            record(message)
            await message.ack()

        tag = await queue.consume(plain)

    beam = node.beam_pid
    assert beam is not None
    broker0, own0, began = broker_cpu_seconds(beam), _own_cpu(), time.monotonic()
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
                }
            ),
            stdout=asyncio.subprocess.PIPE,
        )
        if eprof > 0 and subject.delayed:
            await asyncio.sleep(min(seconds / 3, 2.0))
            with tempfile.TemporaryDirectory() as folder:
                out = Path(folder) / "eprof.txt"
                await _profile_broker(node, eprof, out)
                profile = read_profile(out)
        stdout, _ = await producer.communicate()
        await asyncio.wait_for(done.wait(), timeout=MAX_DELAY + 300)
    elapsed = time.monotonic() - began
    broker, own = broker_cpu_seconds(beam) - broker0, _own_cpu() - own0
    produced = json.loads(stdout)
    await queue.cancel(tag)
    await channel.queue_delete(name)
    await channel.queue_delete(f"{name}.parking")
    if subject.delayed:
        await delete_topology(channel, topology)
    await connection.close()
    row: dict[str, Any] = {
        "subject": subject.name,
        "lateness_ms": precision._percentiles(late),
        "hops_per_message": round(produced["hops_per_message"], 2),
        "cores": {
            "broker": round(broker / elapsed, 2),
            "consumer": round(own / elapsed, 2),
            "producer": round(produced["cpu_seconds"] / elapsed, 2),
        },
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--side-rate", type=float, default=100.0)
    parser.add_argument(
        "--subjects",
        nargs="+",
        choices=[k for k in SUBJECTS if k != "baseline"],
        default=["held", "unheld", "classic"],
    )
    parser.add_argument("--eprof", type=float, default=0.0, help="profile the broker this long")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    parser.add_argument("--produce", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.produce:
        spec = json.loads(args.produce)
        result = asyncio.run(
            produce(
                spec["url"],
                SUBJECTS[spec["subject"]],
                spec["prefix"],
                spec["queue"],
                spec["rate"],
                spec["seconds"],
            )
        )
        print(json.dumps(result), flush=True)
        return
    rows = asyncio.run(run(args))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
