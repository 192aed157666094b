"""How late a discard makes the other waiting messages: ``topology discard`` beside no discard.

N messages are scheduled with :func:`delayed_retry.publish_delayed` (no hold: a plain
consumer records ``arrival - due``), due spread evenly over a window. As the first come due
(or later: ``--discard-at``),
:func:`~delayed_retry.admin.chain_discard.discard_waiting` takes one out of the chain by
id, so messages come due while its scan holds them. The same run without the discard is
the control. The promise measured: nothing early, the discarded one never arrives, every
other one once, and the others late by at most the scan's length (a held message cannot
expire).

    .venv/bin/python benchmarks/discard_lateness.py                 # a private 3.10 node
    .venv/bin/python benchmarks/discard_lateness.py --url amqp://…  # a broker of yours
    DELAYED_RETRY_TEST_RABBITMQ=4.3 .venv/bin/python benchmarks/discard_lateness.py
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import aio_pika
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import DelayTopology, declare_topology, publish_delayed
from delayed_retry.admin.chain_discard import discard_waiting
from delayed_retry.chain_digest import markers
from delayed_retry.durations import utcnow
from delayed_retry.headers import X_DUE_AT, read_epoch_ms
from harness import RabbitMQNode


def _percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "p50_ms": round(pick(0.50), 1),
        "p99_ms": round(pick(0.99), 1),
        "max_ms": round(ordered[-1], 1),
        "min_ms": round(ordered[0], 1),
    }


async def _run(
    url: str, *, count: int, window: float, discard: bool, queue_type: str, at: float
) -> Any:
    prefix = f"bench-discard-{secrets.token_hex(3)}"
    topology = DelayTopology(prefix=prefix, queue_type=queue_type)  # type: ignore[arg-type]
    queue = f"{prefix}.q"
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        await channel.declare_queue(queue, durable=True, arguments={"x-queue-type": queue_type})
        try:
            # Due from `lead` seconds after the start, when every publish is done.
            lead = 2.0 + count / 400
            start = utcnow()
            for i in range(count):
                due = start + timedelta(seconds=lead + window * i / count)
                await publish_delayed(
                    channel,
                    aio_pika.Message(str(i).encode(), message_id=f"m-{i}"),
                    queue=queue,
                    delay=due,
                    topology=topology,
                    hold=None,
                )
            arrivals: dict[str, float] = {}
            early: list[str] = []
            done = asyncio.Event()
            expected = count - 1 if discard else count

            async def record(message: AbstractIncomingMessage) -> None:
                now = time.time()
                ident = message.message_id or "?"
                due_at = read_epoch_ms((message.headers or {}).get(X_DUE_AT))
                assert due_at is not None
                if ident in arrivals:
                    raise AssertionError(f"{ident} arrived twice")
                arrivals[ident] = (now - due_at.timestamp()) * 1000
                if now < due_at.timestamp():
                    early.append(ident)
                await message.ack()
                if len(arrivals) >= expected:
                    done.set()

            await (await channel.get_queue(queue)).consume(record)
            scan: dict[str, Any] = {}
            victim = f"m-{count * 3 // 4}"
            if discard:
                # When the first messages come due (--discard-at 0) or later in the window:
                # messages come due while the scan holds them.
                moment = start + timedelta(seconds=lead + window * at)
                await asyncio.sleep(max(0.0, (moment - utcnow()).total_seconds()))
                scan_start = time.time()
                report = await discard_waiting(channel, ids=(victim,), topology=topology)
                scan = {
                    "seconds": round(report.seconds, 3),
                    "scanned": report.scanned,
                    "taken": report.done,
                    "window": (scan_start, scan_start + report.seconds),
                }
            await asyncio.wait_for(done.wait(), timeout=lead + window + 60)
            # The last ones are in; anything still in the chain would be a copy or the victim.
            left = 0
            for level in range(topology.levels):
                declared = await channel.declare_queue(topology.level_name(level), passive=True)
                left += declared.declaration_result.message_count or 0
            late = list(arrivals.values())
            out: dict[str, Any] = {
                "discard": discard,
                "arrived": len(arrivals),
                "early": len(early),
                "victim_arrived": victim in arrivals if discard else None,
                "left_in_chain": left,
                "lateness": _percentiles(late),
            }
            if discard:
                low, high = scan.pop("window")
                # Messages due while the scan held them: the ones it can make late.
                during = []
                for i in range(count):
                    due_s = (start + timedelta(seconds=lead + window * i / count)).timestamp()
                    if low <= due_s <= high and f"m-{i}" in arrivals:
                        during.append(arrivals[f"m-{i}"])
                out["scan"] = scan
                out["due_during_scan"] = len(during)
                if during:
                    out["lateness_due_during_scan"] = _percentiles(during)
            return out
        finally:
            await channel.queue_delete(queue)
            for spec in topology.queues():
                await channel.queue_delete(spec.name)
            for name in [*(e.name for e in topology.exchanges()), *markers(topology)]:
                await channel.exchange_delete(name)


@contextlib.contextmanager
def _broker(url: str | None) -> Iterator[str]:
    if url:
        yield url
        return
    with RabbitMQNode() as node:
        yield node.url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a broker to use (default: a private node)")
    parser.add_argument("--count", type=int, default=1000, help="messages waiting (1000)")
    parser.add_argument("--window", type=float, default=4.0, help="seconds their due times span")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of control + discard (2)")
    parser.add_argument("--queue-type", default="quorum", choices=("quorum", "classic"))
    parser.add_argument(
        "--discard-at",
        type=float,
        default=0.0,
        help="when to discard, as a fraction of the window (0: as the first come due, all "
        "still waiting)",
    )
    args = parser.parse_args()
    with _broker(args.url) as url:
        for _ in range(args.rounds):
            for discard in (False, True):
                result = asyncio.run(
                    _run(
                        url,
                        count=args.count,
                        window=args.window,
                        discard=discard,
                        queue_type=args.queue_type,
                        at=args.discard_at,
                    )
                )
                print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
