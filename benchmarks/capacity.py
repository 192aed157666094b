"""Capacity: many delayed 1 KB messages waiting at once, broker memory and disk, the drain.

One run, on one broker (a private node unless ``--url``):

1. Baseline: ``--capacity-baseline`` persistent 1 KB messages published with
   confirms (same window) to a plain quorum queue; the broker's RSS and data
   directory before and after; then a plain aio-pika consumer (in a process
   of its own) drains them. The queue is deleted.
2. Fill: ``--capacity-messages`` messages scheduled with ``publish_delayed``
   (``--capacity-window`` in flight, each with its confirm) into a chain of
   its own. All but the last ``--capacity-drain`` wait ``2^hold_level``
   units (70 min by default: they stay for the whole run); the last ones wait
   ``2^drain_level`` units (262 s). A delay of exactly ``2^k`` units is one
   level: one TTL hop, so the chain does no other work meanwhile.
3. With everything waiting: the broker's RSS and data directory again.
4. Drain: once the short-delay messages have all reached their queue, a
   ``@with_delayed_retry`` consumer (in a process of its own, prefetch 100)
   handles them; its RSS is sampled every second.
5. The chain is deleted.

With ``--capacity-memory-policy`` the chain's operator policy
(:meth:`DelayTopology.memory_policy`, ``max-in-memory-length`` 0) is set on
the private node first. Rates are ratios to the baselines of the same run;
memory and disk are per waiting message.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import aio_pika
import throughput
from pamqp import commands as spec
from workloads import Row, Suite

from delayed_retry import DelayTopology, consume, declare_topology, publish_delayed
from delayed_retry.amqp.batching import connect_batched
from delayed_retry.amqp.publish import publish_confirmed
from delayed_retry.durations import utcnow
from delayed_retry.headers import scheduled_headers
from harness import RabbitMQNode

BODY_BYTES = 1024
BASELINE_QUEUE = "bench-capacity-baseline"


def body(i: int) -> bytes:
    """A 1 KB body that does not compress to nothing."""
    seed = f"{i:012d}".encode()
    return (seed * (BODY_BYTES // len(seed) + 1))[:BODY_BYTES]


def rss_bytes(pid: int | None) -> int | None:
    """VmRSS of ``pid`` from /proc, or ``None``."""
    if pid is None:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def beam_pid(node: RabbitMQNode | None) -> int | None:
    """The node's Erlang VM (``beam.smp``), found by its node name on the command line."""
    if node is None:
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if comm.startswith("beam") and node.name.encode() in cmdline:
            return int(entry.name)
    return node.beam_pid


def disk_bytes(folder: Path | None) -> int | None:
    """Bytes the files under ``folder`` occupy on disk (allocated blocks, as ``du``)."""
    if folder is None:
        return None
    total = 0
    for root, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total


@dataclass
class Broker:
    """What the benchmark reads of the broker besides AMQP."""

    url: str
    node: RabbitMQNode | None
    pid: int | None = field(init=False)

    def __post_init__(self) -> None:
        self.pid = beam_pid(self.node)

    def rss(self) -> int | None:
        return rss_bytes(self.pid)

    def disk(self) -> int | None:
        return disk_bytes(self.node.base_dir / "mnesia" if self.node is not None else None)


async def _pipelined(n: int, window: int, publish: Any) -> float:
    """Call ``publish(i)`` for i in 0..n-1 with up to ``window`` in flight; return the seconds.

    Publishes start in bursts of a quarter window, so that on a batched
    connection their frames leave in one write.
    """
    burst = max(1, window // 4)
    failures: list[BaseException] = []
    tasks: set[asyncio.Task[None]] = set()
    space = asyncio.Event()

    def done(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            failures.append(task.exception())  # type: ignore[arg-type]
        if len(tasks) <= window - burst:
            space.set()

    began = time.monotonic()
    i = 0
    while i < n:
        while len(tasks) > window - burst:
            space.clear()
            await space.wait()
        if failures:
            raise failures[0]
        for j in range(i, min(i + burst, n)):
            task = asyncio.create_task(publish(j))
            tasks.add(task)
            task.add_done_callback(done)
        i += burst
        await asyncio.sleep(0)
    while tasks:
        await asyncio.gather(*list(tasks), return_exceptions=True)
    if failures:
        raise failures[0]
    return time.monotonic() - began


async def _sample_rss(broker: Broker, into: list[tuple[float, int]], began: float) -> None:
    while True:
        value = broker.rss()
        if value is not None:
            into.append((round(time.monotonic() - began, 1), value))
        await asyncio.sleep(2.0)


async def _depth(channel: aio_pika.abc.AbstractChannel, name: str) -> int:
    queue = await channel.declare_queue(name, passive=True)
    count = queue.declaration_result.message_count
    return int(count or 0)


async def _consumer(
    *, url: str, queue: str, count: int, kind: str, topology: DelayTopology
) -> dict[str, Any]:
    """Run a consumer in a process of its own; return its rate and RSS samples."""
    command = [
        sys.executable,
        __file__,
        "consume",
        "--url",
        url,
        "--queue",
        queue,
        "--count",
        str(count),
        "--kind",
        kind,
        "--prefix",
        topology.prefix,
        "--levels",
        str(topology.levels),
        "--unit-ms",
        str(topology.unit_ms),
    ]
    proc = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    samples: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    async for raw in proc.stdout:
        line = json.loads(raw)
        if line.get("done"):
            final = line
        else:
            samples.append(line)
    code = await proc.wait()
    if code != 0 or not final:
        raise RuntimeError(f"the {kind} consumer exited with code {code}")
    return {**final, "samples": samples}


def _growth(samples: list[dict[str, Any]]) -> float:
    """RSS growth in MB from the sample after 10 % of the messages to the last one."""
    total = samples[-1]["handled"] if samples else 0
    start = next((s for s in samples if s["handled"] >= total * 0.1), None)
    if start is None or not samples:
        return 0.0
    return (samples[-1]["rss"] - start["rss"]) / 1e6


async def run(
    url: str,
    *,
    node: RabbitMQNode | None,
    messages: int,
    baseline_messages: int,
    drain: int,
    window: int = 1000,
    hold_level: int = 22,
    drain_level: int = 18,
    memory_policy: bool = False,
    batched: bool = True,
    topology: DelayTopology | None = None,
) -> list[dict[str, Any]]:
    """Fill, measure and drain; return the suite's result rows."""
    drain = min(drain, messages)
    topology = topology or DelayTopology(prefix=f"bench-capacity-{int(time.time())}")
    broker = Broker(url, node)
    policy = topology.memory_policy()
    if memory_policy:
        if node is None:
            raise SystemExit("--capacity-memory-policy needs a private node (no --url)")
        node.rabbitmqctl(*policy.rabbitmqctl_args())
    params = {
        "messages": messages,
        "baseline_messages": baseline_messages,
        "drain": drain,
        "window": window,
        "hold_level": hold_level,
        "drain_level": drain_level,
        "memory_policy": policy.command() if memory_policy else None,
        "publisher": "batched publish_confirmed" if batched else "publish_delayed / aio-pika",
        "body_bytes": BODY_BYTES,
    }
    print(f"capacity: {params}", flush=True)
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        rss_fresh, disk_fresh = broker.rss(), broker.disk()

        # 1. baseline: plain confirmed publish to a plain quorum queue, then a plain drain.
        await channel.declare_queue(
            BASELINE_QUEUE, durable=True, arguments={"x-queue-type": "quorum"}
        )

        bulk = await connect_batched(url, timeout=60)
        bulk_channel = await bulk.channel(publisher_confirms=True)

        async def plain(i: int) -> None:
            if batched:
                await publish_confirmed(
                    bulk_channel,
                    exchange="",
                    routing_key=BASELINE_QUEUE,
                    body=body(i),
                    properties=spec.Basic.Properties(delivery_mode=2, message_id=str(i)),
                    wait_for_write=False,
                )
                return
            message = aio_pika.Message(
                body(i), message_id=str(i), delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            )
            await channel.default_exchange.publish(message, routing_key=BASELINE_QUEUE)

        base_seconds = await _pipelined(baseline_messages, window, plain)
        rss_base, disk_base = broker.rss(), broker.disk()
        print(f"  baseline publish: {baseline_messages / base_seconds:.0f} msg/s", flush=True)
        plain_drain = await _consumer(
            url=url, queue=BASELINE_QUEUE, count=baseline_messages, kind="plain", topology=topology
        )
        print(f"  baseline drain: {plain_drain['rate']:.0f} msg/s", flush=True)
        await channel.queue_delete(BASELINE_QUEUE)

        # 2. fill the chain.
        destination = f"{topology.prefix}.destination"
        await channel.declare_queue(destination, durable=True, arguments={"x-queue-type": "quorum"})
        await declare_topology(channel, topology, queues=[destination])
        rss_before, disk_before = broker.rss(), broker.disk()
        hold = timedelta(milliseconds=(1 << hold_level) * topology.unit_ms)
        short = timedelta(milliseconds=(1 << drain_level) * topology.unit_ms)
        stay = messages - drain

        hold_route = topology.route(1 << hold_level, destination)
        short_route = topology.route(1 << drain_level, destination)

        async def delayed(i: int) -> None:
            if batched:
                # The bulk path (as the Spark publisher): route and due-time header computed
                # here, frames of many publishes in one write, each confirmed.
                wait = hold if i < stay else short
                headers = scheduled_headers(None, due_at=utcnow() + wait)
                route = hold_route if i < stay else short_route
                await publish_confirmed(
                    bulk_channel,
                    exchange=route.exchange,
                    routing_key=route.routing_key,
                    body=body(i),
                    properties=spec.Basic.Properties(
                        delivery_mode=2, message_id=str(i), headers=headers
                    ),
                    wait_for_write=False,
                )
                return
            message = aio_pika.Message(body(i), message_id=str(i))
            await publish_delayed(
                channel,
                message,
                queue=destination,
                delay=hold if i < stay else short,
                topology=topology,
            )

        rss_series: list[tuple[float, int]] = []
        began = time.monotonic()
        sampler = asyncio.create_task(_sample_rss(broker, rss_series, began))
        fill_seconds = await _pipelined(messages, window, delayed)
        # 3. everything waits now (unless the fill outlasted the short delay).
        rss_after, disk_after = broker.rss(), broker.disk()
        arrived = await _depth(channel, destination)
        waiting = {
            lvl: await _depth(channel, topology.level_name(lvl))
            for lvl in (hold_level, drain_level)
        }
        diagnostics = _diagnostics(node, topology, (hold_level, drain_level))
        print(
            f"  fill: {messages / fill_seconds:.0f} msg/s; waiting {waiting}, arrived {arrived}; "
            f"broker RSS {_mb(rss_before)} -> {_mb(rss_after)} MB, "
            f"disk {_mb(disk_before)} -> {_mb(disk_after)} MB",
            flush=True,
        )

        # 4. drain the short-delay ones once all are in the queue.
        deadline = time.monotonic() + short.total_seconds() + 600
        while (depth := await _depth(channel, destination)) < drain:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {depth} of {drain} messages arrived in {destination}")
            await asyncio.sleep(2.0)
        rss_full_queue = broker.rss()
        decorated_drain = await _consumer(
            url=url, queue=destination, count=drain, kind="decorated", topology=topology
        )
        sampler.cancel()
        rss_end = broker.rss()
        print(f"  decorated drain: {decorated_drain['rate']:.0f} msg/s", flush=True)
        await bulk.close()

        # 5. clean up.
        await channel.queue_delete(destination)
        await channel.queue_delete(topology.default_parking_queue(destination))
        await throughput.delete_topology(channel, topology)
        if memory_policy and node is not None:
            node.rabbitmqctl("clear_operator_policy", policy.name)

    def per(after: int | None, before: int | None, n: int) -> float | None:
        if after is None or before is None or not n:
            return None
        return round((after - before) / n, 1)

    chain_mem = per(rss_after, rss_before, messages)
    plain_mem = per(rss_base, rss_fresh, baseline_messages)
    chain_disk = per(disk_after, disk_before, messages)
    plain_disk = per(disk_base, disk_fresh, baseline_messages)
    detail = {
        "parameters": params,
        "broker_rss": {
            "fresh": rss_fresh,
            "after_baseline_publish": rss_base,
            "before_fill": rss_before,
            "after_fill": rss_after,
            "drain_queue_full": rss_full_queue,
            "end": rss_end,
            "series": rss_series,
        },
        "disk": {
            "fresh": disk_fresh,
            "after_baseline_publish": disk_base,
            "before_fill": disk_before,
            "after_fill": disk_after,
        },
        "waiting_after_fill": waiting,
        "diagnostics_after_fill": diagnostics,
        "arrived_during_fill": arrived,
        "fill_seconds": round(fill_seconds, 1),
        "baseline_publish_seconds": round(base_seconds, 1),
        "plain_drain": plain_drain,
        "decorated_drain": decorated_drain,
    }
    fill_rate = messages / fill_seconds
    base_rate = baseline_messages / base_seconds
    label = f"{messages:,} waiting" + (", memory policy" if memory_policy else "")
    rows: list[dict[str, Any]] = [
        {
            "workload": "capacity fill",
            "subject": f"{'batched' if batched else 'publish_delayed'}, {label}",
            "value": round(fill_rate),
            "unit": "msg/s",
            "baseline": "plain confirmed publish, quorum queue",
            "baseline_value": round(base_rate),
            "ratio": fill_rate / base_rate,
            **detail,
        },
        {
            "workload": "capacity broker memory",
            "subject": f"chain, {label}",
            "value": chain_mem if chain_mem is not None else float("nan"),
            "unit": "B/msg",
            "baseline": "plain quorum queue",
            "baseline_value": plain_mem if plain_mem is not None else float("nan"),
            "ratio": None,
            "rss_after_fill_mb": _mb(rss_after),
        },
        {
            "workload": "capacity disk",
            "subject": f"chain, {label}",
            "value": chain_disk if chain_disk is not None else float("nan"),
            "unit": "B/msg",
            "baseline": "plain quorum queue",
            "baseline_value": plain_disk if plain_disk is not None else float("nan"),
            "ratio": None,
            "disk_after_fill_mb": _mb(disk_after),
        },
        {
            "workload": "capacity drain",
            "subject": f"@with_delayed_retry, {drain:,} due",
            "value": round(decorated_drain["rate"]),
            "unit": "msg/s",
            "baseline": "plain aio-pika consumer",
            "baseline_value": round(plain_drain["rate"]),
            "ratio": decorated_drain["rate"] / plain_drain["rate"],
        },
        {
            "workload": "capacity consumer RSS growth",
            "subject": f"@with_delayed_retry, {drain:,} handled",
            "value": round(_growth(decorated_drain["samples"]), 1),
            "unit": "MB",
            "baseline": "plain aio-pika consumer",
            "baseline_value": round(_growth(plain_drain["samples"]), 1),
            "ratio": None,
        },
    ]
    return rows


def _diagnostics(
    node: RabbitMQNode | None, topology: DelayTopology, levels: tuple[int, ...]
) -> dict[str, str]:
    """Where the broker's memory is, and which policies the waiting levels have."""
    if node is None:
        return {}
    out: dict[str, str] = {}
    try:
        out["memory_breakdown"] = node.cli(
            "rabbitmq-diagnostics", "memory_breakdown", "--unit", "mb"
        )
        out["queues"] = node.rabbitmqctl("list_queues", "name", "messages", "memory", "policy")
        for level in levels:
            name = topology.level_name(level)
            expr = (
                '{ok, Q} = rabbit_amqqueue:lookup(rabbit_misc:r(<<"/">>, queue, '
                f'<<"{name}">>)), {{amqqueue:get_policy(Q), amqqueue:get_operator_policy(Q)}}.'
            )
            out[f"policies of level {level}"] = node.rabbitmqctl("eval", expr)
    except Exception as exc:  # diagnostics only: never fail the run for them
        out["error"] = repr(exc)
    return out


def _mb(value: int | None) -> str:
    return "?" if value is None else f"{value / 1e6:.0f}"


# --- the consumer process ---------------------------------------------------


async def _consume_main(args: argparse.Namespace) -> None:
    topology = DelayTopology(
        prefix=args.prefix, levels=args.levels, unit=timedelta(milliseconds=args.unit_ms)
    )
    connection = await aio_pika.connect(args.url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=100)
        queue = await channel.get_queue(args.queue)
        handled = 0
        first: float | None = None
        finished = asyncio.Event()

        def count() -> None:
            nonlocal handled, first
            if first is None:
                first = time.monotonic()
            handled += 1
            if handled >= args.count:
                finished.set()

        if args.kind == "plain":

            async def plain(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                await message.ack()
                count()

            await queue.consume(plain)
        else:
            from delayed_retry import with_delayed_retry

            @with_delayed_retry(topology=topology)
            async def decorated(message: aio_pika.abc.AbstractIncomingMessage) -> None:
                count()

            await consume(queue, decorated)
        began = time.monotonic()
        me = os.getpid()
        while not finished.is_set():
            sample = {"t": round(time.monotonic() - began, 1), "handled": handled}
            print(json.dumps({**sample, "rss": rss_bytes(me)}), flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(finished.wait(), 1.0)
        last = time.monotonic()
        print(json.dumps({"t": round(last - began, 1), "handled": handled, "rss": rss_bytes(me)}))
        seconds = last - (first or last)
        rate = handled / seconds if seconds > 0 else float("nan")
        print(json.dumps({"done": True, "handled": handled, "seconds": seconds, "rate": rate}))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("capacity")
    group.add_argument("--capacity-messages", type=int, default=100_000)
    group.add_argument("--capacity-baseline", type=int, help="default: min(messages, 50,000)")
    group.add_argument("--capacity-drain", type=int, help="default: min(messages, 50,000)")
    group.add_argument("--capacity-window", type=int, default=1000, help="publishes in flight")
    group.add_argument(
        "--capacity-drain-level",
        type=int,
        default=18,
        help="the drained messages wait 2^level units (18: 262 s); longer than the fill's tail",
    )
    group.add_argument(
        "--capacity-publish-delayed",
        action="store_true",
        help="fill with publish_delayed on aio-pika (slower) instead of the batched bulk path",
    )
    group.add_argument(
        "--capacity-memory-policy",
        action="store_true",
        help="set the chain's max-in-memory-length operator policy first (RabbitMQ 3.10-3.11)",
    )


async def capacity(suite: Suite) -> list[Row]:
    """The ``capacity`` workload: fill, broker memory and disk, the drain, beside a queue."""
    args = suite.args
    print(f"capacity: {args.capacity_messages} delayed 1 KB messages waiting at once ...")
    return await run(
        suite.url,
        node=suite.node,
        messages=args.capacity_messages,
        baseline_messages=args.capacity_baseline or min(args.capacity_messages, 50_000),
        drain=args.capacity_drain or min(args.capacity_messages, 50_000),
        window=args.capacity_window,
        drain_level=args.capacity_drain_level,
        memory_policy=args.capacity_memory_policy,
        batched=not args.capacity_publish_delayed,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="capacity benchmark's consumer process")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("consume")
    c.add_argument("--url", required=True)
    c.add_argument("--queue", required=True)
    c.add_argument("--count", type=int, required=True)
    c.add_argument("--kind", choices=("plain", "decorated"), required=True)
    c.add_argument("--prefix", required=True)
    c.add_argument("--levels", type=int, required=True)
    c.add_argument("--unit-ms", type=int, required=True)
    args = parser.parse_args(argv)
    asyncio.run(_consume_main(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
