"""Precision and throughput of delays to an exchange, against delays to a queue, in one run.

Three paths deliver the same number of delayed messages on the same broker:

* queue (baseline): ``publish_delayed(queue=Q)``: chain, then Q;
* exchange: ``publish_delayed(exchange=X, routing_key=K)``: chain, forward
  queue, a :class:`~delayed_retry.delivery.forwarder.Forwarder`, then X and Q;
* front door: a plain publish to ``X.delay`` with ``x-delay``: a
  :class:`~delayed_retry.delivery.front_door.FrontDoor`, chain, forward queue, X, Q.

Two phases per path: a burst of ``--messages`` with a 1 ms delay gives
throughput (messages per second, first publish to last arrival); ``--paced``
messages at 20/s with delays of 0.5..1.5 s give lateness p50/p99 (arrival minus
due time). Each phase reports the number delivered early (must be 0) and the
ratio or difference against the queue path. It writes
a JSON line to ``benchmarks/results/exchange_path.jsonl``.

    python benchmarks/bench_exchange_path.py --messages 2000 --paced 200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractIncomingMessage

from delayed_retry import DelayTopology, publish_delayed
from delayed_retry.chain_digest import markers
from delayed_retry.delivery.forwarder import Forwarder
from delayed_retry.delivery.front_door import (
    FrontDoor,
)
from delayed_retry.durations import from_epoch_ms, to_epoch_ms
from delayed_retry.headers import (
    X_DELAY,
)
from harness import broker_url

DUE = "bench-due-ms"
PACED_RATE = 20


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run(
    url: str, n: int, mode: str, topology: DelayTopology, spread: float, *, precision: bool
) -> dict[str, Any]:
    connection = await aio_pika.connect_robust(url)
    tag = uuid.uuid4().hex[:8]
    queue_name, exchange = f"bench-{mode}-{tag}", f"bench-{mode}-{tag}-x"
    lateness: list[float] = []
    done = asyncio.Event()
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=200)
        queue = await channel.declare_queue(
            queue_name, durable=True, arguments={"x-queue-type": "quorum"}
        )
        x = await channel.declare_exchange(exchange, "topic", durable=True)
        await queue.bind(x, routing_key="k")

        async def on_message(message: AbstractIncomingMessage) -> None:
            arrived = time.time() * 1000
            lateness.append(arrived - int(message.headers[DUE]))  # type: ignore[call-overload]
            await message.ack()
            if len(lateness) >= n:
                done.set()

        await queue.consume(on_message)
        helper: Forwarder | FrontDoor | None = None
        if mode == "exchange":
            helper = Forwarder(connection, exchanges=[exchange], topology=topology)
        elif mode == "front-door":
            helper = FrontDoor(connection, exchange=exchange, topology=topology)
        if helper is not None:
            await helper.start()
        pub = await connection.channel()
        if precision:
            # Paced, so that lateness measures the path and not a backlog.
            delays = [random.uniform(0.5, 0.5 + spread) for _ in range(n)]
            started = time.monotonic()
            sends = []
            for d in delays:
                sends.append(
                    asyncio.ensure_future(_send(pub, mode, queue_name, exchange, d, topology))
                )
                await asyncio.sleep(1 / PACED_RATE)
            await asyncio.gather(*sends)
        else:
            started = time.monotonic()
            await asyncio.gather(
                *(_send(pub, mode, queue_name, exchange, 0.001, topology) for _ in range(n))
            )
        await asyncio.wait_for(done.wait(), timeout=300 + spread)
        elapsed = time.monotonic() - started
        if helper is not None:
            await helper.close()
        forward = topology.forward_queue(exchange)
        for name in (
            queue_name,
            forward,
            f"{forward}.parking",
            f"{exchange}.delay",
            f"{exchange}.delay.parking",
        ):
            await channel.queue_delete(name)
        for name in (exchange, f"{exchange}.delay"):
            await channel.exchange_delete(name)
    return {
        "mode": mode,
        "phase": "precision" if precision else "throughput",
        "messages": n,
        "per_second": n / elapsed,
        "p50_late_ms": statistics.median(lateness),
        "p99_late_ms": _quantile(lateness, 0.99),
        "early": sum(1 for v in lateness if v < 0),
    }


async def _send(
    channel: AbstractChannel,
    mode: str,
    queue: str,
    exchange: str,
    delay: float,
    topology: DelayTopology,
) -> None:
    now = datetime.now(UTC)
    due_ms = to_epoch_ms(now + timedelta(seconds=delay))
    if mode == "front-door":
        # The front door's due time is its receipt + x-delay, so this is a lower bound.
        message = aio_pika.Message(
            b"x" * 200, headers={X_DELAY: due_ms - to_epoch_ms(now), DUE: due_ms}
        )
        await (await channel.get_exchange(f"{exchange}.delay", ensure=False)).publish(message, "k")
        return
    message = aio_pika.Message(b"x" * 200, headers={DUE: due_ms})
    due_at = from_epoch_ms(due_ms)
    if mode == "queue":
        await publish_delayed(
            channel, message, queue=queue, delay=due_at, now=now, topology=topology
        )
    else:
        await publish_delayed(
            channel,
            message,
            exchange=exchange,
            routing_key="k",
            delay=due_at,
            now=now,
            topology=topology,
        )


async def _main(args: argparse.Namespace) -> int:
    topology = DelayTopology(prefix=f"bench-x-{uuid.uuid4().hex[:6]}", levels=16)
    results = []
    with broker_url() as url:
        try:
            for precision, n in ((False, args.messages), (True, args.paced)):
                for mode in ("queue", "exchange", "front-door"):
                    results.append(
                        await _run(url, n, mode, topology, args.spread, precision=precision)
                    )
        finally:
            connection = await aio_pika.connect(url)
            async with connection:
                channel = await connection.channel()
                for spec in topology.queues():
                    await channel.queue_delete(spec.name)
                for name in [*(ex.name for ex in topology.exchanges()), *markers(topology)]:
                    await channel.exchange_delete(name)
    for r in results:
        base = next(b for b in results if b["phase"] == r["phase"] and b["mode"] == "queue")
        r["throughput_ratio"] = r["per_second"] / base["per_second"]
        r["p99_late_extra_ms"] = r["p99_late_ms"] - base["p99_late_ms"]
        if r["phase"] == "throughput":
            print(
                f"throughput {r['mode']:>10}: {r['per_second']:8.1f} msg/s "
                f"({r['throughput_ratio']:.2f}x queue), early {r['early']}"
            )
        else:
            print(
                f"precision  {r['mode']:>10}: late p50 {r['p50_late_ms']:6.1f} ms, p99 "
                f"{r['p99_late_ms']:6.1f} ms ({r['p99_late_extra_ms']:+.1f} ms vs queue), "
                f"early {r['early']}"
            )
    out = Path(__file__).parent / "results" / "exchange_path.jsonl"
    out.parent.mkdir(exist_ok=True)
    with out.open("a") as f:
        f.write(json.dumps({"at": time.time(), "results": results}) + "\n")
    return 1 if any(r["early"] for r in results) else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=2000, help="burst for throughput")
    parser.add_argument(
        "--paced", type=int, default=200, help=f"paced at {PACED_RATE}/s for lateness"
    )
    parser.add_argument(
        "--spread", type=float, default=1.0, help="delays are 0.5 s .. 0.5+SPREAD s"
    )
    return asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
