"""The console at 1366x768 with production-shaped data, in a real browser over a real fleet.

No console page scrolls sideways, whatever the ids and error messages: every page the
console serves is opened (the test fails when the console gains a page it does not open),
with dlq ids of a few hundred characters and errors that are whole stack traces. Parked
messages are grouped by origin topic and error class; a group is counted by a dry run,
cancelled within a time range and replayed whole, and a replayed message's next attempt
shows its replay history. Screenshots go to .local/screenshots/console/.
"""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute
from playwright.sync_api import Page, expect

from services.console.api import router
from shared import dead_letters as dl
from tests.e2e.console import realistic
from tests.e2e.console.conftest import TOKEN, ConsoleFleet, browser_session, off_loop, screenshot
from tests.support.kafka import BOOTSTRAP, read_all
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.e2e

LAPTOP = {"width": 1366, "height": 768}
#: Two lines of a compact row, with room to spare; the rows this replaced were 200 px tall.
MAX_ROW_PX = 64
#: The fleet's policy allows 2 attempts: attempt 2 is parked at once, attempt 1 waits minutes.
PARKED_ATTEMPT, SCHEDULED_ATTEMPT = 2, 1


@pytest.fixture
def laptop(chromium, console_fleet: ConsoleFleet) -> Iterator[Page]:  # type: ignore[no-untyped-def]
    """A fresh browser session on the console, at a 1366x768 laptop's size."""
    with browser_session(chromium, console_fleet, LAPTOP) as page:
        yield page


def send(console_fleet: ConsoleFleet, letters: list[dl.DeadLetter]) -> None:
    off_loop(realistic.send, BOOTSTRAP, console_fleet.topic("dead-letters"), letters)


def api(console_fleet: ConsoleFleet, path: str, **params: Any) -> Any:
    resp = web.get(console_fleet.retry_scheduler.url + path, params=params, timeout=20)
    assert resp.status_code in (200, 404), resp.text
    return resp.json() if resp.status_code == 200 else None


def sideways(page: Page) -> int:
    """How far the page scrolls sideways (0: it fits)."""
    scroll: int = page.evaluate("() => document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth")
    return scroll


def assert_fits(page: Page, what: str) -> None:
    assert page.viewport_size == LAPTOP
    overflow = sideways(page)
    assert overflow <= 0, f"{what} scrolls {overflow}px sideways at 1366x768"


def enter_token(page: Page) -> None:
    page.goto("/token")
    page.get_by_label("Admin token").fill(TOKEN)
    page.get_by_role("button", name="Use this token").click()
    expect(page.locator("#message")).to_contain_text("Token accepted")


def utc_second(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms // 1000, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")


def test_no_console_page_scrolls_sideways_at_1366x768(console_fleet: ConsoleFleet, laptop: Page) -> None:
    run = uuid.uuid4().hex[:8]
    retry = console_fleet.topic("retry")
    parked = realistic.letters(run, retry, count=27, attempt=PARKED_ATTEMPT)
    scheduled = realistic.letters(run, retry, count=12, attempt=SCHEDULED_ATTEMPT, start=1000)
    # Blocked keys of the ordered topic: long keys, each behind a parked head with records held.
    blocked = [f"customer-{n:06d}-{run}-{'k' * 90}" for n in range(10)]
    ordered = [
        letter
        for n, key in enumerate(blocked)
        for letter in realistic.blocked_key(
            realistic.long_id(run, 5000 + n), key.encode(), retry, held=2, head_attempt=PARKED_ATTEMPT
        )
    ]
    send(console_fleet, parked + scheduled + ordered)

    def held_behind(key: str) -> int | None:
        return (api(console_fleet, "/ordered-keys", origin_topic=realistic.ORDERED_ORIGIN, key=key) or {}).get("held")

    wait_for(
        lambda: (
            all(api(console_fleet, f"/parked/{quote(m.id, safe='')}") for m in parked[-3:])
            and all(api(console_fleet, f"/scheduled/{quote(m.id, safe='')}") for m in scheduled[-3:])
            and all(held_behind(k) == 2 for k in blocked)
        ),
        timeout=60,
        message="the realistic dead letters stored",
    )
    blocked_key = {"origin_topic": realistic.ORDERED_ORIGIN, "key": blocked[0]}
    long_id, long_class = parked[0].id, realistic.ERRORS[1]
    long_topic = realistic.ORIGINS[2]
    pages = {
        "/fleet": ["/fleet"],
        "/fleet/table": ["/fleet/table"],
        "/retries": ["/retries", f"/retries?{urlencode({'origin_topic': long_topic, 'error_class': long_class})}"],
        "/parked": ["/parked", "/parked?parked_from=2020-01-01T00:00:00", f"/parked?{urlencode({'origin_topic': long_topic})}"],
        "/retries/message": [f"/retries/message?{urlencode({'id': scheduled[0].id})}"],
        "/parked/message": [f"/parked/message?{urlencode({'id': long_id})}"],
        "/confirm": [
            f"/confirm?{urlencode({'kind': 'parked', 'action': 'replay', 'id': long_id})}",
            f"/confirm?{urlencode({'kind': 'retry', 'action': 'cancel', 'id': scheduled[0].id})}",
        ],
        "/parked/replay-all": [f"/parked/replay-all?{urlencode({'origin_topic': long_topic})}"],
        "/parked/group": [
            f"/parked/group?{urlencode({'action': 'cancel', 'origin_topic': long_topic, 'error_class': long_class})}"
        ],
        "/blocked-keys": ["/blocked-keys", f"/blocked-keys?{urlencode({'origin_topic': realistic.ORDERED_ORIGIN})}"],
        "/blocked-keys/key": [f"/blocked-keys/key?{urlencode(blocked_key)}"],
        "/blocked-keys/confirm": [
            f"/blocked-keys/confirm?{urlencode({'action': action, **blocked_key})}"
            for action in ("replay-head", "skip-head", "park-key")
        ],
        "/tallies": ["/tallies"],
        "/programs/{program_id:path}": [f"/programs/{'program-' * 40}"],
        "/accounts": ["/accounts", f"/accounts?account_id={'acct-' * 60}"],
        "/commands": ["/commands", f"/commands?command_id={'cmd-' * 60}"],
        "/token": [f"/token?next=/parked/message?id={quote(long_id)}"],
    }
    served = {
        r.path
        for r in router.routes
        if isinstance(r, APIRoute) and "GET" in (r.methods or ()) and r.response_class is HTMLResponse
    }
    assert served <= set(pages), f"pages this test does not open: {sorted(served - set(pages))}"

    def look_at_all(session: str) -> None:
        for urls in pages.values():
            for url in urls:
                laptop.goto(url)
                assert_fits(laptop, f"{url} ({session})")
        tables = (("/parked", "#parked"), ("/parked", "#groups"), ("/retries", "#retries"), ("/blocked-keys", "#blocked"))
        for url, table in tables:
            laptop.goto(url)
            heights = laptop.locator(f"{table} tbody tr").evaluate_all("rows => rows.map(r => r.offsetHeight)")
            assert len(heights) >= 9, f"{url} {table} shows {len(heights)} rows"
            assert max(heights) <= MAX_ROW_PX, f"{url} {table} rows are up to {max(heights)}px tall"

    look_at_all("read-only")
    laptop.goto("/parked")
    screenshot(laptop, "laptop-parked")
    laptop.goto("/retries")
    screenshot(laptop, "laptop-retries")
    laptop.goto("/blocked-keys")
    screenshot(laptop, "laptop-blocked-keys-long")
    laptop.goto(f"/blocked-keys/key?{urlencode(blocked_key)}")
    screenshot(laptop, "laptop-blocked-key-long")
    enter_token(laptop)
    look_at_all("with the admin token")
    # What a row cuts short is its tooltip, whole.
    laptop.goto(f"/parked?{urlencode({'origin_topic': realistic.ORIGINS[0]})}")
    row = laptop.locator(f'tr[data-id="{long_id}"]')
    expect(row.locator("th a")).to_have_attribute("title", long_id)
    stored = api(console_fleet, f"/parked/{quote(long_id, safe='')}")
    assert len(stored["error_message"]) > 1500
    expect(row.locator(".error-message")).to_have_attribute("title", stored["error_message"])


def test_a_group_is_counted_cancelled_within_a_time_range_and_replayed(console_fleet: ConsoleFleet, laptop: Page) -> None:
    run = uuid.uuid4().hex[:8]
    origin = f"billing.invoices-{run}"
    retry = console_fleet.topic("retry")

    def wave(start: int, count: int, error_class: str) -> list[dl.DeadLetter]:
        return [
            replace(m, original_topic=origin, error_class=error_class)
            for m in realistic.letters(run, retry, count=count, attempt=PARKED_ATTEMPT, start=start)
        ]

    def parked_at(letters: list[dl.DeadLetter]) -> list[int]:
        found = [api(console_fleet, f"/parked/{quote(m.id, safe='')}") for m in letters]
        return [f["parked_at"] for f in found] if all(found) else []

    early = wave(0, 3, "TimeoutError")
    send(console_fleet, early)
    split = max(wait_for(lambda: parked_at(early), timeout=60, message="the first wave parked"))
    wait_for(lambda: time.time() * 1000 >= (split // 1000 + 1) * 1000, timeout=5, message="the next second")
    late = wave(10, 2, "TimeoutError") + wave(20, 2, realistic.ERRORS[1])
    send(console_fleet, late)
    assert min(wait_for(lambda: parked_at(late), timeout=60, message="the second wave parked")) > split

    # The group, first on the Parked page: its count and its newest error.
    enter_token(laptop)
    laptop.goto("/parked")
    row = laptop.locator(f'#groups tr[data-group="{origin}/TimeoutError"]')
    expect(row.locator(".count")).to_have_text("5")
    expect(row).to_contain_text(re.compile(r"request #1[01] "))  # the newest of the group: of the second wave
    expect(laptop.locator(f'#groups tr[data-group="{origin}/{realistic.ERRORS[1]}"] .count')).to_have_text("2")
    assert_fits(laptop, "/parked with groups")

    # Cancel, within a time range: the dry run counts, nothing changes until confirmed.
    row.get_by_role("button", name="Cancel…").click()
    expect(laptop.locator("#dry-run-count")).to_contain_text("5 parked messages")
    laptop.get_by_label("Parked until (UTC)").fill(utc_second(split))
    laptop.get_by_role("button", name="Count again").click()
    expect(laptop.locator("#dry-run-count")).to_contain_text("3 parked messages")
    assert all(parked_at(early)), "a dry run changes nothing"
    assert_fits(laptop, "the group dry run")
    screenshot(laptop, "laptop-group-dry-run")
    laptop.get_by_role("button", name="Cancel these 3").click()
    expect(laptop.locator("#result")).to_contain_text("3 cancelled (the dry run counted 3)")
    assert_fits(laptop, "the group result")
    assert [api(console_fleet, f"/parked/{quote(m.id, safe='')}") for m in early] == [None, None, None]
    assert all(parked_at(late))

    # Replay the rest of the group, whole: to the retry topic, unparked.
    laptop.goto("/parked")
    row = laptop.locator(f'#groups tr[data-group="{origin}/TimeoutError"]')
    expect(row.locator(".count")).to_have_text("2")
    row.get_by_role("button", name="Replay…").click()
    expect(laptop.locator("#dry-run-count")).to_contain_text("2 parked messages")
    laptop.get_by_role("button", name="Replay these 2").click()
    expect(laptop.locator("#result")).to_contain_text("2 replayed")
    replayed = late[:2]
    on_retry = wait_for(
        lambda: [r for r in off_loop(read_all, retry) if dict(r.headers).get(dl.ID) in {m.id.encode() for m in replayed}],
        timeout=30,
        message="the group's redeliveries",
    )
    assert sorted(dict(r.headers)[dl.ID] for r in on_retry) == sorted(m.id.encode() for m in replayed)
    assert not [r for r in off_loop(read_all, retry) if dict(r.headers).get(dl.ID) in {m.id.encode() for m in early}]
    laptop.goto("/parked")
    expect(laptop.locator(f'#groups tr[data-group="{origin}/TimeoutError"]')).to_have_count(0)

    # Its consumer fails again: the next attempt is parked, and its page shows the replay.
    again = replace(replayed[0], attempt=PARKED_ATTEMPT + 1)
    send(console_fleet, [again])
    wait_for(
        lambda: (api(console_fleet, f"/parked/{quote(again.id, safe='')}") or {}).get("attempt") == again.attempt,
        timeout=60,
        message="the next attempt parked",
    )
    laptop.goto(f"/parked/message?{urlencode({'id': again.id})}")
    history = laptop.locator("#replays tbody tr")
    expect(history).to_have_count(1)
    expect(history).to_contain_text("replayed with its group")
    expect(history.locator("td.num")).to_have_text(str(PARKED_ATTEMPT))
    assert_fits(laptop, "a message with its replay history")
    screenshot(laptop, "laptop-replay-history")
