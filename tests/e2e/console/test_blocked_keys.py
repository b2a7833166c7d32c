"""Ordered retries' blocked keys in the console, in a real browser over a real fleet.

Two keys of the fleet's ordered topic are blocked behind a parked head with records held
behind it (dead letters as a consumer on the retry client writes them). Through the console an
operator finds them on the Blocked keys page, opens one, replays its parked head (redelivered,
now away), skips the head (the next held record is redelivered and becomes the head), reaches
the other key from its head's message page and parks the whole key (it leaves the list, its
records are in the parking lot). Each step is checked through the retry scheduler's API and the
topics, not only on the page. Screenshots go to .local/screenshots/console/.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest
from playwright.sync_api import Page, expect

from shared import dead_letters as dl
from shared.ordered_retries import HELD_BEHIND
from tests.e2e.console import realistic
from tests.e2e.console.conftest import ConsoleFleet, browser_session, off_loop, screenshot
from tests.e2e.console.test_parking_lot import LAPTOP, PARKED_ATTEMPT, assert_fits, enter_token, send
from tests.support.kafka import read_all
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.e2e

ORIGIN = realistic.ORDERED_ORIGIN
PARTITIONS = 4  # the fleet's STATEFLEET_TOPIC_PARTITIONS
PARKED_WITH_KEY = "its key was parked by an operator (ordered retries)"


@pytest.fixture
def laptop(chromium, console_fleet: ConsoleFleet) -> Iterator[Page]:  # type: ignore[no-untyped-def]
    """A fresh browser session on the console, at a 1366x768 laptop's size."""
    with browser_session(chromium, console_fleet, LAPTOP) as page:
        yield page


def lane(console_fleet: ConsoleFleet, key: str) -> dict[str, Any] | None:
    """GET /ordered-keys: the key's head, its status and held records; None when it is not blocked."""
    resp = web.get(console_fleet.retry_scheduler.url + "/ordered-keys", params={"origin_topic": ORIGIN, "key": key}, timeout=20)
    assert resp.status_code in (200, 404), resp.text
    return resp.json() if resp.status_code == 200 else None


def listed_keys(console_fleet: ConsoleFleet) -> list[str | None]:
    resp = web.get(console_fleet.retry_scheduler.url + "/ordered-keys/blocked", params={"origin_topic": ORIGIN}, timeout=20)
    assert resp.status_code == 200, resp.text
    return [item["key"] for item in resp.json()["items"]]


def parked_ids(console_fleet: ConsoleFleet) -> set[str]:
    """Every parked message of the ordered topic (the list reads every partition)."""
    resp = web.get(console_fleet.retry_scheduler.url + "/parked", params={"origin_topic": ORIGIN, "limit": 1000}, timeout=20)
    assert resp.status_code == 200, resp.text
    return {item["id"] for item in resp.json()["items"]}


def sent_to(console_fleet: ConsoleFleet, topic: str, dlq_id: str) -> list[Any]:
    return [r for r in off_loop(read_all, console_fleet.topic(topic)) if dict(r.headers).get(dl.ID) == dlq_id.encode()]


def key_row(page: Page, key: str) -> Any:
    return page.locator("#blocked tbody tr", has=page.get_by_role("link", name=key, exact=True))


def confirm(page: Page, button: str, yes: str) -> None:
    """Press an action's button on a key's page, then confirm it on the confirmation page."""
    page.get_by_role("button", name=button).click()
    expect(page.locator("#what")).to_be_visible()
    assert_fits(page, f"the confirmation of {button}")
    screenshot(page, f"laptop-blocked-key-confirm-{button.rstrip('…').lower().replace(' ', '-')}")
    page.get_by_role("button", name=yes).click()


def test_an_operator_replays_skips_and_parks_blocked_keys(console_fleet: ConsoleFleet, laptop: Page) -> None:
    run = uuid.uuid4().hex[:8]
    retry = console_fleet.topic("retry")
    key_a, key_b = f"account-{run}-a", f"account-{run}-b"
    head_a = f"ledger-{run}-a0"
    # B's head is kept in its key's partition, not its id's: its message page is found all the same.
    head_b = realistic.id_outside_lane_partition(f"ledger-{run}-b0", key_b.encode(), PARTITIONS)
    send(
        console_fleet,
        realistic.blocked_key(head_a, key_a.encode(), retry, held=2, head_attempt=PARKED_ATTEMPT)
        + realistic.blocked_key(head_b, key_b.encode(), retry, held=2, head_attempt=PARKED_ATTEMPT),
    )
    for key, head in ((key_a, head_a), (key_b, head_b)):
        wait_for(
            lambda key=key: (lane(console_fleet, key) or {}).get("held") == 2,  # type: ignore[misc]
            timeout=60,
            message=f"{key} blocked with two records held",
        )
        assert lane(console_fleet, key) == {
            "head": head,
            "head_status": "parked",
            "held": 2,
            "held_ids": [f"{head}.h1", f"{head}.h2"],
        }

    # Found on the Blocked keys page, filtered by the origin topic.
    enter_token(laptop)
    laptop.goto("/blocked-keys")
    laptop.get_by_label("Origin topic").fill(ORIGIN)
    laptop.get_by_role("button", name="Filter").click()
    for key in (key_a, key_b):
        row = key_row(laptop, key)
        expect(row.locator(".held")).to_have_text("2")
        expect(row.locator(".head-status")).to_have_text("parked")
    assert_fits(laptop, "/blocked-keys")
    screenshot(laptop, "laptop-blocked-keys")

    # A: its page shows the parked head and what it holds; replay the head.
    key_row(laptop, key_a).get_by_role("link", name=key_a).click()
    expect(laptop.locator("#head-status")).to_contain_text("parked")
    expect(laptop.locator("#held-ids li")).to_have_text([f"{head_a}.h1", f"{head_a}.h2"])
    assert_fits(laptop, "a blocked key's page")
    screenshot(laptop, "laptop-blocked-key")
    confirm(laptop, "Replay head…", "Yes, replay head")
    expect(laptop.locator("#result")).to_contain_text(f"The head {head_a} was redelivered")
    wait_for(lambda: sent_to(console_fleet, "retry", head_a), timeout=30, message="the head redelivered")
    assert lane(console_fleet, key_a) == {
        "head": head_a,
        "head_status": "away",
        "held": 2,
        "held_ids": [f"{head_a}.h1", f"{head_a}.h2"],
    }
    assert head_a not in parked_ids(console_fleet)

    # The head is away now: replay is not offered (and refused with a readable message when
    # asked for anyway); skip it, and the next held record is redelivered as the head.
    laptop.get_by_role("link", name="Back").click()
    expect(laptop.locator("#head-status")).to_contain_text("away")
    expect(laptop.get_by_role("button", name="Replay head…")).to_have_count(0)
    laptop.goto(f"/blocked-keys/confirm?{urlencode({'action': 'replay-head', 'origin_topic': ORIGIN, 'key': key_a})}")
    expect(laptop.locator("#error")).to_contain_text(f"Only a parked head is replayed; the head {head_a} is away")
    screenshot(laptop, "laptop-blocked-key-refused")
    laptop.goto(f"/blocked-keys/key?{urlencode({'origin_topic': ORIGIN, 'key': key_a})}")
    confirm(laptop, "Skip head…", "Yes, skip head")
    expect(laptop.locator("#result")).to_contain_text(f"The next record, {head_a}.h1, was redelivered and is the head now")
    assert lane(console_fleet, key_a) == {"head": f"{head_a}.h1", "head_status": "away", "held": 1, "held_ids": [f"{head_a}.h2"]}
    [released] = wait_for(
        lambda: sent_to(console_fleet, "retry", f"{head_a}.h1"), timeout=30, message="the next record redelivered"
    )
    assert dict(released.headers)[HELD_BEHIND] == head_a.encode()
    assert len(sent_to(console_fleet, "retry", head_a)) == 1, "a skipped head is not redelivered again"
    laptop.get_by_role("link", name="Back").click()
    expect(laptop.locator("#head")).to_contain_text(f"{head_a}.h1")

    # B: reached from its parked head's message page; park the whole key.
    laptop.goto(f"/parked/message?{urlencode({'id': head_b})}")
    assert_fits(laptop, "a parked head's message page")
    screenshot(laptop, "laptop-parked-head")
    laptop.locator("#heads-key").get_by_role("link", name="Open its key").click()
    expect(laptop.locator("h1")).to_contain_text(key_b)
    confirm(laptop, "Park key…", "Yes, park key")
    parked_text = f"Key {key_b} of {ORIGIN}: 2 records moved to the parking lot; the key is free"
    expect(laptop.locator("#result")).to_contain_text(parked_text)
    assert_fits(laptop, "a key action's result")
    screenshot(laptop, "laptop-blocked-key-parked")
    assert lane(console_fleet, key_b) is None
    assert listed_keys(console_fleet) == [key_a]
    assert {head_b, f"{head_b}.h1", f"{head_b}.h2"} <= parked_ids(console_fleet)
    for held in (f"{head_b}.h1", f"{head_b}.h2"):
        [record] = wait_for(lambda held=held: sent_to(console_fleet, "parking-lot", held), timeout=30, message=f"{held} parked")  # type: ignore[misc]
        assert dict(record.headers)["dlq.parked.reason"] == PARKED_WITH_KEY.encode()
    assert not sent_to(console_fleet, "retry", f"{head_b}.h1"), "a parked key's records are not redelivered"
    laptop.get_by_role("link", name="Back").click()
    expect(key_row(laptop, key_b)).to_have_count(0)
    expect(key_row(laptop, key_a)).to_have_count(1)
