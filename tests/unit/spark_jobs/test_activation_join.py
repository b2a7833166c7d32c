"""The activation join's Python steps without Spark: account-events read as every reader reads
them (malformed records marked, to be skipped and reported), and the earliest login per account
in a micro-batch's join output."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from spark_jobs.activation_join import earliest_logins, read_created

pytestmark = pytest.mark.spark

T0 = 1_704_067_200_000


def created(account_id: str, **changes: object) -> bytes:
    event = {
        "event_id": "e",
        "command_id": "c",
        "type": "AccountCreated",
        "account_id": account_id,
        "program_id": "p",
        "version": 1,
        "occurred_at": T0,
        "data": {},
        **changes,
    }
    return json.dumps({k: v for k, v in event.items() if v is not None}).encode()


def test_account_events_are_read_as_every_reader_reads_them() -> None:
    values = [
        created("a"),
        created("b", type="AccountUpdated", version=2),  # read, not an AccountCreated: no row
        created("untimed", occurred_at=None),  # breaks the Event shape: skipped
        created("L" * 300),  # breaks the Event shape: skipped
        b"not json",
    ]
    (out,) = list(read_created(iter([pd.DataFrame({"value": values})])))
    rows = out.astype(object).where(out.notna(), None).values.tolist()
    assert rows[0] == ["a", "p", T0, None]
    assert [r[:3] for r in rows[1:]] == [[None, None, None]] * 3
    errors = [r[3] for r in rows[1:]]
    assert "'occurred_at' must be an integer" in errors[0]
    assert "'account_id' is longer than 256 characters" in errors[1]
    assert "JSON" in errors[2]


def test_the_earliest_login_of_a_batch_is_kept_per_account() -> None:
    ts = pd.Timestamp(T0, unit="ms")
    frames = [
        pd.DataFrame(
            {
                "account_id": ["a", "b", "a"],
                "program_id": ["p"] * 3,
                "created_at": [T0] * 3,
                "created_ts": [ts] * 3,
                "login_at": [T0 + 50.0, T0 + 7.0, T0 + 9.0],
            }
        ),
        pd.DataFrame(
            {
                "account_id": ["a", "c", "b"],
                "program_id": ["p"] * 3,
                "created_at": [T0] * 3,
                "created_ts": [ts] * 3,
                "login_at": [T0 + 3.0, None, T0 + 8.0],
            }
        ),
    ]
    for order in (frames, frames[::-1], [f.iloc[::-1] for f in frames]):
        (out,) = list(earliest_logins(iter(order)))
        got = {a: (None if pd.isna(at) else int(at)) for a, at in zip(out["account_id"], out["login_at"], strict=True)}
        assert got == {"a": T0 + 3, "b": T0 + 7, "c": None}
    assert list(earliest_logins(iter([]))) == []
