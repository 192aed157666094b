"""The one-hop retry taken apart: what the copy's headers, the chain's routing and the library cost.

``retry-1hop`` of :mod:`throughput` compares delayed-retry's 1 ms retry (the copy enters
level 0 of the chain, a topic exchange, waits in its quorum TTL queue and dead-letters
into the delivery topic exchange, which routes it back to the queue) with a hand-rolled
hop (a confirmed copy with one header into ``<queue>.hop``, a quorum queue with a 1 ms
TTL dead-lettering through the default exchange). This workload measures the steps in
between, each the same consumer as :func:`throughput.hand_rolled` with one thing changed,
interleaved like the throughput pairs (:func:`throughput.measure`, a new shuffled order
each round, medians kept):

* ``B``: the hand-rolled hop, a copy with one header (the baseline of every row);
* ``BH``: the same hop, the copy carrying the headers of the library's copy;
* ``C1``: a copy with one header published into the chain's entry, the route the
  library's 1 ms retry takes (``DelayTopology.route``), back through the delivery exchange;
* ``CH``: the same into the chain, with the library's headers: a library adding no
  Python of its own would cost this;
* ``SR``: delayed-retry's retry, its copy acked by hand when it comes back (the
  library's first delivery without its second);
* ``S``: delayed-retry, the ``retry-1hop`` subject.

The library's headers are those of a real 1 ms retry made at the start of the run (less
the broker's dead-letter headers), and that retry's entry into the chain is checked to be
the route ``C1`` and ``CH`` take. Every hand-written copy also carries the one marker
header that tells the handler it is a copy. The shares: the headers (``BH − B`` beside a
hop, ``CH − C1`` in the chain), the chain's routing (``C1 − B`` with one header,
``CH − BH`` with the library's), the library's own work (``S − CH``), split into its retry
(``SR − CH``) and its handling of the copy (``S − SR``); differences of
medians, so they move with the rows they come from.

On a shared machine a whole round can run slower than the next, every variant alike, and
the differences here are a tenth of a variant's cost: each row also gives the median of
the round-by-round figures (``paired_ratio``: B's cost in a round over the variant's in
the same round; ``paired_us``: the round's difference), which such drift does not move.

Run it with ``benchmarks/run --only hop-anatomy`` (opt-in).
"""

from __future__ import annotations

import random
import statistics
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aio_pika
import throughput
from aio_pika.abc import AbstractIncomingMessage, AbstractQueue
from throughput import Consumer, Sample

from delayed_retry import (
    DelayTopology,
    RetryAfter,
    consume,
    declare_topology,
    with_delayed_retry,
)
from delayed_retry.headers import X_DEATH, X_RETRY, is_broker_header

WORKLOAD = "hop-anatomy"
SHARES = "hop-anatomy share"
DELAY = 0.001
"""The retry's delay, seconds: as ``retry-1hop``, one unit of the benchmark chain."""
UNITS = 1
"""``DELAY`` in units of the benchmark chain (1 ms): what the library's retry enters with."""


@dataclass(frozen=True)
class Variant:
    """One consumer of the decomposition, and whether it needs the hop queue or the chain."""

    key: str
    label: str
    hop_queue: bool

    @property
    def subject(self) -> str:
        return f"{self.key}: {self.label}"


VARIANTS = (
    Variant("B", "hand-rolled hop, 1 header", hop_queue=True),
    Variant("BH", "hand-rolled hop, library's headers", hop_queue=True),
    Variant("C1", "hand-written into the chain, 1 header", hop_queue=False),
    Variant("CH", "hand-written into the chain, library's headers", hop_queue=False),
    Variant("SR", "delayed-retry's retry, the copy acked by hand", hop_queue=False),
    Variant("S", "delayed-retry", hop_queue=False),
)
BASELINE = VARIANTS[0]

DIFFERENCES = (
    ("headers, beside a hop", "BH", "B"),
    ("headers, in the chain", "CH", "C1"),
    ("chain routing, 1 header", "C1", "B"),
    ("chain routing, library's headers", "CH", "BH"),
    ("library's own work", "S", "CH"),
    ("library's retry", "SR", "CH"),
    ("library's handling of the copy", "S", "SR"),
)
"""Each share: its name, and the two variants whose difference it is."""


async def capture_copy_headers(
    connection: aio_pika.abc.AbstractConnection, topology: DelayTopology
) -> dict[str, Any]:
    """The headers the library's copy carries, from one real 1 ms retry through ``topology``.

    Raises RuntimeError when that copy did not enter the chain where
    ``topology.route(UNITS, queue)`` says: the hand-written variants would then
    measure another route than the library's.
    """
    arrived: list[tuple[str, dict[str, Any]]] = []

    async def start(queue: AbstractQueue, finished: Callable[[], None]) -> str:
        async def handler(message: AbstractIncomingMessage) -> None:
            if X_RETRY not in message.headers:
                raise RetryAfter(DELAY)
            arrived.append((queue.name, dict(message.headers)))
            finished()

        return await consume(queue, with_delayed_retry(topology=topology, hold=None)(handler))

    await throughput.measure(connection, start, 1, declare=topology)
    queue, headers = arrived[0]
    route = topology.route(UNITS, queue)
    deaths = headers.get(X_DEATH) or []
    entered = (
        (_text(deaths[-1].get("exchange")), _text((deaths[-1].get("routing-keys") or [""])[0]))
        if deaths
        else None
    )
    if entered != (route.exchange, route.routing_key):
        raise RuntimeError(
            f"the library's {DELAY * 1000:g} ms retry entered the chain at {entered}, not at "
            f"{(route.exchange, route.routing_key)} (DelayTopology.route({UNITS}, queue)): "
            "set hop_anatomy.UNITS to the units the library's retry enters with"
        )
    return {k: v for k, v in headers.items() if not is_broker_header(k)}


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def chain_entry(topology: DelayTopology) -> throughput.Destination:
    """Where the library sends a 1 ms retry for a queue: level 0 of ``topology``, its key."""

    def to(name: str) -> tuple[str, str]:
        route = topology.route(UNITS, name)
        return route.exchange, route.routing_key

    return to


def retry_only(topology: DelayTopology) -> Consumer:
    """delayed-retry's 1 ms retry of each message; the copy, when it comes back, acked by hand.

    ``S`` without the library's handling of the copy: what is left of ``S − CH`` here is
    the retry's share.
    """

    async def start(queue: AbstractQueue, finished: Callable[[], None]) -> str:
        async def fail(message: AbstractIncomingMessage) -> None:
            raise RetryAfter(DELAY)

        retrying = with_delayed_retry(topology=topology, hold=None)(fail).for_queue(queue.name)
        await retrying.declare(queue.channel)

        async def handler(message: AbstractIncomingMessage) -> None:
            if X_RETRY in message.headers:
                await message.ack()
                finished()
                return
            await retrying(message)

        return await queue.consume(handler)

    return start


def consumers(topology: DelayTopology, copy_headers: Mapping[str, Any]) -> dict[str, Consumer]:
    """Every variant's consumer, by key."""

    def library_headers(message: AbstractIncomingMessage) -> Mapping[str, Any]:
        return copy_headers

    into_chain = chain_entry(topology)
    return {
        "B": throughput.hand_rolled(to=throughput.to_hop),
        "BH": throughput.hand_rolled(to=throughput.to_hop, headers=library_headers),
        "C1": throughput.hand_rolled(to=into_chain),
        "CH": throughput.hand_rolled(to=into_chain, headers=library_headers),
        "SR": retry_only(topology),
        "S": throughput.decorated(topology, fail_once_with=DELAY),
    }


async def run(
    url: str, *, messages: int, rounds: int, broker_pid: int | None = None
) -> list[dict[str, Any]]:
    """Every variant over ``rounds`` interleaved rounds: one row each, then one per share.

    ``ratio`` is B's CPU cost per message over the variant's, as in
    :func:`throughput.run`; without ``broker_pid`` the costs are the client's alone.
    """
    topology = DelayTopology(prefix=f"bench-{uuid.uuid4().hex[:6]}", levels=16)
    samples: dict[str, list[Sample]] = {v.key: [] for v in VARIANTS}
    connection = await aio_pika.connect(url)
    async with connection:
        channel = await connection.channel()
        await declare_topology(channel, topology)
        try:
            copy_headers = await capture_copy_headers(connection, topology)
            print(f"hop-anatomy: the library's copy carries {sorted(copy_headers)}")
            by_key = consumers(topology, copy_headers)
            for round_ in range(rounds):
                order = list(VARIANTS)
                random.Random(round_).shuffle(order)
                for variant in order:
                    samples[variant.key].append(
                        await throughput.measure(
                            connection,
                            by_key[variant.key],
                            messages,
                            hop_queue=variant.hop_queue,
                            declare=None if variant.hop_queue else topology,
                            broker_pid=broker_pid,
                        )
                    )
        finally:
            await throughput.delete_topology(channel, topology)
    return suite_rows(samples, copy_headers)


_ATTRS = ("cost_us", "client_us", "broker_us", "rate")


def suite_rows(
    samples: Mapping[str, list[Sample]], copy_headers: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The suite's rows: one per variant against B, then the shares of the gap S − B."""
    med = {
        key: {attr: statistics.median(getattr(s, attr) for s in values) for attr in _ATTRS}
        for key, values in samples.items()
    }
    base = med[BASELINE.key]
    out: list[dict[str, Any]] = []
    for variant in VARIANTS:
        m = med[variant.key]
        paired = statistics.median(
            b.cost_us / v.cost_us
            for b, v in zip(samples[BASELINE.key], samples[variant.key], strict=True)
        )
        note = f"client {round(m['client_us'])} / broker {round(m['broker_us'])} µs; "
        note += f"paired ratio {paired:.3f}"
        if variant.key == "CH":
            note += "; the library's route and headers, none of its Python"
        out.append(
            {
                "workload": WORKLOAD,
                "subject": variant.subject,
                "baseline": BASELINE.subject,
                "unit": "CPU µs/msg",
                "value": round(m["cost_us"], 1),
                "baseline_value": round(base["cost_us"], 1),
                "ratio": round(base["cost_us"] / m["cost_us"], 3),
                "client_ratio": round(base["client_us"] / m["client_us"], 3),
                "wall_ratio": round(m["rate"] / base["rate"], 3),
                "rate": round(m["rate"], 1),
                "client_us": round(m["client_us"], 1),
                "broker_us": round(m["broker_us"], 1),
                "paired_ratio": round(paired, 3),
                "note": note,
                "copy_headers": dict(copy_headers) if variant.key in ("BH", "CH") else {},
                "samples": [vars(s) for s in samples[variant.key]],
            }
        )
    gap = med["S"]["cost_us"] - base["cost_us"]
    for name, minuend, subtrahend in DIFFERENCES:
        a, b = med[minuend], med[subtrahend]
        value = a["cost_us"] - b["cost_us"]
        client, broker = a["client_us"] - b["client_us"], a["broker_us"] - b["broker_us"]
        paired_us = statistics.median(
            x.cost_us - y.cost_us
            for x, y in zip(samples[minuend], samples[subtrahend], strict=True)
        )
        out.append(
            {
                "workload": SHARES,
                "subject": f"{name} ({minuend} − {subtrahend})",
                "baseline": "the whole gap (S − B)",
                "unit": "CPU µs/msg",
                "value": round(value, 1),
                "baseline_value": round(gap, 1),
                "ratio": None,
                "share_of_gap": round(value / gap, 3) if gap else None,
                "paired_us": round(paired_us, 1),
                "client_us": round(client, 1),
                "broker_us": round(broker, 1),
                "note": f"client {round(client)} / broker {round(broker)} µs; "
                f"paired {round(paired_us)} µs",
            }
        )
    return out


def details(rows: list[dict[str, Any]]) -> str:
    """The decomposition as a small table: CPU µs per message by variant, then the shares."""
    variants = [r for r in rows if r["workload"] == WORKLOAD]
    if not variants:
        return ""
    lines = [
        f"{'hop anatomy, CPU µs/msg':<52} {'client':>7} {'broker':>7} {'total':>7} "
        f"{'paired':>7}  ratio to B (paired)"
    ]
    for r in variants:
        lines.append(
            f"{r['subject']:<52} {round(r['client_us']):>7} {round(r['broker_us']):>7} "
            f"{round(r['value']):>7} {'':>7}  {r['ratio']:.3f} ({r['paired_ratio']:.3f})"
        )
    for r in rows:
        if r["workload"] == SHARES:
            share = "" if r["share_of_gap"] is None else f"  {r['share_of_gap']:.2f} of S − B"
            lines.append(
                f"{r['subject']:<52} {round(r['client_us']):>7} {round(r['broker_us']):>7} "
                f"{round(r['value']):>7} {round(r['paired_us']):>7}{share}"
            )
    return "\n".join(lines)
