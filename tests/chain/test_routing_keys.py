"""The delay ⇄ bits ⇄ routing key spelling, as plain functions and hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from delayed_retry.chain import routing_keys

levels_st = st.integers(min_value=1, max_value=48)
word_st = st.text(
    alphabet=st.characters(codec="utf-8", exclude_characters=".*#"), min_size=1, max_size=12
)
destination_st = (
    st.lists(word_st, min_size=1, max_size=4)
    .map(".".join)
    .filter(lambda d: not d.startswith("amq."))
)


@st.composite
def units_levels(draw: st.DrawFn) -> tuple[int, int]:
    levels = draw(levels_st)
    return draw(st.integers(min_value=0, max_value=(1 << levels) - 1)), levels


def test_routing_key_spells_bits_highest_level_first() -> None:
    assert routing_keys.routing_key(5, 4, "orders") == "0.1.0.1.orders"
    assert routing_keys.routing_key(0, 3, "a.b") == "0.0.0.a.b"
    assert routing_keys.bits_of(6, 3) == [1, 1, 0]


def test_entry_level_is_the_highest_one_bit() -> None:
    assert [routing_keys.entry_level(u) for u in (0, 1, 2, 3, 4, 5, 1 << 35)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        35,
    ]


def test_units_for_ms_rounds_up() -> None:
    assert routing_keys.units_for_ms(0, 1) == 0
    assert routing_keys.units_for_ms(1, 1000) == 1
    assert routing_keys.units_for_ms(1000, 1000) == 1
    assert routing_keys.units_for_ms(1001, 1000) == 2


@pytest.mark.parametrize(("delay_ms", "unit_ms"), [(-1, 1), (5, 0), (5, -3)])
def test_units_for_ms_rejects_bad_input(delay_ms: int, unit_ms: int) -> None:
    with pytest.raises(ValueError, match=r"negative|at least 1"):
        routing_keys.units_for_ms(delay_ms, unit_ms)


@pytest.mark.parametrize(("units", "levels"), [(-1, 4), (16, 4), (1 << 48, 48)])
def test_bits_of_rejects_units_that_do_not_fit(units: int, levels: int) -> None:
    with pytest.raises(ValueError, match="do not fit"):
        routing_keys.bits_of(units, levels)


@pytest.mark.parametrize(
    ("destination", "problem"),
    [
        ("", "empty"),
        ("amq.gen-123", "reserved"),
        ("a.*.b", "wildcard"),
        ("#", "wildcard"),
        ("x" * 250, "bytes"),
    ],
)
def test_validate_destination_names_the_problem(destination: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        routing_keys.validate_destination(destination, 8)


def test_wildcard_characters_inside_a_word_are_fine() -> None:
    routing_keys.validate_destination("a*b.c#d", 8)


@pytest.mark.parametrize(
    "key", ["0.1.0", "0.2.1.q", "0.1.1.*", "x.0.0.q", "0.1.0.amq.q", "", "1.1.1."]
)
def test_decode_rejects_malformed_keys(key: str) -> None:
    with pytest.raises(ValueError, match=r"routing key|destination"):
        routing_keys.decode_routing_key(key, 3)


def test_binding_keys() -> None:
    assert routing_keys.level_binding_key(3, 4, 1) == "1.#"
    assert routing_keys.level_binding_key(0, 4, 0) == "*.*.*.0.#"
    assert routing_keys.delivery_binding_key(3, "q.x") == "*.*.*.q.x"
    with pytest.raises(ValueError, match="outside"):
        routing_keys.level_binding_key(4, 4, 1)


@given(units_levels(), destination_st)
def test_round_trip_delay_to_key_and_back(ul: tuple[int, int], destination: str) -> None:
    units, levels = ul
    if len(destination.encode()) > routing_keys.max_destination_bytes(levels):
        return
    key = routing_keys.routing_key(units, levels, destination)
    assert routing_keys.decode_routing_key(key, levels) == (units, destination)
    bits = routing_keys.bits_of(units, levels)
    assert sum(b << (levels - 1 - i) for i, b in enumerate(bits)) == units


@given(units_levels(), destination_st)
def test_key_length_never_grows_and_fits_amqp(ul: tuple[int, int], destination: str) -> None:
    units, levels = ul
    if len(destination.encode()) > routing_keys.max_destination_bytes(levels):
        return
    key = routing_keys.routing_key(units, levels, destination)
    # Every retry writes the same number of digit words: the length depends on nothing else.
    assert key == routing_keys.routing_key(units, levels, destination)
    assert len(key) == len(routing_keys.routing_key(0, levels, destination))
    assert len(key) == len(routing_keys.routing_key((1 << levels) - 1, levels, destination))
    assert len(key.encode()) <= routing_keys.MAX_ROUTING_KEY_BYTES


@given(units_levels(), destination_st)
def test_each_level_binding_matches_exactly_its_digit(
    ul: tuple[int, int], destination: str
) -> None:
    units, levels = ul
    if len(destination.encode()) > routing_keys.max_destination_bytes(levels):
        return
    words = routing_keys.routing_key(units, levels, destination).split(".")
    for level in range(levels):
        digit = int(words[levels - 1 - level])
        assert digit == (units >> level) & 1
        one = routing_keys.level_binding_key(level, levels, 1).split(".")
        # The binding's only concrete word sits at this level's position.
        assert one[levels - 1 - level] == "1"
        assert set(one[: levels - 1 - level]) <= {"*"}


@given(st.integers(min_value=0, max_value=10**12), st.integers(min_value=1, max_value=10**6))
def test_units_never_round_a_delay_down(delay_ms: int, unit_ms: int) -> None:
    units = routing_keys.units_for_ms(delay_ms, unit_ms)
    assert units * unit_ms >= delay_ms
    assert (units - 1) * unit_ms < delay_ms or units == 0


@given(units_levels(), destination_st)
def test_routing_key_is_the_digits_of_bits_of_then_the_destination(
    ul: tuple[int, int], destination: str
) -> None:
    units, levels = ul
    expected = ".".join([*map(str, routing_keys.bits_of(units, levels)), destination])
    assert routing_keys.routing_key(units, levels, destination) == expected


@pytest.mark.parametrize(("units", "levels"), [(-1, 4), (16, 4), (1 << 36, 36)])
def test_routing_key_refuses_units_that_do_not_fit(units: int, levels: int) -> None:
    with pytest.raises(ValueError, match="do not fit"):
        routing_keys.routing_key(units, levels, "q")


def test_a_bad_destination_is_refused_every_time_not_only_the_first() -> None:
    for _ in range(2):  # the check is cached; failures must not be
        with pytest.raises(ValueError, match="wildcard"):
            routing_keys.routing_key(0, 4, "a.*.b")
