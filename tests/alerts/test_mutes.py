"""Muted failure groups, pure: the table every alerts process builds from the mutes stream."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from delayed_retry.alerts.mutes import LONGEST_MUTE, Mute, MuteTable, decode_mute, encode_mute
from delayed_retry.errors import ConfigurationError

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)


def _mute(key: str = "a1b2", *, at: datetime = T0, hours: float = 2, reason: str = "") -> Mute:
    return Mute(fingerprint=key, at=at, until=at + timedelta(hours=hours), reason=reason)


def test_a_mute_is_in_force_from_its_time_until_its_end() -> None:
    mute = _mute()
    assert not mute.active(T0 - timedelta(seconds=1))
    assert mute.active(T0) and mute.active(T0 + timedelta(hours=1, minutes=59))
    assert not mute.active(T0 + timedelta(hours=2))


def test_the_table_counts_only_arrivals_of_muted_groups_while_muted() -> None:
    table = MuteTable([_mute("a1b2")])
    assert table.muting("a1b2", T0 + timedelta(minutes=5)) is not None
    assert table.muting("other", T0 + timedelta(minutes=5)) is None
    assert table.muting("a1b2", T0 + timedelta(hours=3)) is None  # over
    assert table.muted_arrivals == {"a1b2": 1}


def test_a_later_record_replaces_an_earlier_one_in_any_reading_order() -> None:
    first = _mute(reason="first")
    lifted = first.lifted(at=T0 + timedelta(minutes=10), by="ops@host")
    for order in ([first, lifted], [lifted, first]):
        table = MuteTable(order)
        assert table.get("a1b2", T0 + timedelta(minutes=5)) is None  # lifted is the latest
        assert table.get("a1b2", T0 + timedelta(minutes=11)) is None
    again = _mute(at=T0 + timedelta(minutes=20), reason="again")
    table = MuteTable([first, lifted, again])
    active = table.get("a1b2", T0 + timedelta(minutes=30))
    assert active is not None and active.reason == "again"
    assert [m.reason for m in table.active(T0 + timedelta(minutes=30))] == ["again"]


def test_records_round_trip_and_other_bodies_are_skipped() -> None:
    mute = Mute(
        fingerprint="a1b2",
        at=T0,
        until=T0 + timedelta(days=1),
        reason="known outage, INC-42",
        by="ops@host",
    )
    assert decode_mute(encode_mute(mute)) == mute
    for body in (b"", b"{}", b"not json", b'{"fingerprint": "x", "at": "soon", "until": 1}'):
        assert decode_mute(body) is None


@pytest.mark.parametrize(
    ("until", "match"),
    [
        (T0 - timedelta(seconds=1), "ends before it starts"),
        (T0 + LONGEST_MUTE + timedelta(seconds=1), "longer than 365 days"),
    ],
)
def test_impossible_mutes_are_refused_with_the_fix(until: datetime, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        Mute(fingerprint="a1b2", at=T0, until=until)
    with pytest.raises(ConfigurationError, match="failure group's key"):
        Mute(fingerprint=" ", at=T0, until=T0)


def test_a_lift_is_never_dated_before_the_mute_it_ends() -> None:
    # A host whose clock is behind the muting host's would otherwise lose to the mute.
    mute = _mute(at=T0)
    lift = mute.lifted(at=T0 - timedelta(minutes=3), by="ops@slow-clock")
    assert lift.at == lift.until == T0
    assert MuteTable([mute, lift]).get("a1b2", T0) is None
