"""Dead-letter replays on the real broker: dry run, real run, at most once per run id."""

from __future__ import annotations

import pytest

from spark_jobs import replay_dead_letters as replay
from tests.support.kafka import create_topics, produce, read_all

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def parked_messages(prefix: str) -> list[tuple[bytes, bytes, list[tuple[str, bytes]]]]:
    def headers(dlq_id: str, origin: str, error: str, failed_at: int, retry: str = "retry") -> list[tuple[str, bytes]]:
        return [
            ("trace", f"tr-{dlq_id}".encode()),
            ("dlq.id", dlq_id.encode()),
            ("dlq.original.topic", f"{prefix}{origin}".encode()),
            ("dlq.original.partition", b"3"),
            ("dlq.original.offset", b"42"),
            ("dlq.retry.topic", f"{prefix}{retry}".encode()),
            ("dlq.attempt", b"5"),
            ("dlq.error.class", error.encode()),
            ("dlq.error.message", b"boom"),
            ("dlq.first.failed.at", b"1000"),
            ("dlq.failed.at", str(failed_at).encode()),
        ]

    return [
        (b"k1", b"v1", headers("id-1", "logins", "TimeoutError", 2_000, retry="retry-tallies")),
        (b"k2", b"v2", headers("id-2", "logins", "ValueError", 2_000)),
        (b"k3", b"v3", headers("id-3", "account-events", "TimeoutError", 2_000)),
        (b"k4", b"v4", headers("id-4", "logins", "TimeoutError", 9_000)),
        (b"k1", b"v1", headers("id-1", "logins", "TimeoutError", 2_000, retry="retry-tallies")),  # parked twice
    ]


def sent(topic: str) -> list[tuple[bytes | None, bytes | None, dict[str, bytes]]]:
    return sorted((r.key, r.value, dict(r.headers)) for r in read_all(topic))


def expected_sent(message, run_id: str, source: str) -> tuple[bytes, bytes, dict[str, bytes]]:  # type: ignore[no-untyped-def]
    key, value, headers = message
    out = dict(headers)
    out["dlq.attempt"] = b"1"
    out["statefleet.replay.run"] = run_id.encode()
    out["statefleet.replay.source"] = source.encode()
    return key, value, out


def test_dry_run_then_replay_once_per_run_id(spark, job_env, prefix, capsys) -> None:
    parking_lot, dead_letters = f"{prefix}parking-lot", f"{prefix}dead-letters"
    retry_tallies = f"{prefix}retry-tallies"
    create_topics([parking_lot, retry_tallies, f"{prefix}retry"], partitions=1)
    messages = parked_messages(prefix)
    for key, value, headers in messages:
        produce(parking_lot, [(key, value)], headers=headers)

    # TimeoutErrors from logins that last failed before 5000: id-1 (parked twice), not id-4 or id-3.
    selection = ["--origin-topic", "logins", "--error-class", "TimeoutError", "--until", "5000"]
    replay.main([*selection, "--run-id", "r1", "--dry-run"])
    out = capsys.readouterr().out
    assert "selected 1, already replayed in this run 0, would send 1" in out
    assert f"would send 1 to {dead_letters}" in out
    assert (
        f"{parking_lot}:0:0 dlq.id=id-1 origin={prefix}logins error=TimeoutError "
        f"failed_at=1970-01-01T00:00:02+00:00 attempt 5->1 -> {dead_letters}" in out
    )
    assert read_all(dead_letters) == []

    replay.main([*selection, "--run-id", "r1"])
    assert "sent 1" in capsys.readouterr().out
    assert sent(dead_letters) == [expected_sent(messages[0], "r1", f"{parking_lot}:0:0")]

    # The same run id again sends nothing more; a new run id may replay it again.
    replay.main([*selection, "--run-id", "r1"])
    assert "selected 1, already replayed in this run 1, sent 0" in capsys.readouterr().out
    assert len(read_all(dead_letters)) == 1

    # Straight to the retry topics: every TimeoutError, each to its own retry topic.
    replay.main(["--error-class", "TimeoutError", "--to", "retry", "--run-id", "r2"])
    assert "selected 3, already replayed in this run 0, sent 3" in capsys.readouterr().out
    assert sent(retry_tallies) == [expected_sent(messages[0], "r2", f"{parking_lot}:0:0")]
    assert sent(f"{prefix}retry") == sorted(
        [expected_sent(messages[2], "r2", f"{parking_lot}:0:2"), expected_sent(messages[3], "r2", f"{parking_lot}:0:3")]
    )
    assert len(read_all(dead_letters)) == 1


def test_nothing_parked_is_reported_not_an_error(spark, job_env, prefix, capsys, caplog) -> None:
    replay.main(["--dry-run", "--run-id", "r0"])
    assert "selected 0, already replayed in this run 0, would send 0" in capsys.readouterr().out
    assert f"{prefix}parking-lot does not exist: nothing to replay" in caplog.text
