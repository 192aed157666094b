"""Retry now from the web view, in a real browser (Debian's chromium)."""

from __future__ import annotations

import json
from pathlib import Path

import aio_pika
import pytest
from playwright.async_api import Browser, expect

from delayed_retry import publish_delayed
from delayed_retry.web import WebSettings
from tests.support.chain import Scenario
from tests.support.web import ids_in, park, serve
from tests.web.test_browser_broker import _orders, _page, _shot, browser, lot

pytestmark = [pytest.mark.broker, pytest.mark.browser]

__all__ = ["browser", "lot"]  # the fixtures, shared with the browser tests


async def test_browser_delivers_what_waits_for_a_queue_after_asking(
    browser: Browser, lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = _orders(lot)
    await park(lot, queue, ["timeout"])  # the page needs the queue's parking lot
    channel = await lot.connection.channel()
    for n in range(2):
        await publish_delayed(
            channel,
            aio_pika.Message(b"later", message_id=f"later-{n}"),
            queue=queue,
            delay=60,
            topology=lot.topology,
        )
    await channel.close()
    settings = WebSettings(
        url=rabbitmq_url, queues=(queue,), topology=lot.topology, audit_log=tmp_path / "a.jsonl"
    )
    problems: list[str] = []
    async with serve(settings) as base, _page(browser, problems) as page:
        await page.goto(f"{base}/parked?queue={queue}")
        await page.get_by_role("button", name="Deliver now…").click()
        confirm = page.locator("#confirm")
        # Nothing moves before the confirmation, which counts what waits.
        await expect(confirm).to_contain_text(
            f"Deliver the 2 messages waiting in the chain for {queue}"
        )
        assert await lot.depth(queue) == 0
        await _shot(page, "queue-expedite-confirm")
        await confirm.get_by_role("button", name="Deliver 2 now").click()
        await expect(page.locator("#confirm")).to_contain_text(
            f"Delivered 2 waiting messages to {queue}"
        )

        await lot.wait_for_depth(queue, 2)
        assert sorted(await ids_in(lot, queue)) == ["later-0", "later-1"]
        # Asked again: nothing waits any more.
        await page.get_by_role("button", name="Deliver now…").click()
        await expect(page.locator("#confirm")).to_contain_text("No message waits in the chain")
    audit = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [(a["event"], a["queue"], a["done"]) for a in audit] == [("expedited", queue, 2)]
    assert problems == [], problems
