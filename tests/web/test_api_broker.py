"""The web view's HTTP side against a real broker and a real server on loopback.

Pages and the JSON API read parked messages; replay and purge move exactly the
selected messages (checked on the broker); the security rules hold.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
from pathlib import Path
from typing import Any

import aio_pika
import aiohttp
import pytest

from delayed_retry.web import WebSettings, parse_credentials
from tests.support.chain import Scenario
from tests.support.retrying import fail_with_retries, park_after_retries
from tests.support.waiting import wait_until
from tests.support.web import ids_in, park, park_forever, serve

pytestmark = pytest.mark.broker


def _settings(lot: Scenario, tmp_path: Path, **extra: Any) -> WebSettings:
    return WebSettings(
        queues=(lot.name("orders"),),
        topology=lot.topology,
        audit_log=tmp_path / "audit.jsonl",
        live_interval=0.2,
        **extra,
    )


async def _job_done(session: aiohttp.ClientSession, base: str, status_url: str) -> dict[str, Any]:
    result: dict[str, Any] = {}

    async def finished() -> bool:
        async with session.get(base + status_url) as response:
            result.update(await response.json())
        return result["state"] in ("finished", "failed", "stopped", "parked-again")

    await wait_until(finished, timeout=30)
    return result


async def test_api_lists_filters_and_replays_a_group(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    parked = await park(lot, queue, ["timeout", "missing", "timeout", "timeout", "missing"])
    settings = _settings(lot, tmp_path, url=rabbitmq_url)
    async with (
        serve(settings) as base,
        aiohttp.ClientSession() as session,
    ):
        async with session.get(f"{base}/api/parked", params={"queue": queue}) as response:
            assert response.status == 200
            listing = await response.json()
        items = listing["items"]
        assert sorted(i["message_id"] for i in items) == sorted(p.message_id for p in parked)
        first = items[0]
        assert {"message_id", "exception_type", "reason", "attempts", "parked_at"} <= set(first)
        assert first["reason"] == "not-retryable"
        assert first["attempts"] == 1
        # One group per failure, whatever the order number in the text.
        groups = {g["label"]: g["count"] for g in listing["groups"]}
        assert len(groups) == 2, groups
        assert sorted(groups.values()) == [2, 3]

        async with session.get(
            f"{base}/api/parked", params={"queue": queue, "exception": "CustomerMissing"}
        ) as response:
            narrowed = (await response.json())["items"]
        assert sorted(i["message_id"] for i in narrowed) == ["missing-101", "missing-104"]

        timeout_group = next(g["group"] for g in listing["groups"] if g["count"] == 3)
        async with session.post(
            f"{base}/api/parked/replay",
            json={"queue": queue, "filter": {"group": timeout_group}},
            headers={"Origin": base},
        ) as response:
            assert response.status == 202, await response.text()
            accepted = await response.json()
        assert accepted["job"]["total"] == 3
        job = await _job_done(session, base, accepted["status_url"])
        assert job["state"] == "finished", job
        assert job["done"] == 3

    # On the broker: exactly the timeout messages went back to the work queue.
    async def arrived() -> bool:
        return await lot.depth(queue) == 3

    await wait_until(arrived, timeout=30)
    assert sorted(await ids_in(lot, queue)) == ["timeout-100", "timeout-102", "timeout-103"]
    assert sorted(await ids_in(lot, queue + ".parking")) == ["missing-101", "missing-104"]
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [a["event"] for a in audit] == ["accepted", "finished"]
    assert audit[0]["user"] == "local" and audit[0]["count"] == 3
    assert audit[1]["done"] == 3


async def test_purge_by_ids_acts_on_those_only_and_replay_by_ids(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["timeout", "missing", "timeout"])
    async with (
        serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
    ):
        async with (
            aiohttp.ClientSession(headers={"Origin": base}) as session,
            session.post(
                f"{base}/api/parked/purge",
                json={"queue": queue, "message_ids": ["missing-101", "no-such-id"]},
            ) as response,
        ):
            assert response.status == 202, await response.text()
            job = await _job_done(session, base, (await response.json())["status_url"])
        assert job["done"] == 1
        assert "no longer parked" in job["note"]
    assert sorted(await ids_in(lot, queue + ".parking")) == ["timeout-100", "timeout-102"]
    assert await lot.depth(queue) == 0


async def test_bad_requests_say_what_to_fix(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["timeout"])
    async with (
        serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
        aiohttp.ClientSession(headers={"Origin": base}) as session,
    ):
        cases: list[tuple[Any, str]] = [
            ({"queue": queue}, "exactly one of"),
            ({"queue": queue, "message_ids": []}, "non-empty list"),
            ({"queue": queue, "filter": {"colour": "red"}}, "unknown filter colour"),
            ({"queue": queue, "filter": {"older_than": "soon"}}, "not a duration"),
            ({"queue": queue, "message_ids": ["x"], "rate": -1}, "rate"),
            ([1, 2], "JSON object"),
        ]
        for body, expected in cases:
            async with session.post(f"{base}/api/parked/replay", json=body) as response:
                assert response.status == 400, body
                assert expected in (await response.json())["error"], body
        async with session.post(
            f"{base}/api/parked/replay", json={"queue": "elsewhere", "message_ids": ["x"]}
        ) as response:
            assert response.status == 404
            assert "not served here" in (await response.json())["error"]
        async with session.get(f"{base}/api/parked", params={"queue": "elsewhere"}) as r:
            assert r.status == 404
    # Nothing moved.
    assert await ids_in(lot, queue + ".parking") == ["timeout-100"]


async def test_cross_origin_and_unauthenticated_requests_are_refused(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["timeout"])
    body = {"queue": queue, "message_ids": ["timeout-100"]}
    async with (
        serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
        aiohttp.ClientSession() as session,
    ):
        refused = [
            {"Origin": "http://evil.example"},
            {"Sec-Fetch-Site": "cross-site", "Origin": base},
            {"Sec-Fetch-Site": "same-site"},
            {"Origin": "null"},
            {},
        ]
        for headers in refused:
            async with session.post(
                f"{base}/api/parked/purge", json=body, headers=headers
            ) as response:
                assert response.status == 403, headers
        async with session.get(f"{base}/api/parked/purge") as response:
            assert response.status == 405  # no state change on GET
        # DNS rebinding: a page on another name that resolves to 127.0.0.1.
        async with session.get(
            f"{base}/api/parked", params={"queue": queue}, headers={"Host": "evil.example"}
        ) as response:
            assert response.status == 421
        async with session.get(f"{base}/") as response:
            assert response.status == 200
            assert "script-src 'self'" in response.headers["Content-Security-Policy"]
            assert "unsafe-inline" not in response.headers["Content-Security-Policy"]
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert response.headers["Cache-Control"] == "no-store"
    assert await ids_in(lot, queue + ".parking") == ["timeout-100"]

    credentials = parse_credentials("ops:s3cret", token="tok-123")
    settings = _settings(lot, tmp_path, url=rabbitmq_url, credentials=credentials)
    async with (
        serve(settings) as base,
        aiohttp.ClientSession() as session,
    ):
        async with session.get(f"{base}/api/parked", params={"queue": queue}) as response:
            assert response.status == 401
            assert response.headers["WWW-Authenticate"].startswith("Basic")
        wrong = base64.b64encode(b"ops:wrong").decode()
        async with session.get(
            f"{base}/api/parked",
            params={"queue": queue},
            headers={"Authorization": f"Basic {wrong}"},
        ) as response:
            assert response.status == 401
        good = base64.b64encode(b"ops:s3cret").decode()
        async with session.get(
            f"{base}/api/parked",
            params={"queue": queue},
            headers={"Authorization": f"Basic {good}"},
        ) as response:
            assert response.status == 200
        async with session.get(
            f"{base}/api/queues", headers={"Authorization": "Bearer tok-123"}
        ) as response:
            assert response.status == 200


async def test_read_only_refuses_actions(lot: Scenario, rabbitmq_url: str, tmp_path: Path) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["missing"])
    async with (
        serve(_settings(lot, tmp_path, url=rabbitmq_url, read_only=True)) as base,
        aiohttp.ClientSession(headers={"Origin": base}) as session,
    ):
        async with session.post(
            f"{base}/api/parked/purge", json={"queue": queue, "message_ids": ["missing-100"]}
        ) as response:
            assert response.status == 403
            assert "read-only" in await response.text()
        async with session.get(f"{base}/parked", params={"queue": queue}) as response:
            page = await response.text()
        assert "missing-100" in page
        assert "Purge" not in page
    assert await ids_in(lot, queue + ".parking") == ["missing-100"]


async def test_live_counts_arrive_as_server_sent_events(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["missing", "missing"])
    async with (
        serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
        aiohttp.ClientSession() as session,
        session.get(f"{base}/events") as response,
    ):
        assert response.headers["Content-Type"].startswith("text/event-stream")
        event = b""
        while not event.endswith(b"\n\n"):
            event += await asyncio.wait_for(response.content.readline(), 10)
    lines = event.decode().splitlines()
    assert lines[0] == "event: counts"
    counts = json.loads(lines[1].removeprefix("data: "))["counts"]
    assert counts[queue + ".parking"] == 2


async def test_pages_and_the_set_as_it_was_at_the_click(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["missing"] * 5)
    async with (
        serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
        aiohttp.ClientSession(headers={"Origin": base}) as session,
    ):
        seen: list[str] = []
        for offset in (0, 2, 4):
            async with session.get(
                f"{base}/api/parked", params={"queue": queue, "offset": offset, "limit": 2}
            ) as response:
                page = await response.json()
            assert page["matching"] == 5
            seen += [i["message_id"] for i in page["items"]]
        assert sorted(seen) == [f"missing-{n}" for n in range(100, 105)]

        async with session.post(
            f"{base}/api/parked/purge",
            json={"queue": queue, "filter": {"exception": "CustomerMissing"}, "rate": 5},
        ) as response:
            assert response.status == 202
            accepted = await response.json()
        assert accepted["job"]["total"] == 5
        # Parks after the click: same filter, but not part of the job's set.
        await park(lot, queue, ["missing"], first_order=200)
        job = await _job_done(session, base, accepted["status_url"])
    assert job["state"] == "finished" and job["done"] == 5
    assert await ids_in(lot, queue + ".parking") == ["missing-200"]


async def test_canary_stops_a_replay_when_the_first_messages_park_again(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["missing", "missing", "missing"])
    # The cause is not fixed: a consumer that still parks every message.
    still_failing = await park_forever(lot, queue)
    try:
        async with (
            serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
            aiohttp.ClientSession(headers={"Origin": base}) as session,
            session.post(
                f"{base}/api/parked/replay",
                json={
                    "queue": queue,
                    "message_ids": ["missing-100", "missing-101", "missing-102"],
                    "canary": 1,
                    "canary_wait": 3,
                },
            ) as response,
        ):
            assert response.status == 202, await response.text()
            job = await _job_done(session, base, (await response.json())["status_url"])
    finally:
        await still_failing()
    assert job["state"] == "stopped", job
    assert job["done"] == 1
    assert "parked again" in job["note"]
    assert sorted(await ids_in(lot, queue + ".parking")) == [
        "missing-100",
        "missing-101",
        "missing-102",
    ]


async def test_unroutable_messages_replay_only_to_a_named_served_queue(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["missing"])  # declares the chain, its unroutable queue included
    unroutable = lot.topology.unroutable_queue
    channel = await lot.connection.channel()
    await channel.default_exchange.publish(
        aio_pika.Message(b"lost", message_id="lost-1", headers={"x-retry-due-at": 1}),
        routing_key=unroutable,
    )
    await channel.close()
    async with (
        serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
        aiohttp.ClientSession(headers={"Origin": base}) as session,
    ):
        async with session.get(f"{base}/api/parked", params={"queue": unroutable}) as r:
            items = (await r.json())["items"]
        assert [(i["message_id"], i["reason"]) for i in items] == [("lost-1", "unroutable")]
        body: dict[str, Any] = {"queue": unroutable, "message_ids": ["lost-1"]}
        async with session.post(f"{base}/api/parked/replay", json=body) as r:
            assert r.status == 400
            assert "to_queue" in (await r.json())["error"]
        async with session.post(
            f"{base}/api/parked/replay", json={**body, "to_queue": "somewhere-else"}
        ) as r:
            assert r.status == 400
            assert "not served here" in (await r.json())["error"]
        async with session.post(f"{base}/api/parked/replay", json={**body, "to_queue": queue}) as r:
            assert r.status == 202
            job = await _job_done(session, base, (await r.json())["status_url"])
        assert job["state"] == "finished" and job["done"] == 1

    async def arrived() -> bool:
        return await lot.depth(queue) == 1

    await wait_until(arrived, timeout=30)
    assert await ids_in(lot, queue) == ["lost-1"]
    assert await lot.depth(unroutable) == 0


async def test_a_canary_that_parks_again_after_the_rest_turns_the_job_red(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    still_failing = await fail_with_retries(lot, queue)  # retries after 1 s and 2 s, parks
    try:
        await park_after_retries(lot, queue, 3)
        async with (
            serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
            aiohttp.ClientSession(headers={"Origin": base}) as session,
        ):
            # Half a second: the rest follows while the canary is still retrying.
            body = {"queue": queue, "filter": {}, "canary": 1, "canary_wait": 0.5}
            async with session.post(f"{base}/api/parked/replay", json=body) as response:
                assert response.status == 202, await response.text()
                status_url = (await response.json())["status_url"]
            seen: list[dict[str, Any]] = []

            async def ended() -> bool:
                async with session.get(base + status_url) as r:
                    seen.append(await r.json())
                return seen[-1]["state"] in ("finished", "failed", "stopped", "parked-again")

            await wait_until(ended, timeout=30, what="the replay job to end")
    finally:
        await still_failing()
    job = seen[-1]
    assert job["state"] == "parked-again", job
    assert job["done"] == 3
    assert "parked again after the other 2 were replayed" in job["note"]
    # Never green while the canary could come back: watched after the rest, then red.
    confirming = [j for j in seen if j["state"] == "confirming"]
    assert confirming and "not confirmed yet" in confirming[0]["note"]
    assert confirming[0]["watch_until"] is not None
    assert "finished" not in {j["state"] for j in seen}
    assert "shorter than the" in confirming[0]["warning"]
    assert confirming[0]["canary_wait"] == 0.5 and confirming[0]["canary_wait_derived"] > 11
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert audit[-1]["event"] == "finished" and audit[-1]["state"] == "parked-again"


async def test_the_page_proposes_a_replay_and_acts_only_on_its_confirmation(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["missing", "missing", "timeout"])
    async with (
        serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
        aiohttp.ClientSession(headers={"Origin": base}) as session,
    ):
        form = {"queue": queue, "op": "replay-filter", "exception": "CustomerMissing"}
        async with session.post(f"{base}/actions", data=form) as response:
            assert response.status == 200
            assert response.headers["HX-Retarget"] == "#confirm"
            proposal = await response.text()
        # The safe choices unless others are made: one canary, 50 messages per second.
        assert '<strong class="count">2</strong> parked messages' in proposal
        assert f'to queue <code class="target">{queue}</code>' in proposal
        assert "1 first as canary (missing-100)" in proposal
        assert "Pace: at most 50 messages per second" in proposal
        plan = re.search(r'data-plan="([^"]+)"', proposal)
        assert plan is not None
        assert len(await ids_in(lot, queue + ".parking")) == 3  # nothing moved yet

        # All at once and no canary only when chosen, and said so.
        risky = {**form, "all_at_once": "1", "canary": "0"}
        async with session.post(f"{base}/actions", data=risky) as response:
            text = await response.text()
        assert "No canary: nothing checks that the cause is fixed" in text
        assert "Pace: all at once" in text
        cancel = re.search(r'data-plan="([^"]+)"', text)
        assert cancel is not None
        async with session.post(
            f"{base}/actions", data={"op": "cancel-replay", "plan": cancel[1]}
        ) as response:
            assert response.status == 200 and "data-plan" not in await response.text()

        async with session.post(
            f"{base}/actions", data={"op": "confirm-replay", "plan": plan[1]}
        ) as response:
            assert response.status == 202
            started = await response.text()
        assert 'hx-swap-oob="true"' in started  # the confirmation box is emptied
        job_id = re.search(r'data-job="([^"]+)"', started)
        assert job_id is not None
        for used in (plan[1], cancel[1]):  # each confirmation acts once; a cancelled one never
            async with session.post(
                f"{base}/actions", data={"op": "confirm-replay", "plan": used}
            ) as response:
                assert response.status == 400
                assert "no longer valid" in await response.text()
        job = await _job_done(session, base, f"/api/jobs/{job_id[1]}")
    assert job["state"] == "finished" and job["done"] == 2, job
    assert await ids_in(lot, queue + ".parking") == ["timeout-102"]
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(a["event"], a.get("canary"), a.get("rate")) for a in audit] == [
        ("accepted", 1, 50.0),
        ("finished", None, None),
    ]


async def test_read_counts_are_shown_apart_from_the_headers(
    lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = lot.name("orders")
    await park(lot, queue, ["missing"])
    # A parked message as RabbitMQ 4.x shows it after a few looks: counters on it.
    counted: dict[str, aio_pika.abc.FieldValue] = {
        "x-parked-reason": "max-retries",
        "x-exception-type": "Counted",
        "x-delivery-count": 7,
        "x-acquired-count": 9,
    }
    await lot.ch.default_exchange.publish(
        aio_pika.Message(b"counted", message_id="counted", headers=counted),
        routing_key=f"{queue}.parking",
    )
    async with (
        serve(_settings(lot, tmp_path, url=rabbitmq_url)) as base,
        aiohttp.ClientSession(headers={"Origin": base}) as session,
    ):
        async with session.get(f"{base}/api/parked", params={"queue": queue}) as response:
            items = (await response.json())["items"]
            key = next(i["key"] for i in items if i["message_id"] == "counted")
        looks = []
        for _ in range(2):  # every look is a read, which the broker counts
            async with session.get(
                f"{base}/api/message", params={"queue": queue, "key": key}
            ) as response:
                looks.append(await response.json())
        async with session.get(f"{base}/message", params={"queue": queue, "key": key}) as page:
            html = await page.text()
    for record in looks:
        assert "x-delivery-count" not in record["headers"]
        assert "x-acquired-count" not in record["headers"]
    assert looks[1]["broker_read_counters"]["x-acquired-count"] >= 9
    assert 'id="read-counts"' in html and "each look counts" in html
    assert '<th>x-delivery-count</th><td class="lines">' not in html
