"""The web view in a real browser: Debian's chromium driven by Playwright.

Each view is saved as a screenshot under ``test-artifacts/web/`` (ignored by git).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import aio_pika
import pytest
from aio_pika.abc import AbstractRobustConnection
from aiohttp import web
from playwright.async_api import (
    Browser,
    ConsoleMessage,
    FloatRect,
    Page,
    async_playwright,
    expect,
)

from delayed_retry import publish_delayed
from delayed_retry.durations import to_epoch_ms, utcnow
from delayed_retry.web import WebSettings
from tests.support.browser import CHROMIUM_ARGS, chromium
from tests.support.chain import Scenario, open_scenario
from tests.support.retrying import fail_with_retries, park_after_retries
from tests.support.waiting import wait_until
from tests.support.web import ids_in, park, serve

pytestmark = [pytest.mark.broker, pytest.mark.browser]

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "web"


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    """Headless chromium from Debian's package (scripts/bootstrap installs it)."""
    executable = chromium()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def lot(
    connection: AbstractRobustConnection, unique: str, rabbitmq_url: str
) -> AsyncIterator[Scenario]:
    async with open_scenario(connection, unique, rabbitmq_url, "classic") as scenario:
        scenario.track_queue(_orders(scenario), _orders(scenario) + ".parking")
        yield scenario


def _orders(lot: Scenario) -> str:
    """A short work-queue name (it shows in the screenshots), unique like the chain's prefix."""
    return f"orders-{lot.unique[-6:]}"


@contextlib.asynccontextmanager
async def _page(browser: Browser, problems: list[str]) -> AsyncIterator[Page]:
    """A page whose console errors and warnings go to ``problems``; closed on leaving, so
    enter it inside ``serve``: a page left open past the server logs its live counts'
    reconnects as errors."""
    page = await browser.new_page(viewport={"width": 1280, "height": 900})

    def on_console(message: ConsoleMessage) -> None:
        if message.type in ("error", "warning"):
            problems.append(message.text)

    page.on("console", on_console)
    page.on("pageerror", lambda error: problems.append(str(error)))
    try:
        yield page
    finally:
        await page.close()


async def _shot(page: Page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    await page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


async def test_browser_lists_filters_and_replays_a_group(
    browser: Browser, lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = _orders(lot)
    await park(lot, queue, ["timeout", "missing", "timeout", "timeout", "missing"])
    # Two messages waiting in the chain (due in about a minute: level 15 of 1 ms units).
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
        url=rabbitmq_url,
        queues=(queue,),
        topology=lot.topology,
        audit_log=tmp_path / "audit.jsonl",
        live_interval=0.5,
    )
    problems: list[str] = []
    async with serve(settings) as base, _page(browser, problems) as page:
        await page.goto(base + "/")
        row = page.locator("#parking tbody tr", has_text=queue)
        await expect(row.locator("[data-live]")).to_have_text("5")
        await expect(page.locator("#live")).to_have_class("live on")  # an SSE event arrived
        level = page.locator("#levels tbody tr")
        await expect(level).to_have_count(1)
        await expect(level.locator("[data-live]")).to_have_text("2")
        await expect(page.locator("#waiting")).to_have_text("2")
        await _shot(page, "overview")

        await row.get_by_role("link", name=queue).click()
        messages = page.locator("#messages tbody tr[data-key]")
        await expect(messages).to_have_count(5)
        await expect(page.locator("#groups tbody tr")).to_have_count(2)
        await _shot(page, "queue")

        await page.fill("input[name=exception]", "CustomerMissing")
        await page.click("form.filters button[type=submit]")
        await expect(messages).to_have_count(2)
        assert sorted(await messages.evaluate_all("rows => rows.map(r => r.dataset.key)")) == [
            "missing-101",
            "missing-104",
        ]
        await _shot(page, "queue-filtered")

        await page.get_by_role("link", name="missing-101").click()
        body = page.locator("#body")
        await expect(body).to_contain_text("<b>not bold</b>")  # shown as text, not markup
        assert await body.locator("b").count() == 0
        await expect(page.locator("#record")).to_contain_text("CustomerMissing")
        headers = page.locator("#headers")
        await expect(headers).to_contain_text("<img src=x onerror=alert(1)>")
        assert await headers.locator("img").count() == 0
        await _shot(page, "message")

        await page.goto(f"{base}/parked?queue={queue}")
        timeout_row = page.locator("#groups tbody tr", has_text="GatewayTimeout")
        await expect(timeout_row.locator("td.num")).to_have_text("3")
        await timeout_row.get_by_role("button", name="Replay group").click()
        # Nothing happens before the confirmation, which says how many go where, and how.
        confirm = page.locator("#confirm")
        await expect(confirm).to_contain_text(
            f"Replay 3 parked messages of {queue}.parking to queue {queue}?"
        )
        await expect(confirm).to_contain_text("1 first as canary (timeout-100)")
        await expect(confirm).to_contain_text("Pace: at most 50 messages per second")
        assert len(await ids_in(lot, queue + ".parking")) == 5
        await confirm.get_by_role("button", name="Replay 3 messages").click()
        job = page.locator("#jobs .job").first
        await expect(page.locator("#confirm")).to_be_empty()
        # All replayed, but the canary could still park again: watched, not green yet.
        await expect(job).to_have_attribute("data-state", "confirming", timeout=30_000)
        await expect(job.locator(".done")).to_have_text("3")
        await expect(job).to_contain_text("not confirmed yet")
        await _shot(page, "queue-replay-confirming")
        await expect(job).to_have_attribute("data-state", "finished", timeout=30_000)
        await expect(job).to_contain_text("confirmed: it did not park again")
        await _shot(page, "queue-replayed")
        await page.goto(base + "/")
        await expect(page).to_have_title("Overview · delayed-retry")
        await expect(page.locator("#audit tbody tr")).to_have_count(1)
        await expect(page.locator("#audit tbody tr")).to_contain_text("replay")
        await _shot(page, "overview-after-replay")

    async def arrived() -> bool:
        return await lot.depth(queue) == 3

    await wait_until(arrived, timeout=30)
    assert sorted(await ids_in(lot, queue)) == ["timeout-100", "timeout-102", "timeout-103"]
    assert sorted(await ids_in(lot, queue + ".parking")) == ["missing-101", "missing-104"]
    audit = [json.loads(x) for x in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert [(a["event"], a["action"]) for a in audit] == [
        ("accepted", "replay"),
        ("finished", "replay"),
    ]
    assert problems == [], problems  # no CSP violation, no script error


async def test_browser_purge_needs_the_typed_confirmation(
    browser: Browser, lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = _orders(lot)
    await park(lot, queue, ["missing", "timeout"])
    settings = WebSettings(url=rabbitmq_url, queues=(queue,), topology=lot.topology)
    problems: list[str] = []
    async with serve(settings) as base, _page(browser, problems) as page:
        await page.goto(f"{base}/parked?queue={queue}")
        await page.check("input[value='missing-100']")
        await page.get_by_role("button", name="Purge selected").click()
        await expect(page.locator("#jobs .notice")).to_contain_text("type the queue name")
        assert sorted(await ids_in(lot, queue + ".parking")) == ["missing-100", "timeout-101"]

        await page.fill("input[name=confirm]", queue)
        await page.get_by_role("button", name="Purge selected").click()
        job = page.locator("#jobs .job").first
        await expect(job).to_have_attribute("data-state", "finished", timeout=30_000)
        await _shot(page, "queue-purged")

        await page.goto(f"{base}/message?queue={queue}&key=timeout-101")
        await page.get_by_role("button", name="Replay this message").click()
        await expect(page.locator("#confirm")).to_contain_text(
            f"Replay 1 parked message of {queue}.parking to queue {queue}?"
        )
        await page.get_by_role("button", name="Replay 1 message").click()
        job = page.locator("#jobs .job").first
        await expect(job).to_have_attribute("data-state", "finished", timeout=30_000)
        await _shot(page, "message-replayed")

    async def arrived() -> bool:
        return await lot.depth(queue) == 1

    await wait_until(arrived, timeout=30)
    assert await ids_in(lot, queue) == ["timeout-101"]
    assert await lot.depth(queue + ".parking") == 0
    # The failed first try logs a 400 in the console; nothing else may.
    assert all("400" in p for p in problems), problems


async def test_browser_cross_origin_post_is_refused(
    browser: Browser, lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = _orders(lot)
    await park(lot, queue, ["missing"])
    settings = WebSettings(url=rabbitmq_url, queues=(queue,), topology=lot.topology)
    async with serve(settings) as base:
        # Another site on another port: a plain HTML form posting to the view (CSRF).
        evil = web.Application()
        form = (
            f'<form method="post" action="{base}/actions">'
            f'<input name="queue" value="{queue}"><input name="op" value="purge-selection">'
            f'<input name="message_ids" value="missing-100"><input name="confirm" value="{queue}">'
            '<button id="go">win a prize</button></form>'
        )

        async def evil_page(request: web.Request) -> web.Response:
            return web.Response(text=form, content_type="text/html")

        evil.router.add_get("/", evil_page)
        runner = web.AppRunner(evil, shutdown_timeout=1)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        try:
            host, port = runner.addresses[0][:2]
            page = await browser.new_page()
            await page.goto(f"http://{host}:{port}/")
            async with page.expect_response(lambda r: r.url == f"{base}/actions") as info:
                await page.click("#go")
            response = await info.value
            assert response.status == 403
            await _shot(page, "cross-origin-refused")
        finally:
            await runner.cleanup()
    assert await ids_in(lot, queue + ".parking") == ["missing-100"]


async def test_browser_pages_through_a_parking_lot(
    browser: Browser, lot: Scenario, rabbitmq_url: str
) -> None:
    queue = _orders(lot)
    await park(lot, queue, ["missing", "timeout", "missing"])
    settings = WebSettings(url=rabbitmq_url, queues=(queue,), topology=lot.topology, page_size=2)
    problems: list[str] = []
    async with serve(settings) as base, _page(browser, problems) as page:
        await page.goto(f"{base}/parked?queue={queue}")
        rows = page.locator("#messages tbody tr[data-key]")
        keys = "rows => rows.map(r => r.dataset.key)"
        await expect(rows).to_have_count(2)
        first = await rows.evaluate_all(keys)
        await page.get_by_role("link", name="later →").click()
        await expect(rows).to_have_count(1)
        second = await rows.evaluate_all(keys)
        await expect(page.locator(".pager")).to_contain_text("3–3 of 3")
        # Parking order decides the pages; together they hold each message once.
        assert sorted(first + second) == ["missing-100", "missing-102", "timeout-101"]
        await page.get_by_role("link", name="← earlier").click()
        await expect(rows).to_have_count(2)
        assert await rows.evaluate_all(keys) == first
    assert problems == [], problems


async def test_browser_replay_asks_first_and_its_canary_stops_a_replay_that_still_fails(
    browser: Browser, lot: Scenario, rabbitmq_url: str
) -> None:
    queue = _orders(lot)
    # The cause is not fixed: retried after 1, 2 and 4 s, then parked (records span ~7 s), so
    # a canary watched for a fixed 5 s would pass while still retrying.
    still_failing = await fail_with_retries(lot, queue, waits=(1, 2, 4))
    problems: list[str] = []
    try:
        ids = await park_after_retries(lot, queue, 4)
        settings = WebSettings(url=rabbitmq_url, queues=(queue,), topology=lot.topology)
        async with serve(settings) as base, _page(browser, problems) as page:
            await page.goto(f"{base}/parked?queue={queue}")
            await page.get_by_role("button", name="Replay group").click()
            confirm = page.locator("#confirm")
            await expect(confirm).to_contain_text(
                f"Replay 4 parked messages of {queue}.parking to queue {queue}?"
            )
            # The canary waits for what its record took (2 x 7 s + 5 s), not a fixed 5 s.
            await expect(confirm).to_contain_text(
                re.compile(r"twice the canary's retry span of [7-9]")
            )
            await expect(confirm).to_contain_text("the other 3 stay parked")
            await _shot(page, "replay-confirmation")
            await confirm.get_by_role("button", name="Replay 4 messages").click()
            job = page.locator("#jobs .job").first
            await expect(job).to_have_attribute("data-state", "stopped", timeout=30_000)
            await expect(job).to_have_class("job job-stopped")
            await expect(job).to_contain_text("parked again: the cause is not fixed")
            await expect(job).to_contain_text("the other 3 were not touched")
            await expect(job.locator(".done")).to_have_text("1")
            await _shot(page, "replay-canary-stopped")

        async def all_parked() -> bool:
            return await lot.depth(queue + ".parking") == 4

        await wait_until(all_parked, timeout=30, what="the canary to be parked again")
    finally:
        await still_failing()
    assert sorted(await ids_in(lot, queue + ".parking")) == ids
    assert problems == [], problems


_TRACEBACK = """Traceback (most recent call last):
  File "/app/orders.py", line 9, in handle
    customer = data["customer_id"]  # <script>alert(1)</script>
KeyError: 'customer_id'"""


async def test_browser_shows_tracebacks_group_keys_and_the_newest_parked_first(
    browser: Browser, lot: Scenario, rabbitmq_url: str
) -> None:
    queue = _orders(lot)
    parking = queue + ".parking"
    channel = await lot.connection.channel()
    await channel.declare_queue(queue, durable=True)
    await channel.declare_queue(parking, durable=True)
    now = utcnow()
    # In queue order; parked at other times (a replayed message parks again later, say).
    rows = [("k-old", "customer_id", 180), ("k-new", "customer_id", 1)]
    rows += [("k-mid", "sku", 60), ("k-mid2", "customer_id", 120)]
    for ident, key, minutes_ago in rows:
        headers: dict[str, aio_pika.abc.FieldValue] = {
            "x-parked-reason": "not-retryable",
            "x-parked-at": to_epoch_ms(now - timedelta(minutes=minutes_ago)),
            "x-exception-type": "KeyError",
            "x-exception-message": repr(key),
            "x-exception-traceback": _TRACEBACK.replace("customer_id", key),
        }
        await channel.default_exchange.publish(
            aio_pika.Message(b"{}", message_id=ident, headers=headers), routing_key=parking
        )
    await channel.close()
    settings = WebSettings(url=rabbitmq_url, queues=(queue,), topology=lot.topology)
    problems: list[str] = []
    async with serve(settings) as base, _page(browser, problems) as page:
        await page.goto(f"{base}/parked?queue={queue}")
        group = page.locator("#groups tbody tr")
        await expect(group).to_have_count(1)  # one group, as before
        await expect(group.locator("a.mono")).to_have_text(
            "KeyError: 'customer_id' [app/orders.py in handle]"
        )
        await expect(group).to_contain_text("most common: 'customer_id' in 3 of 4")
        await expect(
            page.locator("section", has=page.locator("#messages")).locator("h2")
        ).to_have_text("Messages newest parked first")
        messages = page.locator("#messages tbody tr[data-key]")
        await expect(messages).to_have_count(4)
        keys = await messages.evaluate_all("rows => rows.map(r => r.dataset.key)")
        assert keys == ["k-new", "k-mid", "k-mid2", "k-old"]
        await _shot(page, "queue-keys-newest-first")

        await page.get_by_role("link", name="k-new").click()
        traceback = page.locator("#traceback")
        await expect(traceback).to_be_visible()
        # Every line on its own line, the markup as text.
        assert (await traceback.inner_text()).splitlines() == _TRACEBACK.splitlines()
        assert await traceback.locator("script").count() == 0
        header = page.locator("#headers tr", has_text="x-exception-traceback").locator("td")
        assert (await header.inner_text()).splitlines() == _TRACEBACK.splitlines()
        await _shot(page, "message-traceback")
    assert problems == [], problems


_PLACEHOLDER_FITS = """input => {
  const style = getComputedStyle(input);
  const context = document.createElement("canvas").getContext("2d");
  context.font = style.font;
  const room = input.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
  return context.measureText(input.placeholder).width <= room;
}"""


def _middle(box: FloatRect | None) -> float:
    assert box is not None
    return box["y"] + box["height"] / 2


async def test_browser_offers_only_what_can_be_done_and_shows_every_filter_in_force(
    browser: Browser, lot: Scenario, rabbitmq_url: str, tmp_path: Path
) -> None:
    queue = _orders(lot)
    await park(lot, queue, ["timeout", "missing", "timeout"])
    settings = WebSettings(
        url=rabbitmq_url,
        queues=(queue,),
        topology=lot.topology,
        audit_log=tmp_path / "audit.jsonl",
        live_interval=0.5,
    )
    problems: list[str] = []
    async with serve(settings) as base, _page(browser, problems) as page:
        await page.goto(base + "/")
        # The live state is a word as well as a colour, the same on every load.
        await expect(page.locator("#live-state")).to_have_text("live")
        await expect(page.locator("#live")).to_have_class("live on")
        # The sparkline says what a bar is and how tall the tallest is.
        label = page.locator("#parking tbody tr", has_text=queue).locator(".chart-label")
        await expect(label).to_have_text(re.compile(r"^last .+, one bar per .+; tallest bar: 3 "))
        await _shot(page, "overview-labels")

        # A failure group picked from the table shows itself beside the empty boxes.
        await page.goto(f"{base}/parked?queue={queue}")
        group_row = page.locator("#groups tbody tr", has_text="GatewayTimeout")
        group = await group_row.get_attribute("data-group")
        await group_row.locator("td a").first.click()
        chip = page.locator("#group-filter")
        await expect(chip).to_be_visible()
        await expect(chip).to_contain_text(f"failure group {group}")
        await expect(page.locator("#messages tbody tr[data-key]")).to_have_count(2)
        assert await page.locator("input[name=exception]").input_value() == ""
        await _shot(page, "queue-group-filter")

        # "or all at once" sits on the rate's line; the canary wait's hint is not cut.
        rate = await page.locator("input[name=rate]").bounding_box()
        at_once = await page.locator("input[name=all_at_once]").bounding_box()
        assert abs(_middle(rate) - _middle(at_once)) < 8, (rate, at_once)
        assert rate is not None and at_once is not None and at_once["x"] > rate["x"]
        wait = page.locator("input[name=canary_wait]")
        assert await wait.get_attribute("placeholder") == "from records"
        assert await wait.evaluate(_PLACEHOLDER_FITS)

        await chip.get_by_role("link").click()
        await expect(page.locator("#group-filter")).to_have_count(0)
        await expect(page.locator("#messages tbody tr[data-key]")).to_have_count(3)

        # Nothing matches: nothing to replay or purge is offered.
        await page.goto(f"{base}/parked?queue={queue}&exception=NoSuchError")
        for name in ("Replay all 0 matching", "Purge all 0 matching"):
            await expect(page.get_by_role("button", name=name)).to_be_disabled()
        for name in ("Replay selected", "Purge selected"):
            await expect(page.get_by_role("button", name=name)).to_be_disabled()
        await page.goto(f"{base}/parked?queue={lot.topology.unroutable_queue}")
        await expect(page.locator("#groups")).to_contain_text("Nothing parked.")
        await expect(page.get_by_role("button", name="Replay all 0 matching")).to_be_disabled()
        await expect(page.get_by_role("button", name="Purge all 0 matching")).to_be_disabled()
        await _shot(page, "unroutable-empty")
        # Where messages match, the buttons are there to use.
        await page.goto(f"{base}/parked?queue={queue}")
        await expect(page.get_by_role("button", name="Replay all 3 matching")).to_be_enabled()
    assert problems == [], problems
