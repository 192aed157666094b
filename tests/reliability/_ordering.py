"""The order scenario: 2,000 messages over 100 keys, 10 % failing twice, two consumer
processes; one fault once half are published and two fifths handled (a kill -9 of a
consumer, or a broker restart), then the other half published."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path

import aio_pika

from delayed_retry import DelayTopology, declare_ordered_queues, publish_ordered
from delayed_retry.consumer.order_partition import order_queue_name
from delayed_retry.delivery.ordered import ordered_queue_names
from tests.support.queues import delete_all
from tests.support.waiting import wait_until

from .test_crash import Child

CHILD = Path(__file__).with_name("ordered_consumer.py")
KEYS = 100
PER_KEY = 20
PARTITIONS = 4


def handlings(files: list[Path]) -> dict[str, list[int]]:
    """Each key's successful handlings in the order they happened, from every process."""
    lines: list[tuple[int, str, int]] = []
    for file in files:
        if file.exists():
            for line in file.read_text().splitlines():
                at, _pid, name, seq = line.split()
                lines.append((int(at), name, int(seq)))
    by_key: dict[str, list[int]] = defaultdict(list)
    for _at, key, n in sorted(lines):
        by_key[key].append(n)
    return by_key


def out_of_order(by_key: dict[str, list[int]]) -> dict[str, list[int]]:
    """The keys whose handlings went back in publish order. A repeat of the last one is
    allowed (a consumer killed between its handling and its ack: at-least-once)."""
    return {key: ns for key, ns in by_key.items() if any(b < a for a, b in itertools.pairwise(ns))}


def missing(by_key: dict[str, list[int]]) -> int:
    return sum(len(set(range(PER_KEY)) - set(by_key.get(f"k{k}", []))) for k in range(KEYS))


async def run_order_scenario(
    url: str,
    unique: str,
    tmp_path: Path,
    *,
    mode: str,
    fault: Callable[[list[Child]], Awaitable[None]] | None,
) -> dict[str, list[int]]:
    """Run the scenario; each key's handlings. ``fault`` runs once half are handled."""
    queue = f"{unique}.work"
    topology = DelayTopology(prefix=unique, levels=12)
    files = [tmp_path / f"handled-{i}.txt" for i in range(2)]
    children = [
        Child(
            [url, queue, str(PARTITIONS), unique, str(f), mode],
            tmp_path / f"child-{i}.log",
            script=CHILD,
        )
        for i, f in enumerate(files)
    ]
    connection = await aio_pika.connect_robust(url)
    names = ordered_queue_names(queue, PARTITIONS)
    try:
        channel = await connection.channel()
        await declare_ordered_queues(channel, queue, partitions=PARTITIONS)
        for child in children:
            child.start()
        total = KEYS * PER_KEY

        for n in range(PER_KEY):
            if n == PER_KEY // 2:  # half published: the fault comes while they are handled
                await wait_until(
                    lambda: sum(map(len, handlings(files).values())) >= total * 2 // 5,
                    timeout=120,
                    what="two fifths of the messages handled",
                )
                if fault is not None:
                    await fault(children)
                await asyncio.wait_for(connection.connected.wait(), 120)
                channel = await connection.channel()
            for k in range(KEYS):
                body = json.dumps({"key": f"k{k}", "n": n}).encode()
                await publish_ordered(
                    channel,
                    aio_pika.Message(body, delivery_mode=2),
                    queue=queue,
                    key=f"k{k}",
                    partitions=PARTITIONS,
                )
        await wait_until(
            lambda: missing(handlings(files)) == 0,
            timeout=240,
            what="every message handled",
        )
        return handlings(files)
    finally:
        for child in children:
            child.kill()
        await delete_all(
            await connection.channel(),
            queues=[
                *names,
                *(order_queue_name(name) for name in names),
                *(f"{name}.dead-letter" for name in names),
                *(topology.default_parking_queue(name) for name in names),
            ],
            topology=topology,
        )
        await connection.close()
