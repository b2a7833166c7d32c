"""The operator console in a real browser, over a real fleet.

A poison message shows under Retries with its headers, is redelivered from the page,
fails again and reaches Parked, cannot be replayed without the admin token and is
replayed with it; a program's tally on the page is the API's; stopping a service turns
its row on the Fleet page to down. The pages are saved as screenshots on the way
(.local/screenshots/console/).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from shared import dead_letters as dl
from tests.e2e.console.conftest import TOKEN, ConsoleFleet, off_loop, screenshot
from tests.support.kafka import produce, read_all
from tests.support.services import wait_for
from tools import web

pytestmark = pytest.mark.e2e

ORIGIN = "orders"


def poison_letter(console_fleet: ConsoleFleet, dlq_id: str, attempt: int, *, first_failed_at: int) -> dl.DeadLetter:
    return dl.DeadLetter(
        id=dlq_id,
        key=b"order-42",
        value=b'{"order_id": "order-42", "amount": "forty-two"}',
        original_topic=ORIGIN,
        original_partition=3,
        original_offset=42,
        retry_topic=console_fleet.topic("retry"),
        attempt=attempt,
        error_class="PoisonMessageError",
        error_message="'amount' is not a number",
        first_failed_at=first_failed_at,
        failed_at=dl.now_ms(),
        other_headers=[("traceparent", b"00-console-test-01")],
    )


def send_letter(console_fleet: ConsoleFleet, letter: dl.DeadLetter) -> None:
    off_loop(produce, console_fleet.topic("dead-letters"), [(letter.key, letter.value)], headers=letter.headers())


def reload_until_visible(page: Page, url: str, selector: str, timeout: float = 30.0) -> None:
    """Open ``url`` until ``selector`` is on it (the scheduler reads the message asynchronously)."""

    def shown() -> bool:
        page.goto(url)
        return bool(page.locator(selector).count())

    try:
        wait_for(shown, timeout=timeout, interval=0.5, message=f"{selector} on {url}")
    except TimeoutError:
        raise AssertionError(f"{selector} not on {url} within {timeout}s; the page says:\n{page.inner_text('main')}") from None


def enter_token(page: Page, token: str) -> None:
    page.get_by_role("link", name="Enter admin token").click()
    page.get_by_label("Admin token").fill(token)
    page.get_by_role("button", name="Use this token").click()


def retry_records(console_fleet: ConsoleFleet, dlq_id: str) -> list[Any]:
    return [r for r in off_loop(read_all, console_fleet.topic("retry")) if dict(r.headers).get(dl.ID) == dlq_id.encode()]


def command(console_fleet: ConsoleFleet, body: dict[str, Any]) -> dict[str, Any]:
    resp = web.post(f"{console_fleet.validator.url}/commands", params={"wait": "true"}, json=body, timeout=20)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def test_poison_message_from_retries_to_parked_and_replayed(console_fleet: ConsoleFleet, page: Page) -> None:
    dlq_id = f"poison-{uuid.uuid4().hex[:8]}"
    first_failed_at = dl.now_ms()
    send_letter(console_fleet, poison_letter(console_fleet, dlq_id, 1, first_failed_at=first_failed_at))

    # Retries: the poison message, with its headers and value; read-only without the token.
    reload_until_visible(page, f"/retries?origin_topic={ORIGIN}", f'tr[data-id="{dlq_id}"]')
    row = page.locator(f'tr[data-id="{dlq_id}"]')
    expect(row).to_contain_text("PoisonMessageError")
    expect(row).to_contain_text("1 / 2")
    screenshot(page, "retries")
    row.get_by_role("link", name=dlq_id).click()
    headers = page.locator("#headers")
    expect(headers.locator("tr", has_text="traceparent")).to_contain_text("00-console-test-01")
    expect(headers.locator("tr", has_text="dlq.error.class")).to_contain_text("PoisonMessageError")
    expect(headers.locator("tr", has_text="dlq.attempt")).to_contain_text("1")
    expect(page.locator("#value")).to_contain_text('"amount": "forty-two"')
    expect(page.locator("h2#h-value")).to_contain_text("shown as json")
    expect(page.locator("#due")).to_contain_text("in ")
    redeliver = page.get_by_role("button", name="Redeliver now")
    expect(redeliver).to_be_disabled()
    expect(page.locator("#why-actions")).to_contain_text("enter the admin token")
    screenshot(page, "retry-message")

    # A wrong token is refused by the retry scheduler, and the page says so.
    enter_token(page, "not-the-token")
    expect(page.get_by_role("alert")).to_contain_text("401")
    expect(page.locator("#token-state")).to_have_text("Read-only")
    page.get_by_label("Admin token").fill(TOKEN)
    page.get_by_role("button", name="Use this token").click()
    expect(page.locator("#message")).to_contain_text("Token accepted")
    page.get_by_role("link", name="Continue").click()

    # Redeliver now, confirmed: it goes to the retry topic, where its consumer fails again.
    page.get_by_role("button", name="Redeliver now").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("redeliver now")
    page.get_by_role("button", name="Yes, redeliver it now").click()
    expect(page.locator("#result")).to_contain_text("redelivered")
    redelivered = wait_for(lambda: retry_records(console_fleet, dlq_id), timeout=30, message="the redelivery")
    assert dict(redelivered[0].headers)[dl.ATTEMPT] == b"1"
    send_letter(console_fleet, poison_letter(console_fleet, dlq_id, 2, first_failed_at=first_failed_at))

    # Parked, after its second failure; its own page shows the headers it will be replayed with.
    reload_until_visible(page, f"/parked?origin_topic={ORIGIN}", f'tr[data-id="{dlq_id}"]')
    expect(page.locator(f'tr[data-id="{dlq_id}"]')).to_contain_text("2 / 2")
    page.locator(f'tr[data-id="{dlq_id}"]').get_by_role("link", name=dlq_id).click()
    expect(page.locator("#headers tr", has_text="traceparent")).to_contain_text("00-console-test-01")

    # Without the token the page is read-only, and the retry scheduler refuses the call
    # even when the form is sent anyway: the refusal is shown.
    page.get_by_role("button", name="Forget token").click()
    page.goto(f"/parked/message?id={dlq_id}")
    expect(page.get_by_role("button", name="Replay")).to_be_disabled()
    expect(page.locator("#why-actions")).to_contain_text("enter the admin token")
    page.goto(f"/confirm?kind=parked&action=replay&id={dlq_id}")
    confirm = page.locator("#confirm")
    expect(confirm).to_be_disabled()
    confirm.evaluate("button => { button.disabled = false; }")
    confirm.click()
    expect(page.locator("#result")).to_contain_text("401")
    assert web.get(f"{console_fleet.retry_scheduler.url}/parked/{dlq_id}", timeout=10).status_code == 200

    # With the token: replayed, unparked, on the retry topic again.
    page.goto(f"/parked/message?id={dlq_id}")
    enter_token(page, TOKEN)
    page.get_by_role("link", name="Continue").click()
    page.get_by_role("button", name="Replay").click()
    page.get_by_role("button", name="Yes, replay it").click()
    expect(page.locator("#result")).to_contain_text("redelivered")
    assert web.get(f"{console_fleet.retry_scheduler.url}/parked/{dlq_id}", timeout=10).status_code == 404
    wait_for(lambda: len(retry_records(console_fleet, dlq_id)) == 2, timeout=30, message="the replay on the retry topic")


def test_replay_all_parked_that_a_filter_selects_counts_first(console_fleet: ConsoleFleet, page: Page) -> None:
    origin = f"payments-{uuid.uuid4().hex[:6]}"
    ids = [f"undecodable-{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    now = dl.now_ms()
    for dlq_id in ids:
        # DecodeError is never retried: parked at once.
        letter = dl.DeadLetter(
            id=dlq_id,
            key=b"k",
            value=bytes(range(40)),
            original_topic=origin,
            original_partition=0,
            original_offset=7,
            retry_topic=console_fleet.topic("retry"),
            attempt=1,
            error_class="DecodeError",
            error_message="not UTF-8",
            first_failed_at=now,
            failed_at=now,
        )
        send_letter(console_fleet, letter)
    reload_until_visible(page, f"/parked?origin_topic={origin}", f'tr[data-id="{ids[-1]}"]')
    wait_for(
        lambda: page.reload() or page.locator("#parked tbody tr[data-id]").count() == len(ids),
        timeout=30,
        message="every message parked",
    )
    page.locator(f'tr[data-id="{ids[0]}"]').get_by_role("link").click()
    expect(page.locator("h2#h-value")).to_contain_text("shown as hex")
    expect(page.locator("#value")).to_contain_text("00000000  00 01 02 03")
    page.go_back()

    enter_token(page, TOKEN)
    page.goto(f"/parked?origin_topic={origin}")
    screenshot(page, "parked")
    page.get_by_role("button", name="Replay all that match…").click()
    expect(page.locator("#dry-run-count")).to_contain_text(f"{len(ids)} parked messages match")
    expect(page.locator("#dry-run-count")).to_contain_text("Nothing has been replayed yet")
    assert all(web.get(f"{console_fleet.retry_scheduler.url}/parked/{i}", timeout=10).status_code == 200 for i in ids)
    page.get_by_role("button", name=f"Replay these {len(ids)}").click()
    n = len(ids)
    expect(page.locator("#result")).to_contain_text(f"Replayed {n} of {n} selected (the dry run counted {n})")
    assert all(web.get(f"{console_fleet.retry_scheduler.url}/parked/{i}", timeout=10).status_code == 404 for i in ids)


def test_tallies_accounts_and_commands_match_the_apis(console_fleet: ConsoleFleet, page: Page) -> None:
    program = f"prog-{uuid.uuid4().hex[:6]}"
    accounts = [f"{program}-acct-{i}" for i in range(3)]
    for i, account in enumerate(accounts):
        command(
            console_fleet,
            {
                "command_id": f"create-{account}",
                "type": "CreateAccount",
                "account_id": account,
                "program_id": program,
                "data": {"n": i},
            },
        )
    command(console_fleet, {"command_id": f"deactivate-{accounts[1]}", "type": "DeactivateAccount", "account_id": accounts[1]})
    rejected = command(
        console_fleet, {"command_id": f"reactivate-{accounts[0]}", "type": "ReactivateAccount", "account_id": accounts[0]}
    )
    assert rejected["status"] == "rejected"

    def api_tally() -> dict[str, Any] | None:
        resp = web.get(f"{console_fleet.tallies.url}/tallies/{program}", timeout=10)
        body = resp.json() if resp.status_code == 200 else None
        return body if body and body["numberActive"] == 2 and body["numberInactive"] == 1 else None

    tally = wait_for(api_tally, timeout=30, message="the program's tally")

    page.goto("/tallies")
    page.get_by_label("Program id contains").fill(program)
    page.get_by_label("Program id contains").press("Enter")
    row = page.locator(f'tr[data-program="{program}"]')
    expect(row.locator('[data-field="numberActive"]')).to_have_text(str(tally["numberActive"]))
    expect(row.locator('[data-field="numberInactive"]')).to_have_text(str(tally["numberInactive"]))
    page.get_by_role("link", name=re.compile("^Active")).click()
    expect(page.locator('th[aria-sort="ascending"]')).to_contain_text("Active")
    screenshot(page, "tallies")

    page.locator(f'tr[data-program="{program}"]').get_by_role("link", name=program).click()
    expect(page.locator('#tally [data-field="numberActive"]')).to_have_text("2")
    listing = web.get(f"{console_fleet.validator.url}/programs/{program}/accounts", timeout=10).json()["items"]
    assert {a["account_id"] for a in listing} == set(accounts)
    for account in listing:
        shown = page.locator(f'tr[data-account="{account["account_id"]}"]')
        expect(shown).to_contain_text(account["status"])
        expect(shown.locator("td.num")).to_have_text(str(account["version"]))

    page.locator(f'tr[data-account="{accounts[1]}"]').get_by_role("link").click()
    expect(page.locator('#account [data-field="status"]')).to_have_text("inactive")
    expect(page.locator('#account [data-field="version"]')).to_have_text("2")
    page.get_by_label("Command id").fill(f"reactivate-{accounts[0]}")
    page.get_by_label("Command id").press("Enter")
    expect(page.locator('#command [data-field="status"]')).to_have_text("rejected")
    expect(page.locator('#command [data-field="reason"]')).to_have_text("INVALID_TRANSITION")
    page.get_by_label("Command id").fill(f"create-{accounts[2]}")
    page.get_by_label("Command id").press("Enter")
    expect(page.locator('#command [data-field="status"]')).to_have_text("accepted")
    expect(page.locator("#command")).to_contain_text("AccountCreated")


def test_fleet_is_live_and_a_stopped_service_shows_as_down(console_fleet: ConsoleFleet, page: Page) -> None:
    page.goto("/fleet")
    for name in ("validator", "tallies", "retry-scheduler"):
        section = page.locator(f'section[data-service="{name}"]')
        expect(section.locator('[data-role="service-state"]')).to_have_text("up")
        expect(section.locator('[data-role="instance-state"]')).to_have_text("ready")
        expect(section.locator("tbody tr").first).to_contain_text("0\u20133")  # its four input partitions
    expect(page.locator('section[data-service="tallies"] .lag')).to_contain_text(console_fleet.topic("account-events"))
    wait_for(
        lambda: page.locator('section[data-service="retry-scheduler"] polyline').count() > 0,
        timeout=15,
        message="the records/s chart",
    )
    screenshot(page, "fleet")

    # No reload: the page refreshes itself.
    console_fleet.tallies.stop()
    tallies = page.locator('section[data-service="tallies"]')
    expect(tallies.locator('[data-role="service-state"]')).to_have_text("down", timeout=20_000)
    expect(tallies.locator('[data-role="instance-state"]')).to_have_text("down")
    expect(tallies.locator('[data-role="service-error"]')).to_contain_text("did not answer")
    expect(page.locator('section[data-service="validator"] [data-role="service-state"]')).to_have_text("up")
    screenshot(page, "fleet-tallies-down")
