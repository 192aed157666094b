"""plan_move: when a message found in another chain's level is due, never early."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from delayed_retry import DelayTopology
from delayed_retry.admin.other_chains import SourceChain, plan_move
from delayed_retry.durations import to_epoch_ms

NOW = datetime(2026, 6, 1, tzinfo=UTC)
KOMBU = SourceChain.kombu()
NSB = SourceChain.nservicebus()


def key(units: int, levels: int, tail: str) -> str:
    return ".".join(str(units >> level & 1) for level in range(levels - 1, -1, -1)) + "." + tail


def test_source_names_are_those_the_other_libraries_declare() -> None:
    assert [KOMBU.level_name(n) for n in (0, 27)] == ["celery_delayed_0", "celery_delayed_27"]
    assert SourceChain.kombu(prefix="app").level_name(3) == "app_celery_delayed_3"
    assert [NSB.level_name(n) for n in (0, 27)] == [
        "nsb.v2.delay-level-00",
        "nsb.v2.delay-level-27",
    ]
    ours = SourceChain.ours(DelayTopology(prefix="old", levels=10))
    assert (ours.level_name(7), ours.levels, ours.unit_ms) == ("old.level.07", 10, 1)


def test_without_a_record_the_latest_possible_due_time_is_used() -> None:
    # 3600 s entered at level 11 (2048 s); lower bits 1552 s. Found in level 11: at most
    # 2048 s more there, then 1552 s below.
    plan = plan_move(KOMBU, level=11, routing_key=key(3600, 28, "celery"), headers={}, now=NOW)
    assert plan.tail == "celery" and not plan.exact
    assert plan.due_at == NOW + timedelta(seconds=2048 + 1552)
    # The same message found later in level 10: at most 1024 s there, then 528 s below.
    plan = plan_move(NSB, level=10, routing_key=key(3600, 28, "Sales"), headers=None, now=NOW)
    assert plan.due_at == NOW + timedelta(seconds=1024 + 528) and plan.tail == "Sales"


def test_a_recorded_due_time_is_used_when_the_chain_could_honour_it() -> None:
    ours = SourceChain.ours(DelayTopology(prefix="old", levels=12, unit=timedelta(seconds=1)))
    due = NOW + timedelta(minutes=50)
    plan = plan_move(
        ours,
        level=11,
        routing_key=key(3600, 12, "orders.eu"),
        headers={"x-retry-due-at": to_epoch_ms(due)},
        now=NOW,
    )
    assert (plan.tail, plan.due_at, plan.exact) == ("orders.eu", due, True)
    eta = plan_move(
        KOMBU, level=11, routing_key=key(3600, 28, "c"), headers={"eta": due.isoformat()}, now=NOW
    )
    assert (eta.due_at, eta.exact) == (due, True)
    # A record later than the chain could deliver is not believed: the bound is used.
    late = plan_move(
        KOMBU,
        level=0,
        routing_key=key(1, 28, "c"),
        headers={"eta": (NOW + timedelta(days=1)).isoformat()},
        now=NOW,
    )
    assert (late.due_at, late.exact) == (NOW + timedelta(seconds=1), False)
    # A past due time moves for immediate delivery.
    past = plan_move(
        KOMBU,
        level=0,
        routing_key=key(1, 28, "c"),
        headers={"eta": "2020-01-01T00:00:00+00:00"},
        now=NOW,
    )
    assert past.due_at == NOW


def test_unreadable_keys_stay() -> None:
    for bad in ("celery", "0.1.celery", key(5, 28, "")[:-1], "2." * 28 + "x"):
        plan = plan_move(KOMBU, level=0, routing_key=bad, headers={}, now=NOW)
        assert plan.problem is not None and plan.due_at is None


@given(
    units=st.integers(min_value=1, max_value=(1 << 28) - 1),
    waited=st.floats(min_value=0, max_value=1),
)
def test_never_early(units: int, waited: float) -> None:
    """Wherever a message is found on its path, the planned time is not before its true due."""
    entered = NOW
    true_due = entered + timedelta(seconds=units)
    # Walk its path: in level k it waits 2^k s; pick a moment within one of its waits.
    levels = [k for k in range(27, -1, -1) if units >> k & 1]
    elapsed = 0
    for k in levels:
        now = entered + timedelta(seconds=elapsed + waited * (1 << k))
        plan = plan_move(NSB, level=k, routing_key=key(units, 28, "q"), headers={}, now=now)
        assert plan.due_at is not None and plan.due_at >= true_due
        elapsed += 1 << k
