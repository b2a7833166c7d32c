"""The statefleet tally (services/tallies/domain.py) as a Quix Streams application.

Runs in its own virtual environment (``.local/quix-venv``, made by ``make bench-peers-build``),
so it imports only the standard library and quixstreams::

    .local/quix-venv/bin/python tools/bench/peers/quix_tallies.py --bootstrap 127.0.0.1:9092 \
        --prefix p. --consumer-group p.quix-tallies --state-dir /tmp/x [--exactly-once]

Topology, with Quix's RocksDB state and changelog topics:

- ``account-events`` (keyed by account): a stateful step holds each account's membership
  (program, status, version); an event not newer than the stored version is a replay and
  is dropped, any other becomes a count delta for the program (-1 on the old status, +1 on
  the new one, as a subtractor and an adder would).
- ``logins`` (keyed by account): mapped to (program, ts).
- Both are concatenated and regrouped by program (one repartition topic); a stateful step
  per program sums the deltas, keeps the largest login ts, and writes the program's tally
  to ``program-tallies`` after each record.

Prints ``first-record-at-ms <epoch ms>`` on stdout when the first input record is
processed, which is when the benchmark's clock starts.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from quixstreams import Application, State

ACTIVE = "active"
INACTIVE = "inactive"
DELETED = "deleted"
UNKNOWN = "unknown"
STATUS_AFTER = {"AccountCreated": ACTIVE, "AccountDeactivated": INACTIVE, "AccountReactivated": ACTIVE, "AccountDeleted": DELETED}

_first_seen = False


def mark_first_record() -> None:
    global _first_seen
    if not _first_seen:
        _first_seen = True
        print(f"first-record-at-ms {time.time_ns() // 1_000_000}", flush=True)


def membership_delta(event: dict[str, Any], state: State) -> dict[str, Any] | None:
    """Apply an account event to the account's membership; the program's count delta, or
    None for a replay (version not newer) or an event type the tallies do not know."""
    mark_first_record()
    membership = state.get("membership")
    version = event["version"]
    before = membership["status"] if membership else None
    if membership is not None and version <= membership["version"]:
        return None
    event_type = event["type"]
    if event_type == "AccountUpdated":
        after = before if before is not None else UNKNOWN
    elif event_type in STATUS_AFTER:
        after = STATUS_AFTER[event_type]
    else:
        return None
    state.set("membership", {"program_id": event["program_id"], "status": after, "version": version})
    return {
        "program_id": event["program_id"],
        "active": (after == ACTIVE) - (before == ACTIVE),
        "inactive": (after == INACTIVE) - (before == INACTIVE),
    }


def login_input(login: dict[str, Any]) -> dict[str, Any]:
    mark_first_record()
    return {"program_id": login["program_id"], "ts": login["ts"]}


def apply_to_tally(item: dict[str, Any], state: State) -> dict[str, Any]:
    """Fold a count delta or a login into the program's tally; the tally after it."""
    active = state.get("active", 0)
    inactive = state.get("inactive", 0)
    last_login = state.get("last_login")
    if "ts" in item:
        if last_login is None or item["ts"] > last_login:
            last_login = item["ts"]
            state.set("last_login", last_login)
    else:
        active += item["active"]
        inactive += item["inactive"]
        state.set("active", active)
        state.set("inactive", inactive)
    return {"program_id": item["program_id"], "numberActive": active, "numberInactive": inactive, "lastLogin": last_login}


def build(app: Application, prefix: str) -> None:
    events = app.topic(f"{prefix}account-events", key_deserializer="str", value_deserializer="json")
    logins = app.topic(f"{prefix}logins", key_deserializer="str", value_deserializer="json")
    tallies = app.topic(f"{prefix}program-tallies", key_serializer="str", value_serializer="json")

    deltas = app.dataframe(events).apply(membership_delta, stateful=True).filter(lambda delta: delta is not None)
    last_logins = app.dataframe(logins).apply(login_input)
    by_program = deltas.concat(last_logins).group_by("program_id")
    by_program.apply(apply_to_tally, stateful=True).to_topic(tallies)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--consumer-group", required=True)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--exactly-once", action="store_true")
    args = parser.parse_args()
    app = Application(
        broker_address=args.bootstrap,
        consumer_group=args.consumer_group,
        auto_offset_reset="earliest",
        # statefleet publishes changed tallies every second; Quix's default is 5 s.
        commit_interval=1.0,
        state_dir=args.state_dir,
        processing_guarantee="exactly-once" if args.exactly_once else "at-least-once",
        loglevel="WARNING",
    )
    build(app, args.prefix)
    app.run()


if __name__ == "__main__":
    main()
