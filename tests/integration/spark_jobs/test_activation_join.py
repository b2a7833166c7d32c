"""The activation join on the real broker: window edges, duplicates, late data, restarts.

Expected records come from a plain-Python model of the contract and of watermarks:
the watermark after a run is min over the two topics of (largest event time seen -
delay); an event at or before the watermark when it arrives is late and ignored; an
account is activated by the earliest non-late login with created_at <= ts <= created_at
+ window, and not activated once the watermark has passed created_at + window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from spark_jobs import activation_join as aj
from spark_jobs.state_stats import state_rows
from tests.support.kafka import create_topics, produce, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]

H = 3_600_000
D = 24 * H
T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
WINDOW = 3 * D
DELAY = H


@dataclass
class Run:
    created: list[tuple[str, int]] = field(default_factory=list)  # (account_id, occurred_at)
    logins: list[tuple[str, int]] = field(default_factory=list)  # (account_id, ts)


def program_of(account: str) -> str:
    return f"prog-{account[0]}"


def model(runs: list[Run]) -> dict[str, dict[str, object]]:
    """Activation records by account after ``runs``, each run starting where the last stopped."""
    watermark: int | None = None
    max_created: int | None = None
    max_login: int | None = None
    created: dict[str, int] = {}
    logins: list[tuple[str, int]] = []
    for run in runs:
        for account, at in run.created:
            if watermark is None or at > watermark:
                created.setdefault(account, at)
        for account, ts in run.logins:
            if watermark is None or ts > watermark:
                logins.append((account, ts))
        max_created = max([at for _, at in run.created] + ([max_created] if max_created is not None else []))
        max_login = max([ts for _, ts in run.logins] + ([max_login] if max_login is not None else []))
        watermark = min(max_created, max_login) - DELAY
    out: dict[str, dict[str, object]] = {}
    for account, at in created.items():
        matches = [ts for a, ts in logins if a == account and at <= ts <= at + WINDOW]
        record = {"account_id": account, "program_id": program_of(account), "created_at": at}
        if matches:
            out[account] = {**record, "first_login_at": min(matches), "activated": True}
        elif watermark is not None and at + WINDOW < watermark:
            out[account] = {**record, "first_login_at": None, "activated": False}
    return out


def created_event(account: str, at: int) -> tuple[str, bytes]:
    event = {
        "event_id": f"e-{account}",
        "command_id": f"c-{account}",
        "type": "AccountCreated",
        "account_id": account,
        "program_id": program_of(account),
        "version": 1,
        "occurred_at": at,
        "data": {},
    }
    return account, json.dumps(event).encode()


def login(account: str, ts: int) -> tuple[str, bytes]:
    return account, json.dumps({"account_id": account, "program_id": program_of(account), "ts": ts}).encode()


RUNS = [
    Run(
        created=[
            ("a-in", T0),
            ("a-edge", T0),
            ("a-over", T0),
            ("a-before", T0),
            ("a-none", T0),
            ("a-dup", T0),
            ("a-dup", T0),
            ("a-multi", T0),
            ("a-adv", T0 + 5 * D),
        ],
        logins=[
            ("a-in", T0 + D),
            ("a-edge", T0 + WINDOW),
            ("a-over", T0 + WINDOW + 1),
            ("a-before", T0 - 1),
            ("a-dup", T0 + 2 * H),
            ("a-dup", T0 + 2 * H),
            ("a-multi", T0 + H),
            ("a-multi", T0 + 2 * D),
            ("a-adv", T0 + 5 * D),
        ],
    ),
    Run(  # late: the watermark is now T0 + 5d - 1h
        created=[("l-late", T0 + D), ("b-multi", T0 + 5 * D)],
        logins=[("l-late", T0 + D + H), ("a-none", T0 + 2 * D), ("b-multi", T0 + 5 * D + H)],
    ),
    Run(  # a second login of an activated account; an account never logging in; time moves on
        created=[("c-none", T0 + 6 * D), ("c-adv", T0 + 10 * D)], logins=[("b-multi", T0 + 5 * D + 2 * H), ("c-adv", T0 + 10 * D)]
    ),
]


def activations_by_account(topic: str) -> dict[str, list[dict[str, object]]]:
    out: dict[str, list[dict[str, object]]] = {}
    for record in read_all(topic):
        assert record.value is not None
        value = json.loads(record.value)
        assert record.key == value["account_id"].encode()
        out.setdefault(value["account_id"], []).append(value)
    return out


def test_model_of_the_scenario() -> None:
    """The model's answer, spelled out, so a mistake in the model shows here."""
    expected = model(RUNS)
    activated = {a: r["first_login_at"] for a, r in expected.items() if r["activated"]}
    assert activated == {
        "a-in": T0 + D,
        "a-edge": T0 + WINDOW,
        "a-dup": T0 + 2 * H,
        "a-multi": T0 + H,
        "a-adv": T0 + 5 * D,
        "b-multi": T0 + 5 * D + H,
        "c-adv": T0 + 10 * D,
    }
    assert sorted(a for a, r in expected.items() if not r["activated"]) == ["a-before", "a-none", "a-over", "c-none"]


def test_activation_join_runs_restarts_and_reruns_without_duplicates(
    spark, settings, spark_settings, topics, tmp_path: Path
) -> None:
    create_topics([topics.account_events, topics.logins, topics.activations], partitions=2)
    checkpoint = str(tmp_path / "checkpoint")
    options = aj.JoinOptions(
        checkpoint=checkpoint, output_topic=topics.activations, window_ms=WINDOW, watermark_delay_ms=DELAY, available_now=True
    )

    for i, run in enumerate(RUNS, start=1):
        produce(topics.account_events, [created_event(a, at) for a, at in run.created])
        produce(topics.logins, [login(a, ts) for a, ts in run.logins])
        result = aj.run(spark, settings, spark_settings, options)
        assert result.input_rows == len(run.created) + len(run.logins)
        got = activations_by_account(topics.activations)
        assert {a: records for a, records in got.items()} == {a: [r] for a, r in model(RUNS[:i]).items()}, f"run {i}"

    # The late rows of run 2 were dropped by the watermark, not joined.
    assert "l-late" not in got

    # State holds only what can still match: c-adv on each join side and in the dedup.
    states = {s.operator_name: s.rows for s in state_rows(spark, checkpoint)}
    assert states == {"symmetricHashJoin": {"left": 1, "right": 1}, "dedupe": {"rows": 1}}

    # A crash after the last batch wrote its records but before Spark committed it: the
    # restarted job runs that batch again, and its records are not written twice.
    commits = sorted(Path(checkpoint, "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last = commits[-1]
    assert last.name.isdigit()
    rerun_batch = int(last.name)
    last.unlink()
    Path(checkpoint, "commits", f".{last.name}.crc").unlink(missing_ok=True)
    before = read_all(topics.activations)
    written_by_last = [r for r in before if dict(r.headers).get("statefleet.spark.batch") == str(rerun_batch).encode()]
    assert written_by_last, "the last batch should have written the not-activated c-none"
    aj.run(spark, settings, spark_settings, options)
    assert len(read_all(topics.activations)) == len(before)
    assert activations_by_account(topics.activations) == {a: [r] for a, r in model(RUNS).items()}


def test_first_login_is_the_earliest_of_its_batch_and_malformed_events_are_skipped(
    spark,
    settings,
    spark_settings,
    topics,
    tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    """Twelve in-window logins of one account in one micro-batch, produced latest first over both
    partitions: first_login_at is the earliest. The malformed AccountCreated events the services
    dead-letter (no occurred_at; a 300-character account id) are skipped and reported, and their
    logins activate nothing."""
    create_topics([topics.account_events, topics.logins, topics.activations], partitions=2)
    options = aj.JoinOptions(
        checkpoint=str(tmp_path / "checkpoint"),
        output_topic=topics.activations,
        window_ms=WINDOW,
        watermark_delay_ms=DELAY,
        available_now=True,
    )
    long_id = "m" + "x" * 299
    untimed = json.loads(created_event("m-untimed", T0)[1])
    del untimed["occurred_at"]
    produce(
        topics.account_events,
        [
            created_event("m-many", T0),
            created_event("m-two", T0),
            ("m-untimed", json.dumps(untimed).encode()),
            created_event(long_id, T0),
        ],
    )
    # Each login on a key of its own, so they spread over both partitions (and input tasks).
    many = [(f"k{k}", login("m-many", T0 + k * H)[1]) for k in range(12, 0, -1)]
    produce(
        topics.logins,
        [
            *many,
            ("k-two-a", login("m-two", T0 + 2 * H)[1]),
            ("k-two-b", login("m-two", T0 + H)[1]),
            login("m-untimed", T0 + H),
            login(long_id, T0 + H),
        ],
    )

    result = aj.run(spark, settings, spark_settings, options)
    assert result.skipped_records == 2
    assert sum(1 for b in result.batches if b.input_rows) == 1, "everything arrived in one micro-batch"
    record = {"program_id": "prog-m", "created_at": T0, "activated": True}
    assert activations_by_account(topics.activations) == {
        "m-many": [{"account_id": "m-many", **record, "first_login_at": T0 + H}],
        "m-two": [{"account_id": "m-two", **record, "first_login_at": T0 + H}],
    }
