"""A team's own projection module, outside the repository's packages, run by a real tallies
worker as the derived-image recipe of docs/your-domain.md ("In the image") puts it there: the
guide's ``tickets/projection.py`` and Containerfile are taken from the page, the files laid out
where its ``COPY`` puts them, and the worker started with the ``ENV`` it sets, against the
broker. Ticket events on its input topic, a replayed and a duplicated one among them, give
exact rows over ``GET /tallies/{queue}``. And copies of the module that cannot be loaded stop
the worker at start, naming the module and what is missing or wrong."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.guide import derived_image, domain_guide_files, stopped_at_start, with_project
from tests.support.kafka import create_topics, produce, read_all, unconsumed
from tests.support.services import REPO, ServiceProcess, wait_for
from tools import web

pytestmark = pytest.mark.e2e


def guide_files() -> dict[str, str]:
    return domain_guide_files("tickets/projection.py", "Containerfile")


def ticket_event(ticket: str, version: int, type_: str, queue: str, **data: str) -> dict[str, Any]:
    """A ticket event as the validator writes it on ``ticket-events`` (docs/your-domain.md)."""
    return {
        "event_id": f"{ticket}-{version}",
        "command_id": f"cmd-{ticket}-{version}",
        "type": type_,
        "aggregate_id": ticket,
        "version": version,
        "occurred_at": 1_700_000_000_000 + version,
        "data": {"queue": queue, **data},
    }


#: Four tickets in two queues; t1 ends closed, t2 assigned, t3 open, t4 (network) closed.
HISTORY = [
    ticket_event("t1", 1, "TicketOpened", "hardware", title="printer on fire"),
    ticket_event("t2", 1, "TicketOpened", "hardware", title="screen flickers"),
    ticket_event("t1", 2, "TicketAssigned", "hardware", assignee="ana"),
    ticket_event("t3", 1, "TicketOpened", "hardware", title="mouse gone"),
    ticket_event("t4", 1, "TicketOpened", "network", title="no wifi"),
    ticket_event("t2", 2, "TicketAssigned", "hardware", assignee="bo"),
    ticket_event("t1", 3, "TicketClosed", "hardware"),
    ticket_event("t4", 2, "TicketClosed", "network"),
]
ROWS = {
    "hardware": {"queue": "hardware", "open": 1, "assigned": 1, "closed": 1},
    "network": {"queue": "network", "open": 0, "assigned": 0, "closed": 1},
}


def records(events: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    return [(e["aggregate_id"], orjson.dumps(e)) for e in events]


def test_the_guides_projection_runs_in_a_worker_as_the_derived_image_has_it(
    start_tallies: Callable[..., ServiceProcess], prefix: str, tmp_path: Path
) -> None:
    root, image_env = derived_image(tmp_path, guide_files())
    assert image_env["STATEFLEET_TALLIES_PROJECTION"] == "tickets.projection:PROJECTION"
    assert (root / "opt" / "team" / "tickets" / "projection.py").is_file() and not (REPO / "tickets").exists()
    events, tallies = f"{prefix}ticket-events", f"{prefix}ticket-tallies"
    create_topics([events, tallies, f"{prefix}dead-letters"], compacted=[tallies])
    worker = start_tallies("team", **with_project(image_env))

    def row(queue: str) -> tuple[int, Any]:
        resp = web.get(f"{worker.url}/tallies/{queue}", timeout=5)
        return resp.status_code, resp.json()

    def settled() -> None:
        """Every input record consumed, then the rows exactly as expected."""
        group = f"{prefix}statefleet-tallies-tickets"
        inputs = [events, f"{prefix}retry-tallies-tickets", f"{prefix}statefleet-tallies-tickets-by-program"]
        wait_for(lambda: unconsumed(group, inputs) == 0, timeout=60, message="every input record consumed")
        assert {queue: row(queue) for queue in ROWS} == {queue: (200, expected) for queue, expected in ROWS.items()}

    produce(events, records(HISTORY[:5]))
    produce(events, records([HISTORY[2]]))  # a duplicate: t1's assignment delivered twice
    produce(events, records(HISTORY[5:]))
    wait_for(lambda: row("network") == (200, ROWS["network"]), timeout=60, message="the network queue's row")
    settled()

    # The whole history replayed, newest first (every version but the newest arrives late),
    # and an event of a type the projection does not know, which goes to dead letters.
    produce(events, records(HISTORY[::-1]))
    produce(events, [("t9", orjson.dumps(ticket_event("t9", 1, "TicketLost", "hardware")))])
    settled()
    status, body = row("billing")  # a queue with nothing seen yet
    assert (status, body["error"]) == (404, "not_found"), body
    letters = wait_for(lambda: read_all(f"{prefix}dead-letters"), timeout=30, message="the dead letter")
    assert [r.key for r in letters] == [b"t9"]

    def published() -> dict[bytes | None, Any]:
        return {r.key: orjson.loads(r.body) for r in read_all(tallies)}  # the newest row per queue

    wanted = {queue.encode(): expected for queue, expected in ROWS.items()}
    wait_for(lambda: published() == wanted, timeout=30, message="ticket-tallies to hold the rows")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("from shared.projection import", "from shared.projections import"),
            "cannot import projection module 'tickets.projection': ModuleNotFoundError",
        ),
        (
            ("    row=queue_row,\n", ""),
            "cannot import projection module 'tickets.projection': TypeError: "
            "Projection.__init__() missing 1 required positional argument: 'row'",
        ),
        (
            ("row_model=QueueTally,", "row_model=dict,"),
            "cannot import projection module 'tickets.projection': ProjectionError: "
            "projection 'tickets': 'row_model' must be a pydantic model class",
        ),
        (
            ("PROJECTION = Projection(", "TICKET_TALLIES = Projection("),
            "projection module 'tickets.projection' has no attribute 'PROJECTION'",
        ),
    ],
    ids=["import-error", "missing-part", "wrongly-typed-part", "no-such-attribute"],
)
def test_a_team_projection_that_cannot_be_loaded_stops_the_tallies_at_start(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    stderr = stopped_at_start("services.tallies", "tickets/projection.py", change, tmp_path)
    assert f"statefleet tallies: STATEFLEET_TALLIES_PROJECTION: {message}" in stderr, stderr
