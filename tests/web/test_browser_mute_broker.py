"""Muting a failure group's alerts from the web view, in a real browser (Debian's chromium)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aio_pika.abc import AbstractRobustConnection
from playwright.async_api import Browser, expect

from delayed_retry.alerts.mute_store import read_mutes
from delayed_retry.durations import utcnow
from delayed_retry.web import WebSettings
from tests.support.chain import Scenario
from tests.support.web import park, serve
from tests.web.test_browser_broker import _orders, _page, _shot, browser, lot

pytestmark = [pytest.mark.broker, pytest.mark.browser]

__all__ = ["browser", "lot"]  # the fixtures, shared with the browser tests


async def test_browser_mutes_a_group_and_lifts_it(
    browser: Browser,
    lot: Scenario,
    connection: AbstractRobustConnection,
    rabbitmq_url: str,
    tmp_path: Path,
) -> None:
    queue = _orders(lot)
    await park(lot, queue, ["timeout", "missing", "timeout"])
    settings = WebSettings(
        url=rabbitmq_url, queues=(queue,), topology=lot.topology, audit_log=tmp_path / "a.jsonl"
    )
    problems: list[str] = []
    async with serve(settings) as base, _page(browser, problems) as page:
        await page.goto(f"{base}/parked?queue={queue}")
        row = page.locator("#groups tbody tr", has_text="GatewayTimeout")
        group = await row.get_attribute("data-group")
        assert group
        await row.get_by_role("button", name="Mute alerts 2 h").click()
        row = page.locator(f"#groups tbody tr[data-group='{group}']")
        await expect(row.locator(".chip.mute")).to_contain_text("alerts muted until")
        await expect(row.get_by_role("button", name="Lift mute")).to_be_visible()
        other = page.locator("#groups tbody tr", has_text="CustomerMissing")
        await expect(other.locator(".chip.mute")).to_have_count(0)
        await _shot(page, "queue-group-muted")

        # On the broker, where every alerts process reads it; who did it is recorded.
        mute = (await read_mutes(connection, topology=lot.topology)).get(group, utcnow())
        assert mute is not None and mute.by is not None
        assert (mute.until - mute.at).total_seconds() == 2 * 3600

        await row.get_by_role("button", name="Lift mute").click()
        await expect(row.get_by_role("button", name="Mute alerts 2 h")).to_be_visible()
        await expect(row.locator(".chip.mute")).to_have_count(0)
    assert (await read_mutes(connection, topology=lot.topology)).get(group, utcnow()) is None
    audit = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [(a["event"], a["group"]) for a in audit] == [("muted", group), ("mute-lifted", group)]
    assert problems == [], problems
