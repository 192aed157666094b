"""chain_units and Hold: how early a held message leaves the chain, as pure functions."""

from __future__ import annotations

import random
import re
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from delayed_retry import DEFAULT_HOLD, ConfigurationError, DelayTopology, Hold
from delayed_retry.recovery.hold import chain_units, fewest_hops, redelay_units

NOW = datetime(2026, 1, 1, tzinfo=UTC)
FINE = DelayTopology(prefix="fine", levels=36)
COARSE = DelayTopology.nservicebus()

holds = st.builds(
    Hold,
    lead=st.integers(0, 20).map(lambda ms: timedelta(milliseconds=ms)),
    lead_per_hop=st.integers(0, 10).map(lambda ms: timedelta(milliseconds=ms)),
    granularity=st.integers(1, 256).map(lambda ms: timedelta(milliseconds=ms)),
)
"""Holds whose granularity is at least the fine chain's 1 ms unit."""


def _units(topology: DelayTopology, gap_us: int, hold: Hold | None) -> int:
    return chain_units(topology, NOW + timedelta(microseconds=gap_us), now=NOW, hold=hold)


@given(gap_us=st.integers(0, 10**10))
def test_without_a_hold_it_is_the_exact_delay_rounded_up(gap_us: int) -> None:
    due = NOW + timedelta(microseconds=gap_us)
    assert chain_units(FINE, due, now=NOW, hold=None) == FINE.units_until(due, now=NOW)


@example(  # the lead for the hops estimated first fell one hop short of the result's
    gap_us=6_227_014_000,
    hold=Hold(lead=timedelta(0), lead_per_hop=timedelta(milliseconds=1), granularity=0.001),
)
@given(gap_us=st.integers(0, 10**10), hold=holds)
def test_a_fine_chain_lets_out_at_least_the_lead_early_and_within_the_hold(
    gap_us: int, hold: Hold
) -> None:
    units = _units(FINE, gap_us, hold)
    exit_us = units * FINE.unit_ms * 1000
    assert exit_us <= max(gap_us - hold.lead_for(units.bit_count()), 0) or units == 0
    assert gap_us - exit_us <= hold.longest_hold_us(FINE)
    assert units <= FINE.units_until(NOW + timedelta(microseconds=gap_us), now=NOW)
    assert units % hold._step_units(FINE) == 0


@given(gap_us=st.integers(0, 10**12), hold=holds)
def test_a_unit_coarser_than_the_granularity_is_early_by_the_lead_at_most(
    gap_us: int, hold: Hold
) -> None:
    units = _units(COARSE, gap_us, hold)
    exit_us = units * COARSE.unit_ms * 1000
    assert gap_us - exit_us <= hold.lead_for(COARSE.levels)
    assert units <= COARSE.units_until(NOW + timedelta(microseconds=gap_us), now=NOW)


def test_a_short_delay_is_held_entirely_by_the_consumer() -> None:
    assert _units(FINE, 20_000, DEFAULT_HOLD) == 0


def test_the_hold_takes_hops_off_the_chain() -> None:
    rng = random.Random(5)
    gaps = [rng.randrange(500_000, 3_000_000) for _ in range(2000)]
    exact = sum(_units(FINE, gap, None).bit_count() for gap in gaps) / len(gaps)
    held = sum(_units(FINE, gap, DEFAULT_HOLD).bit_count() for gap in gaps) / len(gaps)
    # About 6 hops exact; 0.8 with the fewest hops within the default 1 s limit.
    assert held < 0.2 * exact, (held, exact)
    assert held < 1.0


@given(gap_us=st.integers(0, 10**10))
def test_the_default_hold_leaves_the_chain_within_its_limit(gap_us: int) -> None:
    units = _units(FINE, gap_us, DEFAULT_HOLD)
    exit_us = units * FINE.unit_ms * 1000
    assert gap_us - exit_us <= DEFAULT_HOLD.limit_us
    assert exit_us <= max(gap_us - DEFAULT_HOLD.lead_for(units.bit_count()), 0)
    if gap_us <= DEFAULT_HOLD.limit_us:
        assert units == 0  # held by the consumer entirely: no hop at all


@given(low=st.integers(0, 5000), width=st.integers(0, 300))
def test_fewest_hops_is_the_fewest_1_bits_in_the_range(low: int, width: int) -> None:
    high = low + width
    units = fewest_hops(low, high)
    assert low <= units <= high
    fewest = min(n.bit_count() for n in range(low, high + 1))
    assert units.bit_count() == fewest
    assert units == max(n for n in range(low, high + 1) if n.bit_count() == fewest)


def test_fewest_hops_refuses_an_empty_range() -> None:
    with pytest.raises(ValueError, match=r"\[5, 4\] is not a range"):
        fewest_hops(5, 4)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lead": timedelta(milliseconds=-1)}, "Hold lead=datetime.timedelta"),
        ({"granularity": -0.5}, "Hold granularity=-0.5 is negative"),
        ({"max_messages": 0}, "pass hold=None"),
        ({"max_messages": True}, "must be an int"),
        ({"limit": "soon"}, "Hold limit"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(message)):
        Hold(**kwargs)  # type: ignore[arg-type]


def test_a_limit_shorter_than_the_longest_hold_is_refused() -> None:
    hold = Hold(limit=timedelta(milliseconds=100))
    with pytest.raises(ConfigurationError, match=r"shorter than the 402 ms .* raise limit"):
        hold.check(FINE)
    DEFAULT_HOLD.check(FINE)
    DEFAULT_HOLD.check(COARSE)


@given(gap_us=st.integers(1, 10**10))
def test_a_message_sent_back_early_waits_in_the_chain(gap_us: int) -> None:
    due = NOW + timedelta(microseconds=gap_us)
    units = redelay_units(FINE, due, now=NOW, hold=DEFAULT_HOLD)
    assert 0 < units <= FINE.units_until(due, now=NOW)
    if gap_us > DEFAULT_HOLD.limit_us:
        assert units == _units(FINE, gap_us, DEFAULT_HOLD)
