"""The web view's pure parts: security checks, filters, failure groups, rendering, requests."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from delayed_retry.durations import utcnow
from delayed_retry.errors import ConfigurationError
from delayed_retry.parking.lot import ParkedFilter, ParkedRecord, read_record
from delayed_retry.parking.moving.canary_rules import CanaryNews, CanaryWait
from delayed_retry.web.jobs import Job, JobRequest
from delayed_retry.web.plans import PLAN_TTL, PlanBook, ReplayPlan
from delayed_retry.web.records import (
    CommonValues,
    filter_from_mapping,
    filter_to_mapping,
    group_fingerprint,
    group_label,
)
from delayed_retry.web.render import histogram, view_body
from delayed_retry.web.security import authenticate, check_bind, host_allowed, same_origin
from delayed_retry.web.settings import default_audit_log, parse_credentials

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def test_bind_beyond_loopback_needs_credentials() -> None:
    check_bind("127.0.0.1", None)
    check_bind("::1", None)
    check_bind("localhost", None)
    for host in ("0.0.0.0", "::", "192.0.2.7", "example.org"):
        with pytest.raises(ConfigurationError, match="--auth"):
            check_bind(host, None)
    check_bind("0.0.0.0", parse_credentials("ops:pw"))


def test_same_origin_rules() -> None:
    here = {"scheme": "http", "host": "127.0.0.1:8080"}
    assert same_origin({"Sec-Fetch-Site": "same-origin"}, **here)
    assert not same_origin({"Sec-Fetch-Site": "same-site"}, **here)
    assert not same_origin({"Sec-Fetch-Site": "none"}, **here)
    # Sec-Fetch-Site decides when present, even with a matching Origin.
    assert not same_origin(
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.1:8080"}, **here
    )
    assert same_origin({"Origin": "http://127.0.0.1:8080"}, **here)
    assert not same_origin({"Origin": "http://127.0.0.1:8081"}, **here)
    assert not same_origin({"Origin": "https://127.0.0.1:8080"}, **here)
    assert not same_origin({"Origin": "null"}, **here)
    assert not same_origin({}, **here)


def test_host_header_is_checked_unless_authenticated() -> None:
    assert host_allowed("127.0.0.1:8080", trusted=(), authenticated=False)
    assert host_allowed("localhost:8080", trusted=(), authenticated=False)
    assert host_allowed("[::1]:8080", trusted=(), authenticated=False)
    assert not host_allowed("evil.example:8080", trusted=(), authenticated=False)
    assert not host_allowed(None, trusted=(), authenticated=False)
    assert host_allowed("ops.internal", trusted=("ops.internal",), authenticated=False)
    assert host_allowed("ops.internal", trusted=(), authenticated=True)


def test_authentication_basic_and_token() -> None:
    creds = parse_credentials("ops:pa:ss", token="t0k")
    assert creds is not None and creds.password == "pa:ss"
    assert "pa:ss" not in repr(creds) and "t0k" not in repr(creds)

    def basic(text: str) -> str:
        return "Basic " + base64.b64encode(text.encode()).decode()

    assert authenticate(basic("ops:pa:ss"), creds) == "ops"
    assert authenticate(basic("ops:wrong"), creds) is None
    assert authenticate(basic("other:pa:ss"), creds) is None
    assert authenticate("Basic !!!notbase64", creds) is None
    assert authenticate("Bearer t0k", creds) == "token"
    assert authenticate("Bearer t0", creds) is None
    assert authenticate(None, creds) is None
    assert authenticate(None, None) == "local"
    with pytest.raises(ConfigurationError, match="USER:PASSWORD"):
        parse_credentials("no-colon")
    with pytest.raises(ConfigurationError):
        parse_credentials(":pw")


def _record(**headers: object) -> ParkedRecord:
    base: dict[str, object] = {
        "x-parked-reason": "max-retries",
        "x-exception-type": "app.GatewayTimeout",
        "x-exception-message": "gateway did not answer in 10 s (order 105)",
        "x-parked-at": int((NOW - timedelta(hours=2)).timestamp() * 1000),
        "tenant": "acme",
    }
    base.update(headers)
    return read_record(
        base,
        message_id="m-1",
        body=b'{"order": 42}',
        exchange="",
        routing_key="q",
        content_type="application/json",
    )


def test_group_labels_come_from_the_failure_fingerprint() -> None:
    expected = "app.GatewayTimeout: gateway did not answer in <num> s (order <num>)"
    assert group_label(_record()) == expected
    other = _record(**{"x-exception-message": "gateway did not answer in 12 s (order 106)"})
    assert other.fingerprint == _record().fingerprint
    traced = _record(**{"x-exception-traceback": 'File "/app/pay.py", line 3, in charge\nE'})
    assert group_label(traced).startswith("app.GatewayTimeout: gateway did not answer")
    assert "pay.py in charge" in group_label(traced)
    assert traced.fingerprint != _record().fingerprint


def test_a_group_label_shows_the_most_common_value_of_what_it_masks() -> None:
    def keyed(key: str, order: int) -> ParkedRecord:
        return _record(
            **{
                "x-exception-type": "KeyError",
                "x-exception-message": f"{key!r} missing in order {order}",
                "x-exception-traceback": 'File "/app/orders.py", line 9, in handle\nKeyError',
            }
        )

    records = [keyed("customer_id", 1), keyed("sku", 2), keyed("customer_id", 3)]
    records.append(keyed("customer_id", 4))
    assert len({r.fingerprint for r in records}) == 1  # the grouping is unchanged
    group = group_fingerprint(records[0])
    assert group.label() == "KeyError: <str> missing in order <num> [app/orders.py in handle]"
    values = CommonValues()
    for record in records:
        values.add(record.exception_message)
    label, note = values.label(group, group_size=4)
    # The key comes back; the order numbers, all different, stay masked.
    assert label == "KeyError: 'customer_id' missing in order <num> [app/orders.py in handle]"
    assert note == "most common: 'customer_id' in 3 of 4"
    alone = CommonValues()
    alone.add("'sku' missing in order 7")
    assert alone.label(group, group_size=1) == (
        "KeyError: 'sku' missing in order 7 [app/orders.py in handle]",
        "the values of its one message",
    )
    ids_only = CommonValues()
    for n in range(3):
        ids_only.add(f"'k{n}' missing in order {n}")
    assert ids_only.label(group, group_size=3) == (group.label(), "")


def test_page_filters_map_onto_the_parking_lot_filter() -> None:
    record = _record()
    f = filter_from_mapping
    assert f({}).matches(record, now=NOW)
    cases = [
        ({"exception": "GatewayTimeout"}, True),
        ({"exception": "app.GatewayTimeout"}, True),
        ({"exception": "CustomerMissing"}, False),
        ({"reason": "max-retries"}, True),
        ({"reason": "stopped"}, False),
        ({"older_than": "1h"}, True),
        ({"older_than": "3h"}, False),
        ({"newer_than": "3h"}, True),
        ({"newer_than": "90m"}, False),
        ({"header": "tenant=acme"}, True),
        ({"header": "tenant=other"}, False),
        ({"header": "tenant"}, True),
        ({"header": "region"}, False),
        ({"text": "order"}, True),
        ({"text": "refund"}, False),
        ({"group": record.fingerprint}, True),
        ({"group": "not-a-group"}, False),
    ]
    for data, expected in cases:
        assert f(data).matches(record, now=NOW) is expected, data
    no_time = _record(**{"x-parked-at": None})
    assert not f({"older_than": "1s"}).matches(no_time, now=NOW)
    with pytest.raises(ConfigurationError, match="unknown filter colour"):
        f({"colour": "red"})
    with pytest.raises(ConfigurationError, match="older_than"):
        f({"older_than": "yesterday"})
    with pytest.raises(ConfigurationError, match="must be text"):
        f({"reason": 3})
    assert filter_to_mapping(f({"older_than": "2h", "text": ""})) == {"older_than": "7200s"}
    round_trip = {"exception": "E", "header": "tenant=acme", "text": "x", "group": "g"}
    assert filter_to_mapping(f(round_trip)) == round_trip


def test_body_views_are_safe() -> None:
    text = view_body(b"<script>alert(1)</script>")
    assert text.kind == "text" and text.text == "<script>alert(1)</script>"  # escaped later
    binary = view_body(b"\x00\x01\xffABC")
    assert binary.kind == "hex"
    assert binary.text.startswith("00000000  00 01 ff 41 42 43")
    assert binary.text.endswith("...ABC")
    big = view_body(b"x" * 100_000)
    assert big.truncated and big.shown == 16_384 and big.size == 100_000
    pretty = view_body(b'{"a":1}', content_type="application/json")
    assert pretty.kind == "json" and '"a": 1' in pretty.text
    control = view_body(b"line\x1b[31mred")
    assert control.kind == "hex"  # terminal escapes are not shown as text


def test_histogram_keeps_empty_buckets() -> None:
    moments = [NOW - timedelta(minutes=m) for m in (1, 1, 2, 50)]
    h = histogram(moments, now=NOW, buckets=12)
    assert len(h.counts) == 12 and sum(h.counts) == 4
    assert h.bucket == timedelta(minutes=5)
    assert h.counts[-1] == 3 and 0 in h.counts
    assert histogram([], now=NOW).peak == 0


def test_job_requests_follow_the_api_contract() -> None:
    by_ids = JobRequest.from_json("replay", {"queue": "orders", "message_ids": ["a", "b"]})
    assert by_ids.message_ids == ("a", "b") and by_ids.where is None
    by_filter = JobRequest.from_json(
        "purge", {"queue": "orders", "filter": {"exception": "Timeout"}}
    )
    assert by_filter.where == ParkedFilter(exception_type="Timeout")
    paced = JobRequest.from_json(
        "replay", {"queue": "q", "message_ids": ["a"], "rate": "5", "canary": 2}
    )
    assert paced.rate == 5.0 and paced.canary == 2
    assert paced.canary_wait is None  # derived from the canaries' records, not a fixed 5 s
    waited = JobRequest.from_json("replay", {"queue": "q", "message_ids": ["a"], "canary_wait": 90})
    assert waited.canary_wait == 90.0 and waited.describe()["canary_wait"] == 90.0
    bad = [
        (None, "JSON object"),
        ({"message_ids": ["a"]}, '"queue"'),
        ({"queue": "q", "message_ids": ["a"], "filter": {}}, "exactly one"),
        ({"queue": "q", "message_ids": "a"}, "non-empty list"),
        ({"queue": "q", "message_ids": [1]}, "non-empty list"),
        ({"queue": "q", "filter": []}, "object"),
        ({"queue": "q", "message_ids": ["a"], "rate": 0}, "rate"),
        ({"queue": "q", "message_ids": ["a"], "rate": True}, "rate"),
        ({"queue": "q", "message_ids": ["a"], "canary": 1000}, "canary"),
        ({"queue": "q", "message_ids": ["a"], "extra": 1}, "unknown field extra"),
    ]
    for body, message in bad:
        with pytest.raises(ConfigurationError, match=message):
            JobRequest.from_json("replay", body)


def test_discovery_keeps_work_queues_with_a_parking_queue() -> None:
    from delayed_retry.chain.topology import DelayTopology
    from delayed_retry.web.discovery import work_queues_of

    names = [
        "orders",
        "orders.parking",
        "invoices.parking",
        "delayed-retry.parking.alerts",
        "delayed-retry.level.03",
        "parking",
    ]
    assert work_queues_of(names, DelayTopology()) == ["invoices", "orders"]


def _job(canary: int = 1) -> Job:
    request = JobRequest(action="replay", queue="orders", message_ids=("a", "b"), canary=canary)
    return Job(id="1-abc", request=request, user="ops", started_at=NOW)


def test_a_job_follows_its_canary_and_is_not_finished_while_it_can_come_back() -> None:
    job = _job()
    wait = CanaryWait.choose([7.0], given=5)
    until = NOW + timedelta(seconds=5)
    job.hear(CanaryNews(phase="watching", ids=("a",), wait=wait, until=until))
    assert job.state == "canary" and not job.finished
    assert "the rest waits until 12:00:05 UTC" in job.note
    assert job.warning.startswith("canary wait 5 s is shorter than the 19 s")
    job.hear(CanaryNews(phase="passed", ids=("a",), wait=wait))
    assert job.state == "running" and job.watch_until is None
    job.hear(CanaryNews(phase="confirming", ids=("a",), wait=wait, until=until, rest=1))
    assert job.state == "confirming" and not job.finished
    assert "not confirmed yet: canary a can still park again" in job.note
    assert job.as_json()["watch_until"] == until.isoformat()
    assert (job.as_json()["canary_wait"], job.as_json()["canary_wait_derived"]) == (5, 19)
    job.state = "parked-again"
    assert job.finished


def test_a_confirmation_is_used_once_by_its_own_user_and_forgotten_when_old() -> None:
    book = PlanBook()
    request = JobRequest(action="replay", queue="orders", message_ids=("a",), canary=1)

    def plan(**extra: Any) -> ReplayPlan:
        return ReplayPlan(
            id=PlanBook.new_id(),
            request=request,
            user="ops",
            parking_queue="orders.parking",
            target="orders",
            keys=("a",),
            canary_ids=("a",),
            canary_wait=CanaryWait.choose([0.0], given=None),
            **extra,
        )

    fresh = plan()
    book.add(fresh)
    with pytest.raises(ConfigurationError, match="no longer valid"):
        book.take(fresh.id, user="someone-else")
    assert book.take(fresh.id, user="ops") is fresh
    with pytest.raises(ConfigurationError, match="click Replay again"):
        book.take(fresh.id, user="ops")
    old = plan(created_at=utcnow() - PLAN_TTL - timedelta(seconds=1))
    book.add(old)
    with pytest.raises(ConfigurationError, match="no longer valid"):
        book.take(old.id, user="ops")
    assert fresh.canary_plan().startswith("the message is the canary: watched until due plus 5 s")
    assert fresh.pace() == "all at once"


def test_the_audit_log_defaults_to_the_users_state_folder() -> None:
    home = Path("/home/ann")
    assert default_audit_log({}, home=home) == Path(
        "/home/ann/.local/state/delayed-retry/audit.jsonl"
    )
    assert default_audit_log({"XDG_STATE_HOME": "/var/lib/ann"}, home=home) == Path(
        "/var/lib/ann/delayed-retry/audit.jsonl"
    )
    # A relative XDG_STATE_HOME is ignored, as the specification says: never the cwd.
    assert default_audit_log({"XDG_STATE_HOME": "state"}, home=home) == Path(
        "/home/ann/.local/state/delayed-retry/audit.jsonl"
    )


def test_the_sparkline_label_gives_its_scale() -> None:
    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    moments = [now - timedelta(minutes=2, seconds=30), now - timedelta(minutes=2, seconds=40)]
    chart = histogram(moments, now=now)
    assert chart.label == "last 24 m, one bar per 1 m; tallest bar: 2 parked"
    assert histogram([], now=now).label == "none parked in the last 1 d"
