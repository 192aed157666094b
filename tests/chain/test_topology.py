"""DelayTopology: names, arguments, validation, delays, and a walk of the chain by topic rules."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_retry import ConfigurationError, DelayOutOfRangeError, DelayTopology
from delayed_retry.chain.topology import amqp_arguments

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def topic_matches(binding: str, key: str) -> bool:
    """RabbitMQ topic matching: ``*`` is one word, ``#`` zero or more."""
    parts = []
    for word in binding.split("."):
        parts.append(r"[^.]*" if word == "*" else (r".*" if word == "#" else re.escape(word)))
    pattern = r"\.".join(parts).replace(r"\..*", r"(\..*)?")
    return re.fullmatch(pattern, key) is not None


def walk(topology: DelayTopology, units: int, destination: str) -> tuple[list[int], str]:
    """Follow a message through the declared bindings: the level queues it waits in, and the end."""
    route = topology.route(units, destination)
    queue_bindings = {q.name: q for q in topology.queues()}
    exchange_bindings = topology.exchange_bindings()
    exchange, waited = route.exchange, list[int]()
    for _ in range(topology.levels * 2 + 2):
        if exchange == topology.delivery_exchange:
            _, key = topology.delivery_binding(destination)
            assert topic_matches(key, route.routing_key)
            return waited, destination
        into_queue = [
            name
            for name, spec in queue_bindings.items()
            if any(
                ex == exchange and topic_matches(k, route.routing_key) for ex, k in spec.bindings
            )
        ]
        onward = [
            dest
            for dest, src, k in exchange_bindings
            if src == exchange and topic_matches(k, route.routing_key)
        ]
        assert len(into_queue) + len(onward) == 1, (exchange, into_queue, onward)
        if into_queue:
            level = int(into_queue[0].rsplit(".", 1)[1])
            waited.append(level)
            ttl = queue_bindings[into_queue[0]].arguments["x_message_ttl"]
            assert ttl == (1 << level) * topology.unit_ms
            exchange = queue_bindings[into_queue[0]].arguments["x_dead_letter_exchange"]
        else:
            exchange = onward[0]
    raise AssertionError("the chain did not end")


def test_topic_matcher_follows_rabbitmq_rules() -> None:
    assert topic_matches("*.*.q", "0.1.q")
    assert not topic_matches("*.*.q", "0.1.q.x")
    assert topic_matches("1.#", "1.0.q")
    assert not topic_matches("1.#", "0.1.q")
    assert topic_matches("*.0.#", "1.0.q.x")


def test_names_follow_the_prefix() -> None:
    t = DelayTopology(prefix="p", levels=12)
    assert t.level_name(3) == "p.level.03"
    assert t.level_name(11) == "p.level.11"
    assert t.delivery_exchange.startswith("p.delivery")
    assert t.unroutable_exchange == t.unroutable_queue == "p.unroutable"
    assert t.parking_exchange == "p.parking"
    assert t.alerts_queue == "p.parking.alerts"
    assert t.default_parking_queue("orders") == "orders.parking"


def test_quorum_level_queues_use_at_least_once_dead_lettering() -> None:
    t = DelayTopology(prefix="p", levels=3, unit=timedelta(milliseconds=5))
    level2 = next(q for q in t.queues() if q.name == "p.level.02")
    assert amqp_arguments(level2.arguments) == {
        "x-queue-type": "quorum",
        "x-message-ttl": 20,
        "x-dead-letter-exchange": "p.level.01",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    level0 = next(q for q in t.queues() if q.name == "p.level.00")
    assert level0.arguments["x_dead_letter_exchange"] == t.delivery_exchange


def test_classic_level_queues_have_no_quorum_only_arguments() -> None:
    t = DelayTopology(prefix="p", levels=2, queue_type="classic")
    for spec in t.queues():
        assert "x_dead_letter_strategy" not in spec.arguments
        if spec.name != t.alerts_queue:
            assert spec.arguments["x_queue_type"] == "classic"


def test_every_exchange_but_the_unroutable_one_has_the_alternate_exchange() -> None:
    t = DelayTopology(prefix="p", levels=4)
    specs = {e.name: e for e in t.exchanges()}
    assert specs["p.unroutable"].type == "fanout"
    assert specs["p.unroutable"].alternate_exchange is None
    for name, spec in specs.items():
        if name != "p.unroutable":
            assert spec.alternate_exchange == "p.unroutable", name
    assert len(specs) == 4 + 4  # unroutable, delivery, parking, rejected, 4 levels


def test_alerts_queue_gets_parked_and_unroutable_copies() -> None:
    t = DelayTopology(prefix="p", levels=4)
    alerts = next(q for q in t.queues() if q.name == t.alerts_queue)
    assert set(alerts.bindings) == {("p.parking", "#"), ("p.unroutable", "")}
    assert alerts.arguments["x_overflow"] == "drop-head"
    assert t.parking_queue_spec("orders").bindings == (("p.parking", "orders"),)
    assert t.parking_queue_spec("orders", "held").name == "held"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"prefix": ""}, "prefix"),
        ({"prefix": "amq.x"}, "prefix"),
        ({"prefix": "a b"}, "prefix"),
        ({"levels": 0}, "levels"),
        ({"levels": 49}, "levels"),
        ({"levels": True}, "levels"),
        ({"levels": 3.0}, "levels"),
        ({"unit": timedelta(microseconds=500)}, "whole number of milliseconds"),
        ({"unit": 0.0015}, "whole number of milliseconds"),
        ({"unit": -1}, "negative"),
        ({"unit": "1s"}, "not a duration"),
        ({"queue_type": "stream"}, "queue_type"),
        ({"levels": 40}, r"TTL of 549755813888 ms.*at most 39 levels"),
        ({"levels": 30, "unit": 1}, "at most 29 levels"),
        ({"prefix": "p" * 241}, "at most 240"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        DelayTopology(**kwargs)  # type: ignore[arg-type]


def test_the_longest_chains_rabbitmq_accepts_are_allowed() -> None:
    assert DelayTopology(levels=39).max_delay > timedelta(days=365 * 17)
    assert DelayTopology(levels=29, unit=timedelta(seconds=1)).levels == 29
    assert DelayTopology(prefix="p" * 240).alerts_queue.endswith(".parking.alerts")


def test_unit_in_seconds_or_timedelta() -> None:
    assert DelayTopology(levels=35, unit=0.01).unit_ms == 10
    assert DelayTopology(levels=29, unit=timedelta(seconds=1)).unit_ms == 1000
    assert DelayTopology(levels=4, unit=0.01).max_delay == timedelta(milliseconds=150)


def test_units_until_rounds_up_and_refuses_too_long_delays() -> None:
    t = DelayTopology(prefix="p", levels=4, unit=0.01)
    assert t.units_until(NOW + timedelta(milliseconds=11), now=NOW) == 2
    assert t.units_until(NOW - timedelta(seconds=5), now=NOW) == 0
    assert t.units_until(NOW + timedelta(milliseconds=150), now=NOW) == 15
    with pytest.raises(DelayOutOfRangeError, match=r"chain .p. \(4 levels of 10 ms\); add levels"):
        t.units_until(NOW + timedelta(milliseconds=151), now=NOW)


@given(
    st.integers(min_value=0, max_value=10**9),
    st.integers(min_value=0, max_value=999_999),
    st.sampled_from([1, 3, 10, 1000]),
)
def test_units_until_is_never_early(delay_us: int, now_us: int, unit_ms: int) -> None:
    t = DelayTopology(prefix="p", levels=29, unit=timedelta(milliseconds=unit_ms))
    now = NOW + timedelta(microseconds=now_us)
    due = now + timedelta(microseconds=delay_us)
    units = t.units_until(due, now=now)
    assert timedelta(milliseconds=units * unit_ms) >= due - now
    assert timedelta(milliseconds=(units - 1) * unit_ms) < due - now or units == 0


def test_destination_checks_raise_configuration_errors() -> None:
    t = DelayTopology(prefix="p", levels=4)
    with pytest.raises(ConfigurationError, match=r"queue 'a\.\*' cannot receive delays"):
        t.route(1, "a.*")
    with pytest.raises(ConfigurationError, match="amq"):
        t.delivery_binding("amq.gen-x")


@pytest.mark.parametrize(
    "topology", [DelayTopology(prefix="p", levels=12), DelayTopology.nservicebus()]
)
def test_a_route_enters_at_its_highest_levels_exchange_and_leaves_the_topology_as_it_was(
    topology: DelayTopology,
) -> None:
    before = (repr(topology), hash(topology))
    for level in range(topology.levels):
        assert topology.route(1 << level, "q").exchange == topology.level_name(level)
        assert topology.route((2 << level) - 1, "q").exchange == topology.level_name(level)
    with pytest.raises(ValueError, match="do not fit"):
        topology.route(1 << topology.levels, "q")
    assert (repr(topology), hash(topology)) == before
    assert topology == DelayTopology(
        prefix=topology.prefix,
        levels=topology.levels,
        unit=topology.unit,
        queue_type=topology.queue_type,
        naming=topology.naming,
    )


@given(
    st.integers(min_value=1, max_value=12).flatmap(
        lambda n: st.tuples(st.just(n), st.integers(min_value=0, max_value=(1 << n) - 1))
    )
)
def test_walking_the_bindings_waits_in_exactly_the_one_bits(levels_units: tuple[int, int]) -> None:
    levels, units = levels_units
    t = DelayTopology(prefix="p", levels=levels)
    waited, end = walk(t, units, "orders.eu")
    assert end == "orders.eu"
    assert waited == [lvl for lvl in range(levels - 1, -1, -1) if units >> lvl & 1]
    assert sum(1 << lvl for lvl in waited) == units


@pytest.mark.parametrize(
    ("topology", "levels", "others"),
    [
        (
            DelayTopology(prefix="a.b-c", levels=12),
            "a.b-c.level.",
            ["a.b-c.unroutable", "a.b-c.level.x"],
        ),
        (DelayTopology.nservicebus(), "nsb.v2.delay-level-", ["nsb.v2.delay-delivery"]),
    ],
)
def test_the_memory_policy_matches_the_level_queues_and_nothing_else(
    topology: DelayTopology, levels: str, others: list[str]
) -> None:
    policy = topology.memory_policy()
    assert policy.definition == {"max-in-memory-length": 0}
    pattern = re.compile(policy.pattern)  # RabbitMQ's re:run searches the same way
    for level in range(topology.levels):
        assert pattern.search(topology.level_name(level))
        assert topology.is_level_queue(topology.level_name(level))
    names = [s.name for s in topology.queues() if not topology.is_level_queue(s.name)]
    names += [topology.default_parking_queue("orders"), f"x{levels}01", f"{levels}01.parking"]
    for name in [*names, *others]:
        assert not pattern.search(name), name
        assert not topology.is_level_queue(name)
    assert not topology.is_level_queue(topology.level_name(topology.levels))


def test_the_memory_policy_command_is_an_operator_policy_for_one_vhost() -> None:
    command = DelayTopology(prefix="orders").memory_policy().command(vhost="shop floor")
    assert command == (
        "rabbitmqctl set_operator_policy --vhost 'shop floor' --apply-to queues --priority 0 "
        "orders.levels-on-disk '^orders\\.level\\.[0-9]+$' '{\"max-in-memory-length\":0}'"
    )


def test_nothing_declared_is_refused_or_deprecated_on_rabbitmq_4_3() -> None:
    # 4.3 denies (or deprecates) transient non-exclusive queues, x-queue-mode and global QoS:
    # every queue the library declares is durable, and none of them is asked for anywhere.
    topology = DelayTopology(prefix="p")
    specs = [
        *topology.queues(),
        topology.parking_queue_spec("q"),
        topology.forward_queue_spec("x"),
        topology.inbox_queue_spec("x.delay"),
    ]
    for spec in specs:
        assert "x-queue-mode" not in amqp_arguments(spec.arguments), spec.name
    package = Path(__file__).parents[2] / "src" / "delayed_retry"
    for path in package.rglob("*.py"):
        text = path.read_text()
        for refused in ("durable=False", "x-queue-mode", "global_=True"):
            assert refused not in text, f"{path}: {refused}"
