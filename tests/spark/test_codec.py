"""Pure parts of the data side: header JSON codec, message keys, partition path escaping."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from delayed_retry.spark.codec import headers_from_json, headers_to_json, message_key
from delayed_retry.spark.schema import escape_partition_value

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.datetimes(timezones=st.just(UTC))
    | st.decimals(allow_nan=False, allow_infinity=False, places=3)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=10), values, max_size=6))
def test_headers_survive_the_json_round_trip(headers: dict[str, Any]) -> None:
    assert headers_from_json(headers_to_json(headers)) == headers


def test_odd_values_and_non_mappings() -> None:
    assert headers_to_json(None) == "{}"
    assert headers_to_json(["not", "a", "mapping"]) == "{}"
    assert headers_from_json("") == {}
    assert headers_from_json("not json") == {}
    assert headers_from_json("[1, 2]") == {}
    text = headers_to_json({"nan": float("nan"), "obj": object(), "t": (1, 2)})
    decoded = headers_from_json(text)
    assert decoded["nan"] == "nan"
    assert decoded["obj"].startswith("<object object")
    assert decoded["t"] == [1, 2]
    assert headers_from_json(headers_to_json({"d": Decimal("1.50")}))["d"] == Decimal("1.50")
    when = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert headers_from_json(headers_to_json({"w": when}))["w"] == when


def test_message_key_is_stable_and_separates_fields() -> None:
    key = message_key("ex", "rk", "{}", b"body")
    assert key == message_key("ex", "rk", "{}", b"body")
    assert key != message_key("e", "xrk", "{}", b"body")
    assert key != message_key("ex", "rk", "{}", b"body2")


def test_partition_values_are_escaped_as_spark_does() -> None:
    assert escape_partition_value("orders.parking") == "orders.parking"
    assert escape_partition_value("a/b=c") == "a%2Fb%3Dc"
    assert escape_partition_value("50%") == "50%25"
