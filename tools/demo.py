"""``make demo``: sample traffic through the running fleet, and what the APIs answer.

Accounts are created and changed through the validator's POST /commands when it is
running (otherwise their events are produced directly), logins are produced to the
``logins`` topic, and the tallies are read back over HTTP. Each service's own demo
(``tools/demo_<service>.py``) runs after, when that service is part of the fleet.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
import uuid
from typing import Any

import httpx

from shared.codecs import dumps
from shared.engine.clients import PlainProducer, client_kwargs
from shared.settings import get_settings
from shared.topics import topic_names
from tools import web
from tools.fleet import SERVICES, url

VALIDATOR, TALLIES, RETRY = (url(k) for k in SERVICES)


def show(title: str, body: Any) -> None:
    print(f"\n== {title}")
    print(json.dumps(body, indent=2) if not isinstance(body, str) else body)


def reachable(base: str) -> bool:
    try:
        return web.get(base + "/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def account_plan(run: str) -> tuple[list[tuple[str, str, list[str]]], dict[str, dict[str, int]]]:
    """(account, program, command types) per account, and the counts they lead to."""
    plan = []
    expected: dict[str, dict[str, int]] = {}
    lifecycles = [
        ["CreateAccount"],
        ["CreateAccount", "UpdateAccount"],
        ["CreateAccount", "DeactivateAccount"],
        ["CreateAccount", "DeactivateAccount", "ReactivateAccount"],
        ["CreateAccount", "DeleteAccount"],
    ]
    for p in range(2):
        program = f"demo-{run}-program-{p}"
        counts = expected.setdefault(program, {"numberActive": 0, "numberInactive": 0})
        for i, steps in enumerate(lifecycles * (p + 1)):
            plan.append((f"demo-{run}-acct-{p}-{i}", program, steps))
            final = steps[-1]
            if final in ("CreateAccount", "UpdateAccount", "ReactivateAccount"):
                counts["numberActive"] += 1
            elif final == "DeactivateAccount":
                counts["numberInactive"] += 1
    return plan, expected


EVENT_OF = {
    "CreateAccount": "AccountCreated",
    "UpdateAccount": "AccountUpdated",
    "DeactivateAccount": "AccountDeactivated",
    "ReactivateAccount": "AccountReactivated",
    "DeleteAccount": "AccountDeleted",
}


async def send_traffic(plan: list[tuple[str, str, list[str]]], via_validator: bool) -> int:
    settings = get_settings()
    topics = topic_names(settings)
    producer = PlainProducer(**client_kwargs(settings))
    await producer.start()
    last_login = 0
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            for account, program, steps in plan:
                for version, step in enumerate(steps, start=1):
                    command_id = f"{account}-{version}"
                    if via_validator:
                        body = {
                            "command_id": command_id,
                            "type": step,
                            "account_id": account,
                            "program_id": program,
                            "expected_version": version - 1 or None,
                            "data": {"name": account},
                            "issued_at": int(time.time() * 1000),
                        }
                        (await http.post(VALIDATOR + "/commands", json=body)).raise_for_status()
                    else:
                        event = {
                            "event_id": command_id,
                            "command_id": command_id,
                            "type": EVENT_OF[step],
                            "account_id": account,
                            "program_id": program,
                            "version": version,
                            "occurred_at": int(time.time() * 1000),
                            "data": {},
                        }
                        await producer.send(topics.account_events, dumps(event), key=account.encode())
                last_login = int(time.time() * 1000)
                login = {"account_id": account, "program_id": program, "ts": last_login}
                await producer.send(topics.logins, dumps(login), key=account.encode())
        await producer.flush()
    finally:
        await producer.stop()
    return last_login


def main() -> int:
    if not reachable(TALLIES):
        print(f"the tallies service is not answering on {TALLIES}: run `make up` first", file=sys.stderr)
        return 1
    run = uuid.uuid4().hex[:6]
    plan, expected = account_plan(run)
    via_validator = reachable(VALIDATOR)
    print(
        f"sending {sum(len(s) for _, _, s in plan)} account changes for {len(plan)} accounts "
        f"({'through POST /commands' if via_validator else 'as account events'}) and {len(plan)} logins"
    )
    asyncio.run(send_traffic(plan, via_validator))
    deadline = time.monotonic() + 30
    tallies: dict[str, Any] = {}
    while time.monotonic() < deadline:
        tallies = {p: web.get(f"{TALLIES}/tallies/{p}", timeout=5).json() for p in expected}
        if all(
            tallies[p].get("numberActive") == e["numberActive"] and tallies[p].get("numberInactive") == e["numberInactive"]
            for p, e in expected.items()
        ):
            break
        time.sleep(0.5)
    for program, tally in tallies.items():
        show(f"GET {TALLIES}/tallies/{program}   (expected {expected[program]})", tally)
    show(f"GET {TALLIES}/tallies?limit=5", web.get(f"{TALLIES}/tallies", params={"limit": 5}, timeout=5).json())
    ok = all(tallies[p].get("numberActive") == e["numberActive"] for p, e in expected.items())
    for module, base in (("tools.demo_validator", VALIDATOR), ("tools.demo_retry_scheduler", RETRY)):
        if reachable(base):
            try:
                demo = importlib.import_module(module)
            except ImportError:
                continue
            if module.endswith("retry_scheduler"):
                demo.run(base, get_settings().admin_token)
            else:
                demo.run(base)
    print("\ndemo", "done: tallies match" if ok else "finished, but the tallies did not settle in 30s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
