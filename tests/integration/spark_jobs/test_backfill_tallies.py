"""The tally backfill on the real broker equals the live tallies service on the same input."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from spark_jobs import backfill_tallies
from tests.support.kafka import create_topics, produce, read_all
from tests.support.services import ServiceProcess, wait_for
from tools import web

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.e2e]

STATUS = {
    "AccountCreated": "active",
    "AccountDeactivated": "inactive",
    "AccountReactivated": "active",
    "AccountDeleted": "deleted",
}


def generate(seed: int) -> tuple[list[tuple[str, bytes]], list[tuple[str, bytes]], dict[str, dict[str, Any]]]:
    """Account-events and logins (in per-account order, with replays and junk), and the
    tallies they must give, worked out here from the contract's rules."""
    rng = random.Random(seed)
    events: list[tuple[str, bytes]] = []
    logins: list[tuple[str, bytes]] = []
    expected: dict[str, dict[str, Any]] = {}
    for i in range(40):
        program, account = f"prog-{i % 5}", f"acct-{i:03d}"
        tally = expected.setdefault(program, {"program_id": program, "numberActive": 0, "numberInactive": 0, "lastLogin": None})
        types, status = ["AccountCreated"], "active"
        for _ in range(rng.randint(0, 4)):
            if status == "deleted":
                break
            nxt = rng.choice(
                ["AccountUpdated", "AccountDeleted", "AccountDeactivated" if status == "active" else "AccountReactivated"]
            )
            types.append(nxt)
            status = STATUS.get(nxt, status)
        history = [
            (
                account,
                json.dumps(
                    {
                        "event_id": f"{account}:{v}",
                        "command_id": f"c-{account}-{v}",
                        "type": t,
                        "account_id": account,
                        "program_id": program,
                        "version": v,
                        "occurred_at": 1_700_000_000_000 + v,
                        "data": {},
                    }
                ).encode(),
            )
            for v, t in enumerate(types, start=1)
        ]
        events += history
        if i % 4 == 0:
            events += history  # the whole history delivered again: must not count twice
        tally["numberActive"] += status == "active"
        tally["numberInactive"] += status == "inactive"
        for _ in range(rng.randint(0, 2)):
            ts = rng.randint(1_700_000_000_000, 1_700_100_000_000)
            logins.append((account, json.dumps({"account_id": account, "program_id": program, "ts": ts}).encode()))
            tally["lastLogin"] = max(tally["lastLogin"] or ts, ts)
    logins.append(("ghost", json.dumps({"account_id": "ghost", "program_id": "prog-logins-only", "ts": 5}).encode()))
    expected["prog-logins-only"] = {"program_id": "prog-logins-only", "numberActive": 0, "numberInactive": 0, "lastLogin": 5}
    events.append(("bad", b"{not json"))
    logins.append(("bad", json.dumps({"account_id": "bad", "program_id": "prog-0", "ts": "noon"}).encode()))
    return events, logins, expected


def live_tallies(url: str) -> dict[str, dict[str, Any]]:
    items = web.get(f"{url}/tallies", params={"limit": 1000}, timeout=5).json()["items"]
    return {t["program_id"]: t for t in items}


@pytest.fixture
def fake_service() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in tallies API serving the items it is given (one page)."""
    items: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"items": items, "next_cursor": None}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", items
    server.shutdown()


def test_backfill_equals_the_live_service(spark, job_env, prefix, service_env, tmp_path: Path, capsys, fake_service) -> None:
    events, logins, expected = generate(seed=3)
    topic_events, topic_logins = f"{prefix}account-events", f"{prefix}logins"
    create_topics([topic_events, topic_logins], partitions=2)
    produce(topic_events, events)
    produce(topic_logins, logins)

    service = ServiceProcess(
        module="tallies", env={**service_env, "STATEFLEET_TOPIC_PARTITIONS": "2"}, log_path=tmp_path / "tallies.log"
    ).start()
    try:
        service.wait_ready()
        live = wait_for(
            lambda: (t := live_tallies(service.url)) == expected and t,
            timeout=90,
            message="the tallies service to read every input",
        )
        output = tmp_path / "backfill"
        backfill_tallies.main(
            ["--output", str(output), "--publish-topic", "program-tallies-backfill", "--verify-against", service.url]
        )
    finally:
        service.stop()
    assert f"backfill equals {service.url}: {len(expected)} programs" in capsys.readouterr().out

    rows = pq.read_table(output).to_pylist()
    assert sorted(rows, key=lambda r: r["program_id"]) == [expected[p] for p in sorted(expected)]

    manifest = json.loads((output / "_manifest.json").read_text())
    ends: dict[str, dict[str, int]] = {}
    for record in read_all(topic_events) + read_all(topic_logins):
        partitions = ends.setdefault(record.topic, {"0": 0, "1": 0})
        partitions[str(record.partition)] = max(partitions[str(record.partition)], record.offset + 1)
    assert {i["topic"]: {p: r["end"] for p, r in i["partitions"].items()} for i in manifest["inputs"]} == ends
    assert all(r["start"] == 0 for i in manifest["inputs"] for r in i["partitions"].values())
    assert manifest["input_records"] == len(events) + len(logins)
    assert manifest["invalid_records"] == 2
    assert manifest["programs"] == len(expected)

    published = {(r.key or b"").decode(): json.loads(r.value or b"null") for r in read_all(f"{prefix}program-tallies-backfill")}
    assert published == expected

    # A service that disagrees: the backfill exits 1 and names the programs.
    url, items = fake_service
    items += [dict(t) for t in live.values()]
    items[0]["numberActive"] += 1
    changed = items[0]["program_id"]
    items.append({"program_id": "prog-unknown", "numberActive": 1, "numberInactive": 0, "lastLogin": None})
    with pytest.raises(SystemExit) as exit_info:
        backfill_tallies.main(["--output", str(tmp_path / "again"), "--verify-against", url])
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert f"2 programs differ between the backfill and {url}:" in out
    assert (
        f"  {changed}: numberActive backfill={expected[changed]['numberActive']} "
        f"live={expected[changed]['numberActive'] + 1}" in out
    )
    assert "  prog-unknown: only in the live service" in out


def test_malformed_account_events_are_skipped_reported_and_never_counted(
    spark,
    settings,
    spark_settings,
    topics,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """The AccountCreated events every service dead-letters (no occurred_at; a 300-character
    account id) are skipped by the backfill, counted in its manifest, and in no tally."""
    program = "prog-malformed"

    def created(account_id: str) -> dict[str, Any]:
        return {
            "event_id": f"e-{account_id[:9]}",
            "command_id": f"c-{account_id[:9]}",
            "type": "AccountCreated",
            "account_id": account_id,
            "program_id": program,
            "version": 1,
            "occurred_at": 1_700_000_000_001,
            "data": {},
        }

    untimed = {k: v for k, v in created("untimed").items() if k != "occurred_at"}
    create_topics([topics.account_events, topics.logins], partitions=2)
    produce(
        topics.account_events,
        [
            ("fine", json.dumps(created("fine")).encode()),
            ("untimed", json.dumps(untimed).encode()),
            ("long", json.dumps(created("L" * 300)).encode()),
        ],
    )
    output = str(tmp_path / "backfill")
    result = backfill_tallies.run(spark, settings, spark_settings, output)
    assert result.invalid_records == 2 and result.input_records == 3
    assert result.rows == {program: {"program_id": program, "numberActive": 1, "numberInactive": 0, "lastLogin": None}}
    assert json.loads((tmp_path / "backfill" / "_manifest.json").read_text())["invalid_records"] == 2
