"""Compare a live delay chain with the configuration it should match. Pure.

:func:`compare` takes a :class:`DelayTopology` and a
:class:`~delayed_retry.admin.live_chain.LiveChain` (what the broker reports,
read by :mod:`delayed_retry.admin.management`) and returns one
:class:`Difference` per problem, each with the fix an operator can run. Used by
``delayed-retry topology verify``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from delayed_retry.admin.chain_bindings import (
    binding_style,
    expected_bindings,
    retired_bindings,
    skip_only_bindings,
)
from delayed_retry.admin.live_chain import Binding, LiveChain, applying_policies
from delayed_retry.chain.topology import IN_MEMORY_ARGUMENTS, DelayTopology, amqp_arguments
from delayed_retry.rabbitmq.versions import keeps_bodies_in_memory

__all__ = [
    "HARMFUL_POLICY_KEYS",
    "Difference",
    "collapse_absent_chain",
    "compare",
    "declare_hint",
    "missing_queue_fix",
]

HARMFUL_POLICY_KEYS = ("message-ttl", "expires", "max-length", "max-length-bytes")
"""Policy keys that change what the chain does to a waiting message.

A lower ``message-ttl`` cuts delays short (the lower of policy and argument
wins); ``expires`` deletes an idle queue with its messages; length limits drop
or refuse delayed messages. Other keys (a ``dead-letter-exchange``, say) lose
to the queue's own arguments.
"""


@dataclass(frozen=True)
class Difference:
    """One way the live chain differs from the configuration, and what to do about it."""

    object: str
    problem: str
    fix: str

    def line(self) -> str:
        return f"{self.object}: {self.problem}. Fix: {self.fix}"


def declare_hint(options: str, queues: Iterable[str] = ()) -> str:
    """The ``delayed-retry declare`` line that repairs a chain selected by ``options``.

    ``options`` are the command-line options of the chain, rendered by the command line
    (``delayed_retry.cli.common.topology_options``); the fixes only quote them.
    """
    binds = "".join(f" --bind {q}" for q in queues)
    return f"delayed-retry declare {options}{binds}"


def missing_queue_fix(options: str, queues: Iterable[str]) -> str:
    """The fix for a work queue named to check that does not exist (``queue_not_found``'s)."""
    return (
        "check the name and the vhost, or create it: its consumer declares it, or run "
        f"{declare_hint(options, queues)} --create"
    )


def _mismatched(
    wanted: Mapping[str, Any], live: Mapping[str, Any], *, tolerated: Iterable[str] = ()
) -> list[str]:
    out = []
    tolerated = frozenset(tolerated)
    for key, value in wanted.items():
        if live.get(key) != value:
            got = "missing" if key not in live else repr(live[key])
            out.append(f"{key}={got} (wants {value!r})")
    out += [
        f"{key}={live[key]!r} (not set by the chain)"
        for key in sorted(live)
        if key.startswith("x-") and key not in wanted and key not in tolerated
    ]
    return out


def _policy_differences(
    topology: DelayTopology, name: str, live: LiveChain, queue_type: str, ttl: int | None
) -> list[Difference]:
    out = []
    for policy in applying_policies(live.policies, name, kind="queue", queue_type=queue_type):
        definition = policy.definition
        harmful = []
        for key in HARMFUL_POLICY_KEYS:
            if key not in definition:
                continue
            value = definition[key]
            if key == "message-ttl" and ttl is not None and isinstance(value, int) and value >= ttl:
                continue  # the queue's own, lower TTL wins
            harmful.append(f"{key}={value!r}")
        if harmful:
            out.append(
                Difference(
                    f"queue {name!r}",
                    f"{'operator policy' if policy.operator else 'policy'} {policy.name!r} "
                    f"applies to it with {', '.join(harmful)}, which "
                    "cuts delays short or drops waiting messages",
                    f"change the policy's pattern so it does not match names starting with "
                    f"'{topology.prefix}.' (rabbitmqctl set_policy {policy.name} ...)",
                )
            )
    return out


_IN_MEMORY_POLICY_KEYS = tuple(key.removeprefix("x-") for key in IN_MEMORY_ARGUMENTS)
"""The same limits as policy keys: ``max-in-memory-length`` and ``-bytes``."""


def _memory_differences(
    topology: DelayTopology, live: LiveChain, broker_version: tuple[int, int] | None
) -> list[Difference]:
    """On RabbitMQ 3.10–3.11: level queues whose waiting bodies nothing keeps on disk."""
    if topology.queue_type != "quorum" or not keeps_bodies_in_memory(broker_version):
        return []
    in_memory = []
    for level in range(topology.levels):
        name = topology.level_name(level)
        queue = live.queues.get(name)
        if queue is None or any(key in queue.arguments for key in IN_MEMORY_ARGUMENTS):
            continue
        policies = applying_policies(live.policies, name, kind="queue", queue_type="quorum")
        if not any(key in p.definition for p in policies for key in _IN_MEMORY_POLICY_KEYS):
            in_memory.append(name)
    if not in_memory:
        return []
    assert broker_version is not None
    version = f"{broker_version[0]}.{broker_version[1]}"
    return [
        Difference(
            f"level queues of chain {topology.prefix!r}",
            f"no policy sets max-in-memory-length on {len(in_memory)} of them (from "
            f"{in_memory[0]!r}), so RabbitMQ {version} may keep the bodies of messages waiting "
            "there in memory",
            f"{topology.memory_policy().command(vhost=live.vhost)} (once per vhost, on a broker "
            "node; it changes no queue argument)",
        )
    ]


def compare(
    topology: DelayTopology,
    live: LiveChain,
    *,
    options: str,
    queues: Iterable[str] = (),
    broker_version: tuple[int, int] | None = None,
) -> list[Difference]:
    """Every difference between ``live`` and ``topology``, and ``queues``' bindings and parking.

    ``options`` are the chain's command-line options the fixes quote
    (``delayed_retry.cli.common.topology_options`` renders them).

    A level queue declared with ``x-max-in-memory-length`` or ``-bytes`` is not
    a difference: declaring the chain uses such a queue as it is. With
    ``broker_version`` (major, minor) 3.10 or 3.11, level queues that no policy
    keeps on disk are reported (see :meth:`DelayTopology.memory_policy`).
    """
    queues = tuple(queues)
    hint = declare_hint(options, queues)
    other_settings = (
        f"the chain under prefix {topology.prefix!r} was declared with other settings; "
        "check --prefix/--levels/--unit-ms/--queue-type, or move its messages to a new prefix "
        f"(delayed-retry topology migrate) and remove this one (delayed-retry teardown)"
    )
    out: list[Difference] = []
    for ex in topology.exchanges():
        got = live.exchanges.get(ex.name)
        what = f"exchange {ex.name!r}"
        if got is None:
            out.append(Difference(what, "missing", f"run {hint}"))
            continue
        if got.type != ex.type:
            out.append(
                Difference(what, f"is {got.type}, the chain wants {ex.type}", other_settings)
            )
        if not got.durable:
            out.append(Difference(what, "is not durable", f"delete it, then run {hint}"))
        wanted = {"alternate-exchange": ex.alternate_exchange} if ex.alternate_exchange else {}
        bad = _mismatched(wanted, got.arguments)
        if bad:
            out.append(Difference(what, f"arguments differ: {'; '.join(bad)}", other_settings))
    specs = [*topology.queues(), *(topology.parking_queue_spec(q) for q in queues)]
    for spec in specs:
        got_q = live.queues.get(spec.name)
        what = f"queue {spec.name!r}"
        if got_q is None:
            out.append(Difference(what, "missing", f"run {hint}"))
            continue
        if not got_q.durable:
            out.append(Difference(what, "is not durable", other_settings))
        tolerated = IN_MEMORY_ARGUMENTS if topology.is_level_queue(spec.name) else ()
        bad = _mismatched(
            dict(amqp_arguments(spec.arguments)), got_q.arguments, tolerated=tolerated
        )
        if bad:
            out.append(Difference(what, f"arguments differ: {'; '.join(bad)}", other_settings))
        ttl = spec.arguments.get("x_message_ttl")
        queue_type = str(spec.arguments.get("x_queue_type", "classic"))
        out += _policy_differences(topology, spec.name, live, queue_type, ttl)
    for queue in queues:
        if queue not in live.queues:
            out.append(
                Difference(
                    f"queue {queue!r}",
                    "missing",
                    missing_queue_fix(options, queues),
                )
            )
    wanted_bindings = expected_bindings(topology, queues)
    missing = wanted_bindings - live.bindings
    retired = retired_bindings(topology)
    style = binding_style(topology, live.bindings)
    if style == "pass-through" and topology.skips_zeros:
        # One line for a pass-through chain, not one per skip-zero binding it lacks.
        out.append(
            Difference(
                f"bindings of chain {topology.prefix!r}",
                "are pass-through bindings (as declared before 0.1.0): each level exchange "
                "passes a message on to the next lower one, so every delayed message passes "
                "every level exchange below its entry (correct, but up to three times the "
                "broker's routing work)",
                f"run {hint} (it adds the skip-zero bindings, then removes these); a process "
                "that still declares the pass-through bindings adds them back when it "
                "reconnects, without harm",
            )
        )
        missing -= skip_only_bindings(topology)
    elif live.bindings & retired:
        out.append(
            Difference(
                f"bindings of chain {topology.prefix!r}",
                f"{len(live.bindings & retired)} pass-through binding(s) (as declared before "
                "0.1.0) are still there, beside the skip-zero ones: a process that declares "
                "them is running, or was. Every message still reaches its queue once, "
                "but passes every level exchange again",
                f"once no process declares pass-through bindings, run {hint}, which removes them",
            )
        )
    for binding in sorted(missing, key=_order):
        out.append(Difference(binding.describe(), "missing", f"run {hint}"))
    out += _stray_bindings(topology, live.bindings - wanted_bindings - retired)
    out += _memory_differences(topology, live, broker_version)
    if all(ex.name not in live.exchanges for ex in topology.exchanges()):
        # Nothing of it exists: its missing bindings say nothing more.
        out = [d for d in out if not (d.object.startswith("binding ") and d.problem == "missing")]
    return collapse_absent_chain(topology, out, options=options)


def _order(binding: Binding) -> tuple[str, str, str]:
    return binding.source, binding.destination, binding.routing_key


def _stray_bindings(topology: DelayTopology, extra: Iterable[Binding]) -> list[Difference]:
    """Bindings on the chain's level and delivery exchanges that the chain did not make."""
    levels = {topology.level_name(level) for level in range(topology.levels)}
    out = []
    for binding in sorted(extra, key=_order):
        remove = (
            f"remove it (rabbitmqadmin delete binding source={binding.source} "
            f"destination={binding.destination} destination_type={binding.destination_type} "
            f"properties_key={binding.properties_key or binding.routing_key or '~'})"
        )
        if binding.source in levels:
            out.append(
                Difference(
                    binding.describe(),
                    "is not part of the chain: delayed messages matching it are copied there",
                    remove,
                )
            )
        elif binding.source == topology.delivery_exchange:
            words = binding.routing_key.split(".")
            if (
                words[: topology.levels] != ["*"] * topology.levels
                or ".".join(words[topology.levels :]) != binding.destination
            ):
                out.append(
                    Difference(
                        binding.describe(),
                        f"does not have the form of {topology.levels} '*' words then the "
                        "queue's own name, so it delivers other queues' messages or none",
                        remove,
                    )
                )
    return out


def collapse_absent_chain(
    topology: DelayTopology, differences: list[Difference], *, options: str
) -> list[Difference]:
    """One line instead of one per object when none of the chain exists (a wrong prefix?)."""
    names = {f"exchange {e.name!r}" for e in topology.exchanges()}
    names |= {f"queue {q.name!r}" for q in topology.queues()}
    absent = {d.object for d in differences if d.problem == "missing" and d.object in names}
    if absent != names:
        return differences
    return [
        Difference(
            f"chain {topology.prefix!r}",
            f"does not exist on this vhost (none of its {len(names)} exchanges and queues)",
            "check --prefix and --levels (or $DELAYED_RETRY_PREFIX) against the consumers', "
            f"or create it: {declare_hint(options)}",
        ),
        *(d for d in differences if d.object not in names),
    ]
