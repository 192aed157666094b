"""read_rejection: which queue a dead-lettered message names, and how often it failed."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from delayed_retry.consumer.rejections import read_rejection

QUEUES = frozenset({"orders", "billing"})
WHEN = datetime(2026, 1, 1, tzinfo=UTC)


def death(queue: str = "orders", reason: str = "rejected", count: int = 1) -> dict[str, Any]:
    return {
        "queue": queue,
        "reason": reason,
        "count": count,
        "exchange": "shop",
        "routing-keys": ["order.created"],
        "time": WHEN,
    }


def test_first_rejection_is_attempt_one_with_the_original_route() -> None:
    r = read_rejection({"x-death": [death()]}, queues=QUEUES)
    assert r.queue == "orders" and r.problem is None and r.state is not None
    assert (r.state.retries, r.state.attempt) == (0, 1)
    assert (r.state.original_exchange, r.state.original_routing_key) == ("shop", "order.created")


def test_our_counter_counts_and_our_original_route_wins_over_the_chain_hop() -> None:
    headers = {
        "x-retry": 2,
        "x-retry-original-exchange": "shop",
        "x-retry-original-routing-key": "order.created",
        # A retry comes back through the chain: the death names the level exchange.
        "x-death": [{**death(), "exchange": "delayed-retry.level.03"}],
    }
    r = read_rejection(headers, queues=QUEUES)
    assert r.state is not None
    assert r.state.retries == 2
    assert r.state.original_exchange == "shop"


def test_a_broker_count_above_one_counts_the_earlier_rejections() -> None:
    # 3.10 with an unstripped history, or a 4.x count: 5 rejections, this one included.
    r = read_rejection({"x-death": [death(count=5)], "x-retry": 1}, queues=QUEUES)
    assert r.state is not None and r.state.retries == 4


def test_only_the_newest_death_decides_the_queue() -> None:
    headers = {"x-death": [death("elsewhere"), death("orders")]}
    r = read_rejection(headers, queues=QUEUES)
    assert (r.queue, r.claimed_queue, r.problem) == (None, "elsewhere", "unknown-queue")


def test_no_or_malformed_death_is_a_problem_not_a_route() -> None:
    for headers in (
        None,
        {},
        {"x-death": "x"},
        {"x-death": [{"reason": "rejected"}]},
        {"x-death": [7]},
    ):
        r = read_rejection(headers, queues=QUEUES)
        assert (r.queue, r.problem) == (None, "no-death-record")


def test_a_forged_retry_queue_header_is_not_a_destination() -> None:
    headers = {"x-retry-queue": "billing", "x-death": [death("orders")]}
    r = read_rejection(headers, queues=QUEUES)
    assert r.queue == "orders"


@given(
    st.dictionaries(
        st.text(max_size=12),
        st.recursive(
            st.none() | st.integers() | st.text(),
            lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
            max_leaves=8,
        ),
    )
)
def test_never_raises_and_only_names_known_queues(headers: dict[str, Any]) -> None:
    r = read_rejection(headers, queues=QUEUES)
    assert r.queue is None or r.queue in QUEUES
