"""Tests of the leader policies, the rebalance command and the lopsided-chain warning."""

from __future__ import annotations

import re

from delayed_retry.chain.leaders import (
    leader_policies,
    leader_spread,
    lopsided_warning,
    rebalance_args,
    rebalance_command,
    spread_bound,
)
from delayed_retry.chain.topology import DelayTopology

TOPOLOGY = DelayTopology(prefix="orders-delays", levels=9)
NODES = ["rabbit@a", "rabbit@b", "rabbit@c"]


def _matches(pattern: str, name: str) -> bool:
    return re.search(pattern, name) is not None


def test_the_policy_on_3x_places_quorum_leaders_least_leaders_and_the_alert_queue_min_masters() -> (
    None
):
    chain, alerts = leader_policies(TOPOLOGY, broker_major=3)
    assert dict(chain.definition) == {"queue-leader-locator": "least-leaders"}
    # 3.10 does not apply a policy naming queue-master-locator to quorum queues at all.
    assert "queue-master-locator" not in chain.definition
    assert dict(alerts.definition) == {"queue-master-locator": "min-masters"}
    assert alerts.priority is not None and chain.priority is not None
    assert alerts.priority > chain.priority
    assert _matches(alerts.pattern, TOPOLOGY.alerts_queue)
    assert not _matches(alerts.pattern, TOPOLOGY.level_name(0))


def test_the_policy_on_4x_is_one_balanced_policy() -> None:
    (policy,) = leader_policies(TOPOLOGY, broker_major=4)
    assert dict(policy.definition) == {"queue-leader-locator": "balanced"}
    assert not policy.operator


def test_the_policy_matches_every_queue_the_chain_owns_and_no_user_queue() -> None:
    (policy,) = leader_policies(TOPOLOGY, broker_major=4)
    owned = [TOPOLOGY.level_name(n) for n in range(TOPOLOGY.levels)]
    owned += [TOPOLOGY.unroutable_queue, TOPOLOGY.rejected_queue, TOPOLOGY.alerts_queue]
    owned += [TOPOLOGY.forward_queue("billing")]
    assert all(_matches(policy.pattern, name) for name in owned)
    for foreign in ("orders", "orders.parking", "orders-delaysX.level.00", "xorders-delays.a"):
        assert not _matches(policy.pattern, foreign)


def test_nservicebus_levels_are_matched_by_their_own_names() -> None:
    topology = DelayTopology.nservicebus()
    (policy,) = leader_policies(topology, broker_major=3)
    assert _matches(policy.pattern, topology.level_name(27))
    assert not _matches(policy.pattern, "nsb.v2.delay-delivery")


def test_the_rebalance_command_names_the_vhost_and_the_chain() -> None:
    args = rebalance_args(TOPOLOGY, vhost="/")
    assert args[:2] == ["rebalance", "quorum"]
    assert args[args.index("--vhost-pattern") + 1] == "^/$"
    assert _matches(args[args.index("--queue-pattern") + 1], TOPOLOGY.level_name(3))
    assert rebalance_command(TOPOLOGY, vhost="a.b").startswith("rabbitmq-queues rebalance quorum")
    assert "'^a\\.b$'" in rebalance_command(TOPOLOGY, vhost="a.b")


def test_the_spread_counts_level_leaders_per_node_most_first() -> None:
    leaders = {TOPOLOGY.level_name(n): NODES[0] if n < 6 else NODES[n % 3] for n in range(9)}
    leaders[TOPOLOGY.unroutable_queue] = NODES[2]  # not a level: not counted
    spread = leader_spread(TOPOLOGY, leaders)
    assert spread.per_node == {NODES[0]: 7, NODES[2]: 1, NODES[1]: 1}
    assert spread.busiest == (NODES[0], 7)


def test_a_lopsided_chain_is_named_with_its_fix_and_a_spread_one_is_not() -> None:
    bound = spread_bound(TOPOLOGY.levels, 3)
    assert bound == 4
    lopsided = leader_spread(TOPOLOGY, {TOPOLOGY.level_name(n): NODES[0] for n in range(9)})
    warning = lopsided_warning(TOPOLOGY, lopsided, nodes=NODES)
    assert warning is not None
    assert "'rabbit@a' leads 9 of the 9 level queues" in warning
    assert rebalance_command(TOPOLOGY) in warning
    spread = leader_spread(TOPOLOGY, {TOPOLOGY.level_name(n): NODES[n % 3] for n in range(9)})
    assert lopsided_warning(TOPOLOGY, spread, nodes=NODES) is None
    # 4 on a, 4 on b, 1 on c: at the bound, not past it.
    just_within = {TOPOLOGY.level_name(n): NODES[min(n // bound, 2)] for n in range(9)}
    assert lopsided_warning(TOPOLOGY, leader_spread(TOPOLOGY, just_within), nodes=NODES) is None


def test_a_single_node_or_unknown_leaders_never_warn() -> None:
    lopsided = leader_spread(TOPOLOGY, {TOPOLOGY.level_name(n): NODES[0] for n in range(9)})
    assert lopsided_warning(TOPOLOGY, lopsided, nodes=NODES[:1]) is None
    assert lopsided_warning(TOPOLOGY, leader_spread(TOPOLOGY, {}), nodes=NODES) is None
