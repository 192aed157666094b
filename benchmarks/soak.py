"""Soak: a steady stream of failing and succeeding messages under scheduled faults.

Runs against a private RabbitMQ node it starts (never the machine's broker,
which it restarts). Two consumer processes share the work queue:

* consumer A is killed with SIGKILL on a schedule and started again;
* consumer B is never killed; its resident memory (RSS) is sampled to show the
  consumer does not grow.

Every ``--cycle`` seconds one fault is injected, in turn: SIGKILL consumer A;
close every client connection on the broker; restart the broker gracefully;
SIGKILL the broker and start it again. The producer publishes ``--rate``
messages per second with publisher confirms, retrying a publish until it is
confirmed; a message counts as *sent* once confirmed. Each message says how
many times its handler fails: 50 % never, 35 % once or twice (then handled),
15 % always (parked after ``max_retries=3``).

At the end the producer stops, the backlog drains, and every sent message must
be handled or parked. Prints sent / handled / parked / duplicates / lost and
consumer B's RSS after warm-up and at the end. Exit status 1 when anything is
lost or RSS grew by more than ``--rss-bound-mib`` (default 30 MiB).

    python benchmarks/soak.py                # 10 minutes
    python benchmarks/soak.py --minutes 2    # shorter
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage

from delayed_retry import (
    DelayTopology,
    consume,
    current_retry_state,
    declare_topology,
    with_delayed_retry,
)
from harness import RabbitMQNode

TOPOLOGY = DelayTopology(prefix="soak", levels=16, unit=timedelta(milliseconds=1))
QUEUE = "soak.work"
PARKING = f"{QUEUE}.parking"
MAX_RETRIES = 3
FAIL_ALWAYS = 99


# --- consumer process ------------------------------------------------------


async def run_consumer(url: str, handled_file: Path) -> None:
    fd = os.open(handled_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    @with_delayed_retry(
        max_retries=MAX_RETRIES,
        wait=tenacity.wait_exponential(multiplier=0.2, max=2) + tenacity.wait_random(0, 0.2),
        topology=TOPOLOGY,
        publish_timeout=5,
    )
    async def handle(message: AbstractIncomingMessage) -> None:
        spec = json.loads(message.body)
        state = current_retry_state()
        attempt = state.attempt if state else 1
        await asyncio.sleep(0.002)
        if attempt <= spec["fail"]:
            raise RuntimeError(f"message {spec['id']} fails on attempt {attempt}")
        # Written before the ack: a crash after this line makes a duplicate, never a gap.
        os.write(fd, f"{spec['id']}\n".encode())

    connection = await aio_pika.connect_robust(url, reconnect_interval=1)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=50)
    queue = await channel.declare_queue(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
    await consume(queue, handle)
    await asyncio.Future()  # run until killed


# --- orchestration ---------------------------------------------------------


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


class Soak:
    def __init__(self, args: argparse.Namespace, node: RabbitMQNode, workdir: Path) -> None:
        self.args = args
        self.node = node
        self.workdir = workdir
        self.handled_file = workdir / "handled.txt"
        self.handled_file.touch()
        self.sent: set[int] = set()
        self.consumers: dict[str, subprocess.Popen[bytes]] = {}
        self.faults: dict[str, int] = {}
        self.rng = random.Random(args.seed)
        self.stop_producing = asyncio.Event()

    def start_consumer(self, name: str) -> None:
        log = (self.workdir / f"consumer-{name}.log").open("ab")
        self.consumers[name] = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--role",
                "consumer",
                "--url",
                self.node.url,
                "--handled",
                str(self.handled_file),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )

    def kill_consumer(self, name: str) -> None:
        proc = self.consumers[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    async def produce(self) -> None:
        connection = await aio_pika.connect_robust(self.node.url, reconnect_interval=1)
        channel = await connection.channel()
        next_id = 0
        interval = 1 / self.args.rate
        try:
            while not self.stop_producing.is_set():
                began = time.monotonic()
                fail = self.rng.choices([0, 1, 2, FAIL_ALWAYS], weights=[50, 20, 15, 15])[0]
                body = json.dumps({"id": next_id, "fail": fail}).encode()
                while True:  # the producer's own at-least-once: publish until confirmed
                    try:
                        await asyncio.wait_for(
                            channel.default_exchange.publish(
                                aio_pika.Message(
                                    body,
                                    message_id=str(next_id),
                                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                                ),
                                routing_key=QUEUE,
                            ),
                            timeout=10,
                        )
                        break
                    except Exception:
                        await asyncio.sleep(0.5)
                self.sent.add(next_id)
                next_id += 1
                await asyncio.sleep(max(0.0, interval - (time.monotonic() - began)))
        finally:
            await connection.close()

    async def inject(self, kind: str) -> None:
        self.faults[kind] = self.faults.get(kind, 0) + 1
        print(f"[{self.elapsed():7.1f}s] fault: {kind}", flush=True)
        if kind == "kill-consumer":
            self.kill_consumer("A")
            self.start_consumer("A")
        elif kind == "cut-connections":
            await asyncio.to_thread(
                self.node.rabbitmqctl, "close_all_connections", "soak: connection cut"
            )
        elif kind == "restart-broker":
            await asyncio.to_thread(self.node.restart)
        elif kind == "kill-broker":
            await asyncio.to_thread(self.node.kill)
            await asyncio.to_thread(self.node.start)

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def handled_ids(self) -> list[int]:
        return [int(x) for x in self.handled_file.read_text().split()]

    async def parked_ids(self) -> list[int]:
        connection = await aio_pika.connect(self.node.url)
        ids: list[int] = []
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(PARKING, passive=True)
            while (message := await queue.get(fail=False, no_ack=False)) is not None:
                ids.append(json.loads(message.body)["id"])
            # Fetched without ack: closing the connection puts them back.
        finally:
            await connection.close()
        return ids

    async def queue_depth(self, name: str) -> int:
        connection = await aio_pika.connect(self.node.url)
        try:
            channel = await connection.channel()
            queue = await channel.declare_queue(name, passive=True)
            return int(queue.declaration_result.message_count or 0)
        finally:
            await connection.close()

    async def run(self) -> int:
        args = self.args
        self.began = time.monotonic()
        duration = args.minutes * 60
        self.start_consumer("A")
        self.start_consumer("B")
        producer = asyncio.create_task(self.produce())
        schedule = ["kill-consumer", "cut-connections", "restart-broker", "kill-broker"]
        warm_rss: int | None = None
        samples: list[tuple[float, int]] = []
        next_fault = args.cycle
        fault_index = 0
        while self.elapsed() < duration:
            await asyncio.sleep(1)
            t = self.elapsed()
            rss = rss_kib(self.consumers["B"].pid)
            if warm_rss is None and t >= args.warmup:
                warm_rss = rss
            if int(t) % 30 == 0:
                samples.append((t, rss))
                print(
                    f"[{t:7.1f}s] sent={len(self.sent)} handled-lines="
                    f"{len(self.handled_ids())} consumerB-rss={rss / 1024:.1f} MiB",
                    flush=True,
                )
            if t >= next_fault:
                await self.inject(schedule[fault_index % len(schedule)])
                fault_index += 1
                next_fault = t + args.cycle
        self.stop_producing.set()
        await producer
        print(f"[{self.elapsed():7.1f}s] producer stopped; draining", flush=True)
        drain_deadline = time.monotonic() + args.drain_seconds
        handled: set[int] = set()
        parked: list[int] = []
        while time.monotonic() < drain_deadline:
            handled = set(self.handled_ids())
            pending = self.sent - handled
            parked = await self.parked_ids()
            if not pending - set(parked):
                break
            await asyncio.sleep(2)
        end_rss = rss_kib(self.consumers["B"].pid)
        handled_lines = self.handled_ids()
        handled = set(handled_lines)
        parked = await self.parked_ids()
        parked_set = set(parked)
        lost = sorted(self.sent - handled - parked_set)
        unroutable = await self.queue_depth(TOPOLOGY.unroutable_queue)
        work_left = await self.queue_depth(QUEUE)
        for name in list(self.consumers):
            self.kill_consumer(name)
        warm = warm_rss or end_rss
        growth_mib = (end_rss - warm) / 1024
        result = {
            "minutes": args.minutes,
            "rate_per_s": args.rate,
            "faults": self.faults,
            "sent": len(self.sent),
            "handled": len(handled & self.sent),
            "parked": len(parked_set & self.sent),
            "duplicate_handlings": len(handled_lines) - len(handled),
            "duplicate_parkings": len(parked) - len(parked_set),
            "handled_and_parked": len(handled & parked_set),
            "lost": len(lost),
            "lost_ids_sample": lost[:20],
            "unroutable": unroutable,
            "work_queue_left": work_left,
            "consumer_b_rss_mib_after_warmup": round(warm / 1024, 1),
            "consumer_b_rss_mib_end": round(end_rss / 1024, 1),
            "consumer_b_rss_growth_mib": round(growth_mib, 1),
            "rss_bound_mib": args.rss_bound_mib,
            "rss_samples_mib": [(round(t), round(r / 1024, 1)) for t, r in samples],
        }
        print(json.dumps(result, indent=2), flush=True)
        results = Path(__file__).parent / "results"
        results.mkdir(exist_ok=True)
        with (results / "soak.jsonl").open("a") as out:
            out.write(
                json.dumps({"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())} | result)
            )
            out.write("\n")
        ok = not lost and growth_mib <= args.rss_bound_mib
        print("SOAK " + ("PASSED" if ok else "FAILED"), flush=True)
        return 0 if ok else 1


async def orchestrate(args: argparse.Namespace) -> int:
    with RabbitMQNode() as node:
        workdir = node.base_dir / "soak"
        workdir.mkdir()
        connection = await aio_pika.connect(node.url)
        channel = await connection.channel()
        await channel.declare_queue(QUEUE, durable=True, arguments={"x-queue-type": "quorum"})
        await declare_topology(channel, TOPOLOGY, queues=[QUEUE])
        await connection.close()
        print(f"broker {node.name} at {node.url}; work folder {workdir}", flush=True)
        return await Soak(args, node, workdir).run()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=25.0, help="messages per second")
    parser.add_argument("--cycle", type=float, default=30.0, help="seconds between faults")
    parser.add_argument("--warmup", type=float, default=60.0, help="seconds before RSS baseline")
    parser.add_argument("--drain-seconds", type=float, default=180.0)
    parser.add_argument("--rss-bound-mib", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--role", choices=["orchestrator", "consumer"], default="orchestrator")
    parser.add_argument("--url")
    parser.add_argument("--handled", type=Path)
    args = parser.parse_args()
    if args.role == "consumer":
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
        asyncio.run(run_consumer(args.url, args.handled))
        return 0
    logging.basicConfig(level=logging.WARNING)
    # The producer's reconnects during broker faults are expected; keep the output readable.
    for noisy in ("aiormq", "aio_pika"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)
    return asyncio.run(orchestrate(args))


if __name__ == "__main__":
    sys.exit(main())
