"""Parking queues on disk: does one long-parked message keep the quorum log from shrinking?

A parking queue (``<queue>.parking``, a quorum queue) may hold a message for
weeks while other messages are parked and replayed through it. RabbitMQ
before 4.3 truncates a quorum queue's log only up to its oldest message, so
that one message would keep on disk everything written since. This run
measures it on a private node of one version (``--parking-version``):

1. Baseline: a parking queue declared exactly as the library does
   (``DelayTopology().parking_queue_spec``), then ``--parking-rounds`` rounds, each
   parking ``messages / rounds`` 1 KB messages (persistent, confirmed,
   on a batched connection) and replaying them (consumed and acked). The
   queue is empty after each round.
2. Held: the same on a second parking queue that first gets one message
   parked 30 days ago. Each round's replay takes it like the library's
   replay does (unacked, not selected) and gives it back when its channel
   closes, so it is READY between rounds, at the head of the queue and of
   its log, for the whole phase.
3. Refresh: :func:`refresh_parked` with
   ``older_than`` 7 days moves the old message to the tail; then one more
   round of traffic, for the broker to take its next snapshot.

After every round (and before the first) the run waits until the sizes stop
changing (at most 20 s) and reads the queue's own Raft
folder (segments and snapshots), the quorum write-ahead log files, and the
node's whole data folder (allocated blocks, as ``du``). The WAL is made
small (16 MB) so that it rolls over many times in a short
run, as a default node's 512 MB WAL does over weeks of traffic: entries
leave the WAL for the queue's segment files only at a roll-over, and only
segments are kept or truncated.

Writes ``benchmarks/results/parking_disk-<version>-<time>.json`` and prints a
table; growth is per 100,000 messages parked and replayed, and the held
phase's is given as a ratio to the baseline's.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import timedelta
from typing import Any

import aiormq
import aiormq.abc
from capacity import _pipelined, body, disk_bytes
from pamqp import commands as spec
from workloads import Row, Suite

from delayed_retry.amqp.batching import connect_batched
from delayed_retry.amqp.publish import publish_confirmed
from delayed_retry.chain.topology import DelayTopology, amqp_arguments
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.headers import X_PARKED_AT, X_PARKED_REASON
from delayed_retry.parking.refresh import refresh_parked
from harness import RabbitMQNode

OLD_ID = "parked-long-ago"
WINDOW = 1000
PREFETCH = 1000


def wal_setting(version: str | None) -> str:
    """The ``rabbitmq.conf`` key that sizes the quorum queues' WAL on ``version``.

    4.3 reads ``quorum_queue.wal_max_size_bytes`` for the quorum queues' Ra
    system (``raft.*`` no longer reaches it); 3.10 and 4.0 know only ``raft.*``.
    """
    return "quorum_queue.wal_max_size_bytes" if version == "4.3" else "raft.wal_max_size_bytes"


class Disk:
    """Sizes of one node's quorum data: per queue folder, WAL files, the whole data folder."""

    def __init__(self, node: RabbitMQNode) -> None:
        self.data = node.base_dir / "mnesia"
        self.quorum = self.data / node.name / "quorum" / node.name

    def folders(self) -> set[str]:
        return {p.name for p in self.quorum.iterdir() if p.is_dir()}

    def wal(self) -> int:
        return sum(p.stat().st_blocks * 512 for p in self.quorum.glob("*.wal"))

    def read(self, folder: str) -> dict[str, int]:
        queue_dir = self.quorum / folder
        segments = list(queue_dir.rglob("*.segment"))
        return {
            "queue_dir": disk_bytes(queue_dir) or 0,
            "segments": len(segments),
            "wal": self.wal(),
            "data_dir": disk_bytes(self.data) or 0,
        }

    async def settled(self, folder: str, *, limit: float) -> dict[str, int]:
        """The sizes once two reads a second apart agree (or after ``limit`` seconds)."""
        deadline = time.monotonic() + limit
        last = self.read(folder)
        while time.monotonic() < deadline:
            await asyncio.sleep(1.0)
            now = self.read(folder)
            if now["queue_dir"] == last["queue_dir"] and now["wal"] == last["wal"]:
                return now
            last = now
        return last


def parked_properties(message_id: str, *, age: timedelta) -> spec.Basic.Properties:
    """Properties of a parking record parked ``age`` ago (what refresh selects by)."""
    return spec.Basic.Properties(
        delivery_mode=2,
        message_id=message_id,
        headers={X_PARKED_REASON: "max-retries", X_PARKED_AT: to_epoch_ms(utcnow() - age)},
    )


async def park(channel: aiormq.abc.AbstractChannel, parking: str, first: int, count: int) -> None:
    """Park ``count`` fresh messages (ids ``first``…), confirmed, many frames per write."""

    async def one(i: int) -> None:
        await publish_confirmed(
            channel,
            exchange="",
            routing_key=parking,
            body=body(first + i),
            properties=parked_properties(str(first + i), age=timedelta(0)),
            wait_for_write=False,
        )

    await _pipelined(count, WINDOW, one)


async def replay(
    connection: aiormq.abc.AbstractConnection, parking: str, first: int, count: int
) -> tuple[bool, int]:
    """Consume and ack the parked messages ``first``…; the old one is held and given back.

    Returns whether the old message was seen (it must be, in the held phase)
    and how many messages of earlier rounds came again: a consumer's acks
    sent just before its channel closes are not always applied (seen on
    3.10, 4.0 and 4.3), so a message may return after it was acked. Those are
    acked again here.
    """
    channel = await connection.channel()
    await channel.basic_qos(prefetch_count=PREFETCH)
    done = asyncio.Event()
    pending = {str(i) for i in range(first, first + count)}
    saw_old = False
    again = 0

    async def on_message(message: aiormq.abc.DeliveredMessage) -> None:
        # Runs to its end without yielding (the ack is queued, not awaited), so nothing
        # is acked once the round is done and its channel is closing.
        nonlocal saw_old, again
        if done.is_set():
            return  # given back when the channel closes
        message_id = message.header.properties.message_id
        if message_id == OLD_ID:
            saw_old = True  # not selected: stays unacked until the channel closes
            return
        # One by one: a multiple ack would take the held old message with it.
        await channel.basic_ack(message.delivery_tag or 0, wait=False)
        if message_id in pending:
            pending.discard(message_id)
            if not pending:
                done.set()
        else:
            again += 1

    await channel.basic_consume(parking, on_message)
    await asyncio.wait_for(done.wait(), timeout=600)
    await channel.close()
    return saw_old, again


async def phase(
    *,
    name: str,
    url: str,
    node: RabbitMQNode,
    disk: Disk,
    messages: int,
    rounds: int,
    settle: float,
    held: bool,
    refresh: bool,
) -> dict[str, Any]:
    """One parking queue's run: rounds of park and replay, with or without an old message."""
    topology = DelayTopology()
    work_queue = f"bench-disk-{name}"
    qspec = topology.parking_queue_spec(work_queue)
    connection = await connect_batched(url, timeout=60)
    try:
        before = disk.folders()
        setup = await connection.channel(publisher_confirms=True)
        arguments: dict[str, Any] = dict(amqp_arguments(qspec.arguments))
        await setup.queue_declare(qspec.name, durable=True, arguments=arguments)
        folder = next(iter(disk.folders() - before))
        if held:
            await publish_confirmed(
                setup,
                exchange="",
                routing_key=qspec.name,
                body=body(-1),
                properties=parked_properties(OLD_ID, age=timedelta(days=30)),
            )
        samples: list[dict[str, Any]] = []
        samples.append({"after": 0, **await disk.settled(folder, limit=settle)})
        per_round = messages // rounds
        began = time.monotonic()
        for r in range(rounds):
            await park(setup, qspec.name, r * per_round, per_round)
            saw_old, again = await replay(connection, qspec.name, r * per_round, per_round)
            if saw_old != held:
                raise RuntimeError(f"{name}: the old message was {'not ' * held}seen in round {r}")
            sample = {
                "after": (r + 1) * per_round,
                "acked_again": again,
                **await disk.settled(folder, limit=settle),
            }
            samples.append(sample)
            print(
                f"  {name:9} {sample['after']:>8,}  queue dir {sample['queue_dir'] / 1e6:7.1f} MB"
                f" ({sample['segments']} segments)  WAL {sample['wal'] / 1e6:6.1f} MB"
                f"  data dir {sample['data_dir'] / 1e6:7.1f} MB"
                + (f"  ({again} acked again)" if again else ""),
                flush=True,
            )
        seconds = time.monotonic() - began
        result: dict[str, Any] = {
            "queue": qspec.name,
            "arguments": amqp_arguments(qspec.arguments),
            "held_old_message": held,
            "seconds": round(seconds, 1),
            "samples": samples,
        }
        if refresh:
            report = await refresh_parked(setup, queue=work_queue, older_than=timedelta(days=7))
            result["refresh"] = {"refreshed": report.done, "looked_at": report.scanned}
            result["after_refresh"] = await disk.settled(folder, limit=settle)
            await park(setup, qspec.name, rounds * per_round, per_round)
            await replay(connection, qspec.name, rounds * per_round, per_round)
            result["after_refresh_and_a_round"] = await disk.settled(folder, limit=settle)
            for label in ("after_refresh", "after_refresh_and_a_round"):
                s = result[label]
                print(
                    f"  {label:26} queue dir {s['queue_dir'] / 1e6:7.1f} MB"
                    f" ({s['segments']} segments)  data dir {s['data_dir'] / 1e6:7.1f} MB",
                    flush=True,
                )
        left: list[str | None] = []
        while (got := await setup.basic_get(qspec.name, no_ack=False)).delivery_tag is not None:
            left.append(got.header.properties.message_id)
        if held and OLD_ID not in left:
            raise RuntimeError(f"{name}: the old message is gone (left: {left[:10]})")
        result["left_at_end"] = left
        await setup.close()  # gives them back
        return result
    finally:
        await connection.close()


def growth(result: dict[str, Any], key: str) -> float:
    """Bytes of ``key`` per 100,000 messages: the least-squares slope over all samples.

    A slope, not last minus first: segment files come and go in steps of
    megabytes, so two samples alone can show a bounded size as growth.
    """
    points = [(float(s["after"]), float(s[key])) for s in result["samples"]]
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return slope * 100_000


def peak(result: dict[str, Any], key: str) -> int:
    return max(int(s[key]) for s in result["samples"])


def ratio(held: float, base: float) -> float | None:
    """``held / base``; ``None`` when the baseline did not grow at all."""
    return None if base <= 0 else held / base


async def run(args: argparse.Namespace) -> dict[str, Any]:
    version = None if args.version == "3.10" else args.version
    config = {wal_setting(version): str(args.wal_bytes)} if args.wal_bytes else {}
    node = RabbitMQNode(version=version, config=config)
    await asyncio.to_thread(node.start)
    try:
        ra = node.rabbitmqctl(
            "eval", "maps:get(wal_max_size_bytes, ra_system:fetch(quorum_queues))."
        )
        wal_max = int(ra.strip())
        if args.wal_bytes and wal_max != args.wal_bytes:
            raise RuntimeError(f"the node's WAL limit is {wal_max}, not {args.wal_bytes}")
        server = node.rabbitmqctl("eval", "rabbit_misc:version().").strip().strip('"')
        print(
            f"parking_disk: RabbitMQ {server}, {args.messages:,} messages in {args.rounds} "
            f"rounds, WAL limit {wal_max / 1e6:.0f} MB",
            flush=True,
        )
        disk = Disk(node)
        common = dict(
            url=node.url,
            node=node,
            disk=disk,
            messages=args.messages,
            rounds=args.rounds,
            settle=args.settle,
        )
        baseline = await phase(name="baseline", held=False, refresh=False, **common)
        held = await phase(name="held", held=True, refresh=not args.no_refresh, **common)
    finally:
        await asyncio.to_thread(node.close)
    for result in (baseline, held):
        for sample in result["samples"]:
            sample["data_dir_without_wal"] = sample["data_dir"] - sample["wal"]
    summary = {}
    # The WAL is shared and saw-toothed (filled, rolled over, deleted): left out of the
    # growth, where it would be noise of up to its limit.
    for key in ("queue_dir", "data_dir_without_wal"):
        b, h = growth(baseline, key), growth(held, key)
        summary[key] = {
            "baseline_per_100k": round(b),
            "held_per_100k": round(h),
            "ratio": ratio(h, b),
            "baseline_peak": peak(baseline, key),
            "held_peak": peak(held, key),
        }
    return {
        "rabbitmq": server,
        "parameters": {
            "messages": args.messages,
            "rounds": args.rounds,
            "body_bytes": len(body(0)),
            "wal_max_size_bytes": wal_max,
            "settle_seconds": args.settle,
        },
        "baseline": baseline,
        "held": held,
        "growth": summary,
    }


def print_summary(out: dict[str, Any]) -> None:
    print(f"\nRabbitMQ {out['rabbitmq']}: growth per 100,000 messages parked and replayed")
    print(f"{'':22}{'baseline':>12}{'held':>12}{'ratio':>10}{'peak: baseline':>18}{'held':>10}")
    for key, g in out["growth"].items():
        r = "-" if g["ratio"] is None else f"{g['ratio']:,.1f}x"
        print(
            f"{key:22}{g['baseline_per_100k'] / 1e6:>9.1f} MB{g['held_per_100k'] / 1e6:>9.1f} MB"
            f"{r:>10}{g['baseline_peak'] / 1e6:>15.1f} MB{g['held_peak'] / 1e6:>7.1f} MB"
        )
    held = out["held"]
    if "after_refresh" in held:
        end = held["samples"][-1]["queue_dir"]
        print(
            f"held queue dir: {end / 1e6:.1f} MB at the end, "
            f"{held['after_refresh']['queue_dir'] / 1e6:.1f} MB after refresh, "
            f"{held['after_refresh_and_a_round']['queue_dir'] / 1e6:.1f} MB after one more round"
        )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("parking-disk")
    group.add_argument("--parking-version", choices=("3.10", "4.0", "4.3"), default="3.10")
    group.add_argument("--parking-messages", type=int, help="parked and replayed (100,000)")
    group.add_argument("--parking-rounds", type=int, default=10)


async def parking_disk(suite: Suite) -> list[Row]:
    """The ``parking-disk`` workload: disk growth with one message parked for good, or none."""
    args = suite.args
    parked = argparse.Namespace(
        version=args.parking_version,
        messages=args.parking_messages or (20_000 if suite.quick else 100_000),
        rounds=args.parking_rounds,
        wal_bytes=16_000_000,
        settle=20.0,
        no_refresh=False,
    )
    out = await run(parked)
    print_summary(out)
    return [
        {
            "workload": f"parking disk, RabbitMQ {out['rabbitmq']}",
            "subject": f"{key}, one message parked throughout",
            "unit": "MB per 100k parked",
            "value": round(g["held_per_100k"] / 1e6, 1),
            "baseline": "nothing parked throughout",
            "baseline_value": round(g["baseline_per_100k"] / 1e6, 1),
            "ratio": g["ratio"],
            "growth": g,
        }
        for key, g in out["growth"].items()
    ]
