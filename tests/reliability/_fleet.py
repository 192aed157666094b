"""Every consumer the library runs, on one broker, for tests that break the broker under them.

A :class:`Fleet` is the three service commands as real processes (front
door, forwarder, router), each with its health port, plus, in the test
process, a consumer decorated with ``@with_delayed_retry`` (started with
:func:`~delayed_retry.consume`), the consumer whose rejections the router
retries, and collectors on the queues bound to the front door's and the
forwarder's exchanges. :meth:`Fleet.round` sends new messages down each of
the four paths and checks that each arrives, once, not before it is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import subprocess
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aio_pika
import tenacity
from aio_pika.abc import AbstractIncomingMessage, AbstractRobustConnection

from delayed_retry import (
    DelayTopology,
    consume,
    declare_topology,
    publish_delayed,
    with_delayed_retry,
)
from delayed_retry.amqp.channels import declared_queue, underlay_connection
from delayed_retry.amqp.declarer import declarer_for
from delayed_retry.consumer.router import RetryRouter
from delayed_retry.delivery.front_door import FrontDoor
from harness import free_port
from tests.support.queues import delete_all
from tests.support.services import get, metric, start_command, stop, wait_status
from tests.support.waiting import wait_until

from ._support import QUORUM

DELAY = 1.5
"""Seconds each new message waits: the front door's x-delay, the forwarder's delay, and the
router's and the decorated consumer's backoff."""
SERVICES = ("front-door", "forwarder", "router")
"""The services with a path of their own through the chain, checked message by message."""
WITH_ALERTS = (*SERVICES, "alerts")
"""And the alerts service, checked by the alerts it delivers (see :func:`alert_round`)."""
ARRIVAL_WAIT = 90.0
"""Upper bound for a message to arrive once the broker is back: a bug fails, a slow machine
does not."""


@dataclass
class Path:
    """One way a message goes through a consumer of the library: what was sent, what arrived."""

    name: str
    sent: dict[str, float] = field(default_factory=dict)
    """Body -> the earliest moment it may arrive (``time.time()``)."""
    arrived: dict[str, list[float]] = field(default_factory=dict)

    def record(self, body: str) -> None:
        self.arrived.setdefault(body, []).append(time.time())

    def missing(self, bodies: set[str]) -> set[str]:
        return {b for b in bodies if b not in self.arrived}

    def all_arrived(self, bodies: set[str]) -> bool:
        return not self.missing(bodies)

    def check(self, bodies: set[str], fault: str) -> None:
        """Each of ``bodies`` arrived exactly once and not before it was due."""
        counts = Counter({b: len(self.arrived.get(b, [])) for b in bodies})
        assert all(n == 1 for n in counts.values()), (
            f"{self.name} after {fault}: not once each: {dict(counts)}"
        )
        early = {
            b: self.sent[b] - self.arrived[b][0]
            for b in bodies
            if self.arrived[b][0] < self.sent[b]
        }
        assert not early, f"{self.name} after {fault}: early by seconds {early}"


class ServiceProcesses:
    """Service commands of one chain (:data:`SERVICES` by default), with their health ports."""

    def __init__(
        self,
        url: str,
        *,
        topology: DelayTopology,
        names: dict[str, str],
        services: tuple[str, ...] = SERVICES,
    ) -> None:
        self.url = url
        self.topology = topology
        self.names = names
        self.services = services
        self.ports = {service: free_port() for service in services}
        self.procs: dict[str, subprocess.Popen[str]] = {}

    def args(self, service: str) -> list[str]:
        chain = ["--prefix", self.topology.prefix, "--levels", str(self.topology.levels)]
        chain += ["--unit-ms", str(self.topology.unit_ms)]
        own = {
            "front-door": ["--exchange", self.names["door_exchange"]],
            "forwarder": ["--exchange", self.names["forward_exchange"]],
            "router": ["--queue", self.names["router_queue"], "--wait", f"fixed:{DELAY:g}s"],
            "alerts": ["--window", "1s", "--log"],
        }[service]
        port = str(self.ports[service])
        return [
            "--url",
            self.url,
            service,
            *own,
            *chain,
            "--health-port",
            port,
            "--metrics-port",
            port,
        ]

    def start(self) -> None:
        for service in self.services:
            self.procs[service] = start_command(self.args(service))
        for service in self.services:
            wait_status(self.ports[service], "/readyz", 200, proc=self.procs[service], timeout=120)

    def wait_all(self, status: int, *, timeout: float = 120.0) -> dict[str, dict[str, Any]]:
        return {
            service: wait_status(
                self.ports[service], "/readyz", status, proc=self.procs[service], timeout=timeout
            )
            for service in self.services
        }

    def stop(self) -> dict[str, str]:
        outputs = {}
        for service, proc in self.procs.items():
            if proc.poll() is None:
                _, _, outputs[service] = stop(proc)
            else:
                outputs[service] = proc.stdout.read() if proc.stdout else ""
        return outputs


def fleet_names(prefix: str) -> dict[str, str]:
    return {
        "door_exchange": f"{prefix}.door",
        "door_target": f"{prefix}.door.target",
        "forward_exchange": f"{prefix}.fwd",
        "forward_target": f"{prefix}.fwd.target",
        "router_queue": f"{prefix}.rejecting",
        "work_queue": f"{prefix}.work",
    }


async def declare_fleet(url: str, topology: DelayTopology, names: dict[str, str]) -> None:
    """The exchanges, queues and chain the fleet consumes and delivers to."""
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        for exchange, target in (
            ("door_exchange", "door_target"),
            ("forward_exchange", "forward_target"),
        ):
            x = await channel.declare_exchange(
                names[exchange], aio_pika.ExchangeType.TOPIC, durable=True
            )
            q = await channel.declare_queue(names[target], durable=True, arguments=QUORUM)
            await q.bind(x, "#")
        await channel.declare_queue(
            names["router_queue"],
            durable=True,
            arguments={**QUORUM, "x-dead-letter-exchange": topology.rejected_exchange},
        )
        await channel.declare_queue(names["work_queue"], durable=True, arguments=QUORUM)
        await declare_topology(channel, topology, queues=[names["work_queue"]])
        # What the services declare too, here first: every queue is led by this node.
        await FrontDoor(connection, exchange=names["door_exchange"], topology=topology).declare()
        underlay = await underlay_connection(connection)
        await declarer_for(underlay).forward_queue(underlay, topology, names["forward_exchange"])
        await RetryRouter(queues=[names["router_queue"]], topology=topology).declare(channel)


async def remove_fleet(url: str, topology: DelayTopology, names: dict[str, str]) -> None:
    """Delete what :func:`declare_fleet` and the services declared."""
    connection = await aio_pika.connect(url)
    async with connection:
        door, forward = names["door_exchange"], names["forward_exchange"]
        queues = [names[k] for k in ("door_target", "forward_target", "router_queue", "work_queue")]
        queues += [f"{door}.delay", topology.forward_queue(door), topology.forward_queue(forward)]
        queues += [topology.rejected_queue, topology.unroutable_queue]
        await delete_all(
            connection, queues=queues, exchanges=[door, f"{door}.delay", forward], topology=topology
        )


@dataclass
class InProcess:
    """The consumers the test process runs: decorated, rejecting, and the two collectors."""

    connection: AbstractRobustConnection
    paths: dict[str, Path]
    seen: Counter[str]


@contextlib.asynccontextmanager
async def in_process(
    url: str, topology: DelayTopology, names: dict[str, str]
) -> AsyncIterator[InProcess]:
    """Start the test process's consumers on ``url`` (robust, reconnecting every second)."""
    paths = {name: Path(name) for name in ("front door", "forwarder", "router", "consumer")}
    seen: Counter[str] = Counter()  # deliveries per body on the router's and the consumer's queue
    failed_at: dict[str, float] = {}
    connection = await aio_pika.connect_robust(url, reconnect_interval=1)
    try:
        channel = await connection.channel()

        @with_delayed_retry(max_retries=3, wait=tenacity.wait_fixed(DELAY), topology=topology)
        async def handle(message: AbstractIncomingMessage) -> None:
            body = message.body.decode()
            seen[body] += 1
            if seen[body] == 1:  # fails once: back after DELAY
                paths["consumer"].sent[body] = time.time() + DELAY
                raise RuntimeError("fails once")
            paths["consumer"].record(body)

        work = await channel.declare_queue(names["work_queue"], passive=True)
        await consume(work, handle)

        async def reject_once(message: AbstractIncomingMessage) -> None:
            body = message.body.decode()
            seen[body] += 1
            if seen[body] == 1:  # rejected once: the router brings it back after DELAY
                paths["router"].sent[body] = time.time() + DELAY
                failed_at[body] = time.time()
                await message.reject(requeue=False)
                return
            paths["router"].record(body)
            await message.ack()

        rejecting = await channel.declare_queue(names["router_queue"], passive=True)
        await rejecting.consume(reject_once)

        for path, target in (("front door", "door_target"), ("forwarder", "forward_target")):
            queue = await channel.declare_queue(names[target], passive=True)

            async def collect(message: AbstractIncomingMessage, path: str = path) -> None:
                paths[path].record(message.body.decode())
                await message.ack()

            await queue.consume(collect)
        yield InProcess(connection=connection, paths=paths, seen=seen)
    finally:
        await connection.close()


async def send_round(
    url: str, topology: DelayTopology, names: dict[str, str], fleet: InProcess, tag: str, n: int
) -> dict[str, set[str]]:
    """Publish ``n`` new messages down each path through ``url``; the bodies per path."""
    bodies = {
        path: {f"{tag}-{path.replace(' ', '')}-{i}-{secrets.token_hex(2)}" for i in range(n)}
        for path in fleet.paths
    }
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        door = await channel.get_exchange(f"{names['door_exchange']}.delay")
        for body in sorted(bodies["front door"]):
            fleet.paths["front door"].sent[body] = time.time() + DELAY
            await door.publish(
                aio_pika.Message(body.encode(), headers={"x-delay": int(DELAY * 1000)}),
                routing_key="k",
            )
        for body in sorted(bodies["forwarder"]):
            fleet.paths["forwarder"].sent[body] = time.time() + DELAY
            await publish_delayed(
                channel,
                aio_pika.Message(body.encode()),
                exchange=names["forward_exchange"],
                routing_key="k",
                delay=DELAY,
                topology=topology,
            )
        for path, queue in (("router", "router_queue"), ("consumer", "work_queue")):
            for body in sorted(bodies[path]):
                await channel.default_exchange.publish(
                    aio_pika.Message(body.encode(), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=names[queue],
                )
    return bodies


async def alert_round(url: str, topology: DelayTopology, services: ServiceProcesses) -> None:
    """A parked-message copy reaches the alerts service, which delivers an alert for it."""
    port = services.ports["alerts"]

    def delivered() -> float:
        page = get(port, "/metrics")[1]
        found = metric(page, "delayed_retry_service_messages_total", outcome="alerts_delivered")
        return found or 0.0

    before = await asyncio.to_thread(delivered)
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        parking = await channel.get_exchange(topology.parking_exchange)
        await parking.publish(aio_pika.Message(b"alert probe"), routing_key="alert-probe")

    async def alerted() -> bool:
        return await asyncio.to_thread(delivered) > before

    await wait_until(alerted, timeout=60, what="an alert delivered after the fault")


async def consumers_back(url: str, names: dict[str, str]) -> None:
    """The test process's own consumers are back on the broker (they reconnect each second)."""
    connection = await aio_pika.connect(url)

    async def back() -> bool:
        for queue in (names["work_queue"], names["router_queue"]):
            declared = await declared_queue(connection, queue)
            if declared is None or not declared.consumer_count:
                return False
        return True

    async with connection:
        await wait_until(back, timeout=60, what="the test process's consumers back on the broker")


async def deliver_round(
    url: str,
    topology: DelayTopology,
    names: dict[str, str],
    fleet: InProcess,
    *,
    fault: str,
    n: int = 10,
) -> None:
    """Send ``n`` new messages down each path; each must arrive, once, none early.

    "Once" is checked when a fence sent after the batch has arrived on every
    path: a duplicate of the batch would have come by then.
    """
    bodies = await send_round(url, topology, names, fleet, fault, n)
    await _arrived(fleet, bodies, f"{n} new messages after {fault}")
    fence = await send_round(url, topology, names, fleet, f"{fault}-fence", 1)
    await _arrived(fleet, fence, f"the fence after {fault}")
    for path, sent in bodies.items():
        fleet.paths[path].check(sent, fault)


async def _arrived(fleet: InProcess, bodies: dict[str, set[str]], what: str) -> None:
    try:
        await wait_until(
            lambda: not any(fleet.paths[p].missing(b) for p, b in bodies.items()),
            timeout=ARRIVAL_WAIT,
            what=what,
        )
    except AssertionError as exc:
        missing = {p: len(fleet.paths[p].missing(b)) for p, b in bodies.items()}
        raise AssertionError(f"{exc}; missing per path: {missing}") from None
