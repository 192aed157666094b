"""Editing a parked message and replaying it from the web view, in a real browser."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from playwright.async_api import Browser, expect

from delayed_retry.headers import X_PARKED_REASON, X_RETRY
from delayed_retry.headers.names import (
    X_EDITED_BY,
    X_EDITED_HEADERS,
    X_EDITED_OLD_BODY_SHA256,
)
from delayed_retry.web import WebSettings
from tests.support.chain import Scenario
from tests.support.queues import drain, wait_for_depth
from tests.support.web import ids_in, park, serve
from tests.web.test_browser_broker import _orders, _page, _shot, browser, lot

pytestmark = [pytest.mark.broker, pytest.mark.browser]

__all__ = ["browser", "lot"]  # the fixtures, shared with the browser tests


async def test_browser_edits_a_json_field_and_replays(
    browser: Browser, lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = _orders(lot)
    (parked,) = await park(lot, queue, ["missing"])
    settings = WebSettings(
        url=rabbitmq_url, queues=(queue,), topology=lot.topology, audit_log=tmp_path / "a.jsonl"
    )
    problems: list[str] = []
    async with serve(settings) as base, _page(browser, problems) as page:
        await page.goto(f"{base}/message?queue={queue}&key={parked.message_id}")
        body = page.locator("#edit-body")
        shown = await body.input_value()
        assert shown.startswith('{\n  "kind": "missing",\n  "order": 100,'), shown
        old = json.loads(shown)

        # Broken JSON is refused with where it broke; nothing moves.
        await body.fill(shown.replace('"order": 100,', '"order": 101'))
        await page.get_by_role("button", name="Edit and replay").click()
        await expect(page.locator("#edit-result .notice.error")).to_contain_text(
            "is not JSON (line 4 column"
        )
        assert await ids_in(lot, queue + ".parking") == [parked.message_id]

        # An edit of a message other than the one the page showed (its body changed) is refused.
        response = await page.request.post(
            f"{base}/actions",
            form={
                "op": "edit-replay",
                "queue": queue,
                "key": parked.message_id,
                "seen": hashlib.sha256(b"another body").hexdigest(),
                "body": "{}",
            },
            headers={"Origin": base},
        )
        assert response.status == 400
        assert "not the one this page showed" in await response.text()
        assert await ids_in(lot, queue + ".parking") == [parked.message_id]

        await body.fill(shown.replace('"order": 100,', '"order": 101,'))
        await page.get_by_label("value of x-note").fill("fixed by hand")
        await page.get_by_label("new header name").fill("tenant")
        await page.get_by_label("new header value").fill("us")
        await page.get_by_role("button", name="Show the change").click()
        diff = page.locator("#edit-diff")
        await expect(diff).to_contain_text('+  "order": 101,')
        await expect(diff).to_contain_text("+tenant: us")
        await _shot(page, "message-edit-preview")
        assert await ids_in(lot, queue + ".parking") == [parked.message_id]

        await page.get_by_role("button", name="Edit and replay").click()
        await expect(page.locator("#edit-notice")).to_contain_text(
            f"edited and replayed {parked.message_id} to {queue}"
        )
        await _shot(page, "message-edited-and-replayed")

    await wait_for_depth(lot.connection, queue, 1)
    (copy,) = await drain(lot.connection, queue)
    assert json.loads(copy.body) == {**old, "order": 101}
    assert copy.message_id == parked.message_id
    assert copy.headers["x-note"] == "fixed by hand" and copy.headers["tenant"] == "us"
    assert copy.headers[X_EDITED_BY] == "local (web)"
    assert copy.headers[X_EDITED_HEADERS] == "set: tenant, x-note"
    old_digest = str(copy.headers[X_EDITED_OLD_BODY_SHA256])
    assert copy.headers[X_RETRY] == 0 and X_PARKED_REASON not in copy.headers
    assert await ids_in(lot, queue + ".parking") == []
    audit = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    (entry,) = [a for a in audit if a["event"] == "edited"]
    assert entry["user"] == "local" and entry["message_id"] == parked.message_id
    assert entry["set_headers"] == {"tenant": "us", "x-note": "fixed by hand"}
    assert entry["body_changed"] and entry["old_body_sha256"] == old_digest
    assert entry["new_body_sha256"] == hashlib.sha256(copy.body).hexdigest()
    # The refused broken JSON logs a 400 in the console; nothing else may.
    assert all("400" in p for p in problems), problems


async def test_a_read_only_view_offers_no_edit_and_refuses_one(
    browser: Browser, lot: Scenario, rabbitmq_url: str
) -> None:
    queue = _orders(lot)
    (parked,) = await park(lot, queue, ["missing"])
    settings = WebSettings(url=rabbitmq_url, queues=(queue,), topology=lot.topology, read_only=True)
    problems: list[str] = []
    async with serve(settings) as base, _page(browser, problems) as page:
        await page.goto(f"{base}/message?queue={queue}&key={parked.message_id}")
        await expect(page.locator("#body")).to_be_visible()
        await expect(page.locator("#edit")).to_have_count(0)
        response = await page.request.post(
            f"{base}/actions",
            form={"op": "edit-replay", "queue": queue, "key": parked.message_id, "body": "{}"},
            headers={"Origin": base},
        )
        assert response.status == 403
        assert "read-only" in await response.text()
    assert await ids_in(lot, queue + ".parking") == [parked.message_id]
    assert problems == [], problems
