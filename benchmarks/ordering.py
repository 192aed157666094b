"""Order per key: what ``ordered_by=`` costs, beside the same consumer without it.

Each subject consumes the same persistent 200-byte messages, spread over 50 keys, from
a fresh single-active-consumer quorum queue (``declare_ordered_queues``), prefetch 100.
Measured: CPU microseconds per message of the client process and of the broker's Erlang
VM (the ratio), and messages per second. Subject and baseline are measured interleaved,
a new order each round, and the medians kept.

* ``ordered-success``: every message succeeds. With ``ordered_by`` each delivery takes
  its key's lock and looks its key up: no record is written.
* ``ordered-retry``: one message in ten of each key fails once (retried after 50 ms). With
  ``ordered_by`` its key writes a block record, the key's later messages are deferred
  to the order queue and run once it is back; without, they run at once.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from typing import Any

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage
from throughput import (
    BODY,
    PREFETCH,
    Pair,
    Sample,
    broker_cpu_seconds,
    delete_topology,
    pair_row,
)
from workloads import Row, Suite

from delayed_retry import (
    DelayTopology,
    NoInstrumentation,
    consume,
    declare_ordered_queues,
    declare_topology,
    with_delayed_retry,
)
from delayed_retry.consumer.order_partition import order_queue_name

KEYS = 50


def key_of(message: AbstractIncomingMessage) -> str:
    return str(message.headers["key"])


async def measure(
    connection: aio_pika.abc.AbstractConnection,
    topology: DelayTopology,
    n: int,
    *,
    ordered: bool,
    failing: bool,
    broker_pid: int | None,
) -> Sample:
    """Rate and CPU cost of one subject on a fresh ordered queue of ``n`` messages."""
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=PREFETCH)
    name = f"bench-{uuid.uuid4().hex[:8]}"
    [queue] = await declare_ordered_queues(channel, name)
    await declare_topology(channel, topology, queues=[name])
    for i in range(n):
        message = aio_pika.Message(
            BODY, message_id=str(i), headers={"key": f"k{i % KEYS}", "n": i}, delivery_mode=2
        )
        await channel.default_exchange.publish(message, routing_key=name)
    done = asyncio.Event()
    seen: set[str | None] = set()
    handled: set[int] = set()

    async def handler(message: AbstractIncomingMessage) -> None:
        i = int(message.headers["n"])  # one in ten of each key's messages fails once
        if failing and (i // KEYS) % 10 == 3 and message.message_id not in seen:
            seen.add(message.message_id)
            raise RuntimeError("fails once")
        handled.add(i)
        if len(handled) == n:
            done.set()

    options: dict[str, Any] = {
        "topology": topology,
        "hold": None,
        "instrumentation": NoInstrumentation(),
        "wait": tenacity.wait_fixed(0.05),
    }
    if ordered:
        options["ordered_by"] = key_of
    start, cpu, broker = time.perf_counter(), time.process_time(), broker_cpu_seconds(broker_pid)
    tag = await consume(queue, with_delayed_retry(**options)(handler))
    try:
        await asyncio.wait_for(done.wait(), timeout=120)
    except TimeoutError:
        missing = sorted(set(range(n)) - handled)
        raise RuntimeError(
            f"{len(missing)} of {n} messages not handled in 120 s (ordered={ordered}, "
            f"failing={failing}), first {missing[:10]} on queue {name!r}"
        ) from None
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    broker = broker_cpu_seconds(broker_pid) - broker
    await queue.cancel(tag)
    for doomed in (
        name,
        order_queue_name(name),
        f"{name}.dead-letter",
        topology.default_parking_queue(name),
    ):
        await channel.queue_delete(doomed)
    await channel.close()
    return Sample(n / elapsed, cpu / n * 1e6, broker / n * 1e6 if broker_pid else 0.0)


async def ordering(suite: Suite) -> list[Row]:
    """The ``ordering`` workload: the rows ``ordered-success`` and ``ordered-retry``."""
    args = suite.args
    n, rounds = args.messages, args.rounds
    print(f"ordering: {n} messages x {rounds} rounds per subject ...")
    topology = DelayTopology(prefix=f"bench-{uuid.uuid4().hex[:6]}", levels=16)
    subjects = [(w, o) for w in ("ordered-success", "ordered-retry") for o in (True, False)]
    samples: dict[tuple[str, bool], list[Sample]] = {s: [] for s in subjects}
    connection = await aio_pika.connect(suite.url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        for round_ in range(rounds):
            order = list(subjects)
            random.Random(round_).shuffle(order)
            for workload, ordered in order:
                samples[(workload, ordered)].append(
                    await measure(
                        connection,
                        topology,
                        n,
                        ordered=ordered,
                        failing=workload == "ordered-retry",
                        broker_pid=suite.broker_pid,
                    )
                )
        await delete_topology(channel, topology)
    rows: list[Row] = []
    for workload in ("ordered-success", "ordered-retry"):
        pair = Pair(workload, "delayed-retry, ordered_by", "delayed-retry")
        rows.append(pair_row(pair, samples[(workload, True)], samples[(workload, False)]))
    return rows
