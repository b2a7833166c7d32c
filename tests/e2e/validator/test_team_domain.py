"""A team's own domain module, outside the repository's packages, run by the validator as the
derived-image recipe of docs/your-domain.md ("In the image") puts it there: the guide's
``tickets/domain.py`` and Containerfile are taken from the page, the files laid out where its
``COPY`` puts them, and a real validator process started with the ``ENV`` it sets, against the
broker. And a team module that cannot be loaded stopping the validator at start, naming the
module and what is missing."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.guide import derived_image, domain_guide_files, stopped_at_start, with_project
from tests.support.kafka import read_all
from tests.support.services import REPO, ServiceProcess
from tools import web

pytestmark = pytest.mark.e2e


def guide_files() -> dict[str, str]:
    return domain_guide_files("tickets/domain.py", "Containerfile")


def test_the_guides_domain_runs_in_a_worker_as_the_derived_image_has_it(
    start_validator: Callable[..., ServiceProcess], tmp_path: Path
) -> None:
    root, image_env = derived_image(tmp_path, guide_files())
    assert image_env["STATEFLEET_VALIDATOR_DOMAIN"] == "tickets.domain:TICKETS"
    assert (root / "opt" / "team" / "tickets" / "domain.py").is_file() and not (REPO / "tickets").exists()
    validator = start_validator("team", **with_project(image_env))

    ticket = f"ticket-{uuid.uuid4().hex[:8]}"

    def post(body: dict[str, Any]) -> dict[str, Any]:
        resp = web.post(validator.url + "/commands", json=body, params={"wait": "true"}, timeout=15)
        assert resp.status_code == 200, resp.text
        out: dict[str, Any] = resp.json()
        return out

    opened = post(
        {
            "command_id": f"{ticket}-1",
            "type": "OpenTicket",
            "ticket_id": ticket,
            "data": {"title": "printer on fire", "queue": "hardware"},
        }
    )
    assert (opened["status"], opened["event"]["type"], opened["event"]["version"]) == ("accepted", "TicketOpened", 1), opened
    assigned = post(
        {"command_id": f"{ticket}-2", "type": "AssignTicket", "ticket_id": ticket, "assignee": "ana", "expected_version": 1}
    )
    assert (assigned["status"], assigned["event"]["type"], assigned["event"]["version"]) == ("accepted", "TicketAssigned", 2)
    refused = post({"command_id": f"{ticket}-3", "type": "AssignTicket", "ticket_id": ticket})
    assert (refused["status"], refused["reason"]) == ("rejected", "INVALID_COMMAND"), refused

    resp = web.get(f"{validator.url}/aggregates/{ticket}", timeout=15)
    assert resp.status_code == 200, resp.text
    assert resp.json() == {
        "aggregate_id": ticket,
        "version": 2,
        "state": {"status": "assigned", "title": "printer on fire", "queue": "hardware", "assignee": "ana"},
    }
    events = [
        orjson.loads(r.body)
        for r in read_all(validator.env["STATEFLEET_TOPIC_PREFIX"] + "ticket-events")
        if r.key == ticket.encode()
    ]
    assert [(e["type"], e["version"]) for e in events] == [("TicketOpened", 1), ("TicketAssigned", 2)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ('aggregate_id_field="ticket_id"', 'aggregate_id_field="id"'),
            "tickets.domain:TICKETS lacks part of the domain API: command_model fields id",
        ),
        (
            ('creates=frozenset({"OpenTicket"})', 'creates=frozenset({"Open"})'),
            "lacks part of the domain API: creates (one or more of",
        ),
        (
            ("from shared.domain import", "from shared.domains import"),
            "domain module 'tickets.domain' cannot be imported: ModuleNotFoundError",
        ),
        (
            ("TICKETS: Domain[Ticket] = ", "TICKET: Domain[Ticket] = "),
            "domain module 'tickets.domain' has no attribute 'TICKETS'",
        ),
    ],
)
def test_a_team_module_that_cannot_be_loaded_stops_the_validator_at_start(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    stderr = stopped_at_start("services.validator", "tickets/domain.py", change, tmp_path)
    assert "STATEFLEET_VALIDATOR_DOMAIN" in stderr and message in stderr, stderr
