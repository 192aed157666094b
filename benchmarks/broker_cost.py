"""The broker's cost per delayed message, beside a plain publish→consume in the same run.

For each rate (300/s and 1,000/s by default, 5 s each) one private node
(with ``rabbitmq_management``) measures four streams of persistent 200-byte
messages, the producer in a process of its own (``benchmarks/broker_limit.py``
does the measuring):

- ``quorum``: the baseline, plain publish→consume through a quorum queue;
- ``classic``: the same through a classic queue;
- ``held``: ``publish_delayed(hold=DEFAULT_HOLD)``, delays uniform in
  ``[min_delay, max_delay]`` (0.5–3 s), consumed by a holding
  ``@with_delayed_retry`` handler from a classic queue;
- ``unheld``: the same with ``hold=None`` and a handler that does not hold.

Columns (per message sent):

- ``broker µs``: CPU time of the broker's Erlang VM (``/proc``) from the first
  publish until every message arrived (+0.5 s), less the VM's idle draw
  measured just before (1.5 s with nothing sent), over the messages.
  ``×quorum`` and ``×classic`` divide it by the baselines' at the same rate.
- ``hops``: level queues a message waited in, summed from the ``count`` of its
  ``x-death`` entries whose queue is a level queue of the chain.
- ``passes``: topic exchanges the broker routed the message through (the chain's
  level exchanges and its delivery exchange), counted inside the broker:
  Erlang ``call_count`` tracing of ``rabbit_exchange_type_topic:route``.
  ``routes`` counts ``rabbit_exchange:route`` the same way: each publish and
  each dead-lettering is one (so ``routes`` = 1 + ``hops`` when nothing goes
  wrong). The management API cannot give either: an exchange's
  ``message_stats.publish_in`` counts what clients publish to it, not what
  queues dead-letter into it nor what an exchange-to-exchange binding passes on.
- ``entries``: Δ of ``publish_in`` summed over the chain's exchanges (the
  delivery exchange included) through the management API, after its stats
  stop changing (the producer keeps its channel open 2 s after its last
  publish, or the broker drops the stats it has not emitted): client publishes
  into the chain; 1.0 unless the consumer sent messages back into the chain.
- lateness (ms, arrival at the handler − due; for the baselines, − publish):
  p50, p99, max and the earliest, which must not be below 0.
- ``recv``: distinct messages received / sent; duplicates are reported apart.
  Each must arrive exactly once.
- ``held``: the most messages the handler held at once (sampled every 5 ms);
  ``rss MB``: the consumer process's peak RSS during the stream (``VmHWM``
  after resetting it), held streams only.

A run that breaks a rule (earliest < 0, a message missing or twice) prints a
``FAIL`` note; a baseline whose median lateness passes 50 ms
fell behind its rate and gets a ``WARN`` line. Ratios measured in one run are the claim;
absolute microseconds move with the machine's load.

The suite's ``broker-cost`` workload: ``benchmarks/run --only broker-cost`` (``--quick``:
3 s per stream).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from collections.abc import Callable
from typing import Any

import broker_limit
from workloads import Row, Suite

from delayed_retry import DelayTopology
from delayed_retry.admin.management import ManagementClient, ManagementError
from harness import RabbitMQNode
from harness.ports import free_port, listening

STREAMS = {
    "quorum": "baseline-quorum",
    "classic": "baseline",
    "held": "held",
    "unheld": "unheld",
}
"""Column name → ``broker_limit.SUBJECTS`` key, in the order they run at each rate."""

COUNTED = ("rabbit_exchange", "rabbit_exchange_type_topic")
"""Modules whose ``route`` calls the broker counts: routings, and topic exchange passes."""

STATS_INTERVAL = 0.5
"""Seconds between the broker's statistics emissions (``collect_statistics_interval``)."""
STATS_LINGER = 4 * STATS_INTERVAL
"""Seconds the producer keeps its channel open after its last publish: a channel's
statistics not yet emitted when it closes are lost to the management API."""

BEHIND_MS = 50.0
"""A baseline whose median lateness passes this has fallen behind its rate (a warning)."""

_COUNT = re.compile(r"\{(\w+),(\d+)\}")


def _start_counting(node: RabbitMQNode) -> None:
    """Count every call of ``route`` (any arity) in :data:`COUNTED`, broker-wide."""
    patterns = ", ".join(
        f"erlang:trace_pattern({{{module}, route, '_'}}, true, [call_count])" for module in COUNTED
    )
    node.rabbitmqctl("eval", f"{patterns}, ok.")


def _read_counts(node: RabbitMQNode) -> dict[str, float]:
    sums = ", ".join(
        f"{{{module}, lists:sum([C || {{route, A}} <- {module}:module_info(exports), "
        f"{{call_count, C}} <- [erlang:trace_info({{{module}, route, A}}, call_count)], "
        "is_integer(C)])}"
        for module in COUNTED
    )
    out = node.rabbitmqctl("eval", f"[{sums}].")
    found = {name: float(count) for name, count in _COUNT.findall(out)}
    return {"routes": found.get(COUNTED[0], 0.0), "passes": found.get(COUNTED[1], 0.0)}


async def _publish_in(client: ManagementClient, names: set[str], deadline: float) -> float | None:
    """Σ ``publish_in`` over the exchanges ``names`` that exist, once its stats settle.

    Read until two reads a second apart (two stats intervals) agree; ``None`` if
    they still differ at ``deadline``.
    """
    last: float | None = None
    while True:
        total = 0.0
        for name in sorted(names):
            try:
                info = await client.exchange(name)
            except ManagementError as exc:
                if exc.status == 404:
                    continue  # a baseline declares no chain
                raise
            total += float((info.get("message_stats") or {}).get("publish_in", 0))
        if total == last:
            return total
        if time.monotonic() > deadline:
            return None
        last = total
        await asyncio.sleep(1.0)


def _chain_exchanges(topology: DelayTopology) -> set[str]:
    names = {topology.level_name(level) for level in range(topology.levels)}
    return names | {topology.delivery_exchange}


def _probe(
    node: RabbitMQNode, client: ManagementClient | None
) -> Callable[[DelayTopology], broker_limit.Probe]:
    def for_topology(topology: DelayTopology) -> broker_limit.Probe:
        async def read() -> dict[str, float]:
            counts = await asyncio.to_thread(_read_counts, node)
            if client is not None:
                deadline = time.monotonic() + 15
                entries = await _publish_in(client, _chain_exchanges(topology), deadline)
                counts["entries"] = float("nan") if entries is None else entries
            return counts

        return read

    return for_topology


async def run(
    *,
    rates: tuple[float, ...] = (300.0, 1000.0),
    seconds: float = 5.0,
    min_delay: float = broker_limit.MIN_DELAY,
    max_delay: float = broker_limit.MAX_DELAY,
    idle: float = 1.5,
    grace: float = 60.0,
    streams: tuple[str, ...] = tuple(STREAMS),
    management: bool = True,
) -> list[dict[str, Any]]:
    """One row per rate and stream; prints each as it is measured."""
    port = free_port()
    config = {"collect_statistics_interval": str(int(STATS_INTERVAL * 1000))}
    if management:
        config |= {"management.tcp.port": str(port), "management.tcp.ip": "127.0.0.1"}
    plugins = ["rabbitmq_management"] if management else []
    rows: list[dict[str, Any]] = []
    node = RabbitMQNode(plugins=plugins, config=config)
    await asyncio.to_thread(node.start)
    try:
        client = None
        if management:
            deadline = time.monotonic() + 60
            while not listening(port):
                if time.monotonic() > deadline:
                    raise RuntimeError("the management API did not start within 60 s")
                await asyncio.sleep(0.2)
            client = ManagementClient(f"http://guest:guest@127.0.0.1:{port}/", vhost="/")
        await asyncio.to_thread(_start_counting, node)
        for rate in rates:
            for column in streams:
                row = await broker_limit.measure(
                    node,
                    STREAMS[column],
                    rate=rate,
                    seconds=seconds,
                    side_rate=0.0,
                    min_delay=min_delay,
                    max_delay=max_delay,
                    idle=idle,
                    grace=grace,
                    probe=_probe(node, client),
                    linger=STATS_LINGER if management else 0.0,
                )
                row["stream"] = column
                rows.append(_costs(row))
                print(_line(row), flush=True)
            _ratios([r for r in rows if r["rate"] == rate])
    except ManagementError as exc:
        raise RuntimeError(f"reading the management API failed: {exc}") from exc
    finally:
        await asyncio.to_thread(node.close)
    return rows


def _costs(row: dict[str, Any]) -> dict[str, Any]:
    sent = max(row["sent"], 1)
    cpu, idle = row["cpu_seconds"], row["broker_idle_cores"] or 0.0
    net = cpu["broker"] - idle * row["seconds"]
    row["broker_us_per_message"] = round(net / sent * 1e6, 1)
    row["broker_us_per_message_raw"] = round(cpu["broker"] / sent * 1e6, 1)
    row["consumer_us_per_message"] = round(cpu["consumer"] / sent * 1e6, 1)
    row["producer_us_per_message"] = round(cpu["producer"] / sent * 1e6, 1)
    for name, value in row["counters"].items():
        row[f"{name}_per_message"] = round(value / sent, 3)
    row["failures"] = _failures(row)
    return row


def _failures(row: dict[str, Any]) -> list[str]:
    problems = []
    earliest = row["lateness_ms"]["min"]
    if earliest < 0:
        problems.append(f"earliest {earliest:g} ms: a message reached the handler before due")
    if row["missing"] > 0:
        problems.append(f"{row['missing']} of {row['sent']} messages never arrived")
    if row["duplicates"] > 0:
        problems.append(f"{row['duplicates']} messages arrived more than once")
    return problems


def _ratios(rows: list[dict[str, Any]]) -> None:
    base = {r["stream"]: r["broker_us_per_message"] for r in rows}
    for row in rows:
        for name in ("quorum", "classic"):
            b = base.get(name)
            value = row["broker_us_per_message"]
            row[f"ratio_to_{name}"] = round(value / b, 2) if b and b > 0 else None


def _line(row: dict[str, Any]) -> str:
    late = row["lateness_ms"]
    return (
        f"  {row['rate']:g}/s {row['stream']:<8} broker {row['broker_us_per_message']:>7g} µs/msg; "
        f"late ms p50 {late['p50']:g} p99 {late['p99']:g} earliest {late['min']:g}; "
        f"received {row['received']}/{row['sent']}"
    )


def _cell(value: Any, spec: str = "g") -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return format(value, spec)


def table(rows: list[dict[str, Any]]) -> str:
    """The compact table, then a FAIL line for every rule broken."""
    head = (
        f"{'rate':>6} {'stream':<8} {'broker µs':>9} {'×quorum':>7} {'×classic':>8} "
        f"{'hops':>5} {'passes':>6} {'routes':>6} {'entries':>7} "
        f"{'late p50':>8} {'p99':>7} {'max':>7} {'earliest':>8} {'recv':>11} "
        f"{'held':>5} {'rss MB':>6}"
    )
    lines = [head]
    for r in rows:
        late = r["lateness_ms"]
        recv = f"{r['received']}/{r['sent']}" + (f"+{r['duplicates']}d" if r["duplicates"] else "")
        held = r["peak_held"] if r["stream"] == "held" else None
        rss = r["rss_mb"]["peak"] if r["stream"] == "held" else None
        lines.append(
            f"{r['rate']:>6g} {r['stream']:<8} {_cell(r['broker_us_per_message'], '.0f'):>9} "
            f"{_cell(r.get('ratio_to_quorum'), '.2f'):>7} "
            f"{_cell(r.get('ratio_to_classic'), '.2f'):>8} "
            f"{_cell(r['hops_seen_per_message'], '.2f'):>5} "
            f"{_cell(r.get('passes_per_message'), '.2f'):>6} "
            f"{_cell(r.get('routes_per_message'), '.2f'):>6} "
            f"{_cell(r.get('entries_per_message'), '.2f'):>7} "
            f"{late['p50']:>8g} {late['p99']:>7g} {late['max']:>7g} {late['min']:>8g} "
            f"{recv:>11} {_cell(held):>5} {_cell(rss, '.0f'):>6}"
        )
    for r in rows:
        for problem in r["failures"]:
            lines.append(f"FAIL {r['rate']:g}/s {r['stream']}: {problem}")
    for r in rows:
        p50 = r["lateness_ms"]["p50"]
        if r["stream"] in ("quorum", "classic") and p50 > BEHIND_MS:
            lines.append(
                f"WARN {r['rate']:g}/s {r['stream']} baseline fell behind (p50 {p50:g} ms): "
                "a broker that is behind batches, so its cost per message is not comparable"
            )
    return "\n".join(lines)


def suite_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows in the suite's shape: broker µs per message against the quorum baseline."""
    out = []
    for r in rows:
        if r["stream"] == "quorum":
            continue
        base = next(b for b in rows if b["rate"] == r["rate"] and b["stream"] == "quorum")
        out.append(
            {
                **r,
                "workload": f"broker cost {r['rate']:g}/s",
                "subject": r["stream"],
                "baseline": "plain publish→consume, quorum queue",
                "unit": "broker µs/msg",
                "value": r["broker_us_per_message"],
                "baseline_value": base["broker_us_per_message"],
                "ratio": r.get("ratio_to_quorum"),
                "note": "FAIL: " + "; ".join(r["failures"]) if r["failures"] else "",
            }
        )
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("broker-cost")
    group.add_argument("--broker-cost-rates", type=float, nargs="+", default=[300, 1000])
    group.add_argument("--broker-cost-seconds", type=float, help="s per stream (5; --quick: 3)")
    group.add_argument("--broker-cost-streams", nargs="+", choices=list(STREAMS), default=None)
    group.add_argument(
        "--broker-cost-no-management",
        action="store_true",
        help="no management plugin (no entries column)",
    )


async def broker_cost(suite: Suite) -> list[Row]:
    """The ``broker-cost`` workload (held/unheld chain cost), on a node of its own."""
    args = suite.args
    if args.url is not None:
        print("broker-cost: skipped with --url (it reads a private node's CPU and counters)")
        return []
    seconds = args.broker_cost_seconds or (3.0 if suite.quick else 5.0)
    print(
        f"broker-cost: {seconds} s at each of {args.broker_cost_rates} msg/s, "
        "a private node with the management plugin ..."
    )
    rows = await run(
        rates=tuple(args.broker_cost_rates),
        seconds=seconds,
        min_delay=args.min_delay,
        max_delay=args.max_delay,
        streams=tuple(args.broker_cost_streams or STREAMS),
        management=not args.broker_cost_no_management,
    )
    print(table(rows))
    return suite_rows(rows)
