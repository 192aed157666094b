"""compare(): every way a live chain can differ from its configuration, each with a fix."""

from __future__ import annotations

from dataclasses import replace

from delayed_retry import DelayTopology
from delayed_retry.admin.chain_bindings import expected_bindings
from delayed_retry.admin.chain_diff import compare
from delayed_retry.admin.live_chain import Binding, LiveChain, LiveExchange, LiveQueue, Policy
from delayed_retry.chain.topology import amqp_arguments
from delayed_retry.cli.common import topology_options
from delayed_retry.cli.output import format_at_most

T = DelayTopology(prefix="p", levels=4)
OPTIONS = topology_options(T)


def live_as_declared(topology: DelayTopology = T, queues: tuple[str, ...] = ()) -> LiveChain:
    """What the broker reports right after ``delayed-retry declare`` with these settings."""
    exchanges = {
        ex.name: LiveExchange(
            name=ex.name,
            type=ex.type,
            arguments={"alternate-exchange": ex.alternate_exchange}
            if ex.alternate_exchange
            else {},
        )
        for ex in topology.exchanges()
    }
    specs = [*topology.queues(), *(topology.parking_queue_spec(q) for q in queues)]
    live_queues = {
        s.name: LiveQueue(name=s.name, arguments=dict(amqp_arguments(s.arguments))) for s in specs
    }
    live_queues |= {q: LiveQueue(name=q) for q in queues}
    return LiveChain(
        exchanges=exchanges,
        queues=live_queues,
        bindings=frozenset(expected_bindings(topology, queues)),
    )


def test_a_chain_as_declared_has_no_difference() -> None:
    assert compare(T, live_as_declared(), options=OPTIONS) == []
    assert (
        compare(T, live_as_declared(queues=("orders",)), queues=["orders"], options=OPTIONS) == []
    )


def test_missing_objects_point_to_declare_with_the_same_settings() -> None:
    live = live_as_declared()
    queues = dict(live.queues)
    del queues["p.level.02"]
    diffs = compare(T, replace(live, queues=queues), queues=["orders"], options=OPTIONS)
    lines = [d.line() for d in diffs]
    assert any(
        line.startswith(
            "queue 'p.level.02': missing. Fix: run delayed-retry declare --prefix p "
            "--levels 4 --unit-ms 1 --queue-type quorum --bind orders"
        )
        for line in lines
    ), lines
    # The work queue's fix creates it; declare --bind alone creates only its parking queue.
    assert any(
        line.startswith("queue 'orders': missing. Fix: check the name and the vhost, or create it")
        and line.endswith("--bind orders --create")
        for line in lines
    ), lines
    assert any("queue 'orders.parking': missing" in line for line in lines)
    assert any(line.startswith("binding 'p.delivery-4' → queue 'orders'") for line in lines)


def test_a_chain_that_does_not_exist_is_one_line() -> None:
    empty = LiveChain(
        exchanges={}, queues={"orders": LiveQueue(name="orders")}, bindings=frozenset()
    )
    diffs = compare(T, empty, queues=["orders"], options=OPTIONS)
    assert [d.object for d in diffs] == ["chain 'p'", "queue 'orders.parking'"]
    assert "check --prefix and --levels" in diffs[0].fix


def test_other_arguments_are_named_with_both_values() -> None:
    live = live_as_declared()
    queues = dict(live.queues)
    level = queues["p.level.01"]
    queues["p.level.01"] = replace(
        level, arguments={**level.arguments, "x-message-ttl": 4, "x-max-length": 10}
    )
    exchanges = dict(live.exchanges)
    exchanges["p.level.03"] = LiveExchange(name="p.level.03", type="direct")
    diffs = compare(T, replace(live, queues=queues, exchanges=exchanges), options=OPTIONS)
    text = "\n".join(d.line() for d in diffs)
    assert "queue 'p.level.01': arguments differ: x-message-ttl=4 (wants 2)" in text
    assert "x-max-length=10 (not set by the chain)" in text
    assert "exchange 'p.level.03': is direct, the chain wants topic" in text
    assert "alternate-exchange=missing (wants 'p.unroutable')" in text
    assert "delayed-retry topology migrate" in text


def test_policies_that_cut_delays_or_drop_messages_are_reported() -> None:
    live = live_as_declared()
    policies = (
        Policy(
            name="short", pattern=r"^p\.level\.03$", definition={"message-ttl": 1, "max-length": 5}
        ),
        # Lower priority than "short" on level 03: does not apply there.
        Policy(name="all-ttl", pattern="^p", priority=-1, definition={"message-ttl": 1}),
        Policy(
            name="classic-only",
            pattern="^p",
            priority=9,
            apply_to="classic_queues",
            definition={"expires": 1},
        ),
        Policy(
            name="exchanges",
            pattern="^p",
            priority=9,
            apply_to="exchanges",
            definition={"expires": 1},
        ),
        # The queues' own shorter TTL wins over this one.
        Policy(name="long-ttl", pattern=r"^p\.level\.0[012]$", definition={"message-ttl": 10_000}),
        Policy(
            name="harmless", pattern=r"^p\.unroutable$", definition={"dead-letter-exchange": "x"}
        ),
    )
    diffs = compare(T, replace(live, policies=policies), options=OPTIONS)
    assert sorted(d.object for d in diffs) == [
        "queue 'p.level.03'",
        "queue 'p.parking.alerts'",
        "queue 'p.rejected'",
    ]
    by_object = {d.object: d for d in diffs}
    assert "queue 'p.level.02'" not in by_object and "queue 'p.unroutable'" not in by_object
    level3 = by_object["queue 'p.level.03'"]
    assert "policy 'short' applies to it with message-ttl=1, max-length=5" in level3.problem
    assert "names starting with 'p.'" in level3.fix
    # "all-ttl" is the only one matching the rejected queue.
    assert "policy 'all-ttl'" in by_object["queue 'p.rejected'"].problem
    # The classic alerts queue gets "classic-only" (priority 9) instead.
    assert (
        "policy 'classic-only' applies to it with expires=1"
        in by_object["queue 'p.parking.alerts'"].problem
    )


def test_stray_bindings_on_the_chain_are_reported() -> None:
    live = live_as_declared()
    stray = {
        # What a parking replay with the wrong prefix used to add.
        Binding(
            source="p.level.02", destination_type="queue", destination="orders", routing_key="#"
        ),
        # A delivery binding made for another level count.
        Binding(
            source="p.delivery-4",
            destination_type="queue",
            destination="orders",
            routing_key="*.*.orders",
        ),
        # Fine: another consumer's delivery binding.
        Binding(
            source="p.delivery-4",
            destination_type="queue",
            destination="billing",
            routing_key="*.*.*.*.billing",
        ),
    }
    diffs = compare(T, replace(live, bindings=live.bindings | stray), options=OPTIONS)
    objects = sorted(d.object for d in diffs)
    assert objects == [
        "binding 'p.delivery-4' → queue 'orders' (key '*.*.orders')",
        "binding 'p.level.02' → queue 'orders' (key '#')",
    ]
    assert all("rabbitmqadmin delete binding" in d.fix for d in diffs)


def test_upper_bounds_are_shown_rounded_up() -> None:
    shown = [format_at_most(s) for s in (0.25, 1.5, 90, 3600, 4194.303, 86400 * 3 + 4 * 3600 + 1)]
    assert shown == ["250 ms", "1.5 s", "1 m 30 s", "1 h", "1 h 10 m", "3 d 5 h"]


def _with_level_arguments(live: LiveChain, extra: dict[str, int]) -> LiveChain:
    queues = {
        name: replace(q, arguments={**q.arguments, **extra}) if ".level." in name else q
        for name, q in live.queues.items()
    }
    return replace(live, queues=queues)


def test_level_queues_with_an_in_memory_limit_agree_with_what_declaring_accepts() -> None:
    live = _with_level_arguments(
        live_as_declared(), {"x-max-in-memory-length": 0, "x-max-in-memory-bytes": 0}
    )
    assert compare(T, live, options=OPTIONS) == []
    assert (
        compare(T, live, broker_version=(3, 10), options=OPTIONS) == []
    )  # they keep bodies on disk already
    # Elsewhere the argument is still foreign to the chain.
    queues = dict(live.queues)
    queues["p.rejected"] = replace(queues["p.rejected"], arguments={"x-max-in-memory-length": 0})
    (diff,) = compare(T, replace(live, queues=queues), options=OPTIONS)
    assert diff.object == "queue 'p.rejected'"
    assert "x-max-in-memory-length=0 (not set by the chain)" in diff.problem


def test_on_3_10_and_3_11_level_queues_without_a_memory_policy_are_reported() -> None:
    live = live_as_declared()
    for version in ((3, 10), (3, 11)):
        (diff,) = compare(T, live, broker_version=version, options=OPTIONS)
        assert diff.object == "level queues of chain 'p'"
        assert "no policy sets max-in-memory-length on 4 of them (from 'p.level.00')" in (
            diff.problem
        )
        assert f"RabbitMQ {version[0]}.{version[1]} may keep the bodies" in diff.problem
        assert diff.fix.startswith(T.memory_policy().command())
    for later in ((3, 12), (4, 0), None):
        assert compare(T, live, broker_version=later, options=OPTIONS) == []
    classic = DelayTopology(prefix="p", levels=4, queue_type="classic")
    assert (
        compare(
            classic,
            live_as_declared(classic),
            broker_version=(3, 10),
            options=topology_options(classic),
        )
        == []
    )


def test_the_memory_policy_or_any_in_memory_limit_satisfies_3_10() -> None:
    live = live_as_declared()
    policy = T.memory_policy()
    ours = Policy(
        name=policy.name,
        pattern=policy.pattern,
        apply_to=policy.apply_to,
        definition=policy.definition,
        operator=True,
    )
    assert (
        compare(T, replace(live, policies=(ours,)), broker_version=(3, 10), options=OPTIONS) == []
    )
    theirs = Policy(name="mine", pattern="^p[.]", definition={"max-in-memory-bytes": 10_000})
    assert (
        compare(T, replace(live, policies=(theirs,)), broker_version=(3, 10), options=OPTIONS) == []
    )
    # An operator policy of higher priority without the key wins over ours on every level.
    other = Policy(
        name="cap", pattern="^p", priority=5, definition={"max-length": 10**9}, operator=True
    )
    (diff,) = [
        d
        for d in compare(
            T, replace(live, policies=(ours, other)), broker_version=(3, 10), options=OPTIONS
        )
        if d.object.startswith("level queues")
    ]
    assert "on 4 of them" in diff.problem
