"""A worker upgraded over a data dir written before the engine kept its own rows in a column
family of their own (Faust's persisted offset and the next-offset rows in each partition
database's default family, among the service's rows) moves those rows to the engine family as
it opens each database, resumes from them with nothing read again from the changelogs, and
keeps exact tallies."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

from shared.engine._identity import INCARNATION_KEY
from shared.engine._rocksdb import ENGINE_FAMILY
from tests.e2e.tallies.test_tallies_e2e import assert_tallies_settle, wait_all_input_consumed
from tests.support.accounts import generate
from tests.support.kafka import produce

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Any changelog lag is restored in bulk and logged: an offset lost in the upgrade would show.
ENV = {"STATEFLEET_BULK_RESTORE_MIN_LAG": "1"}


def partition_databases(data_dir: Path) -> list[Path]:
    return sorted(path.parent for path in data_dir.rglob("CURRENT"))


def to_earlier_layout(db_path: Path) -> int:
    """Move a partition database's engine rows back into its default family and drop the engine
    family, as the earlier version kept them; returns the rows moved."""
    families = Rdict.list_cf(str(db_path), Options(raw_mode=True))
    if ENGINE_FAMILY not in families:
        return 0
    db = Rdict(
        str(db_path),
        options=Options(raw_mode=True),
        access_type=AccessType.read_write(),
        column_families={name: Options(raw_mode=True) for name in families if name != "default"},
    )
    try:
        engine = db.get_column_family(ENGINE_FAMILY)
        # What the earlier version kept there: not the incarnation, which it did not record.
        rows = [(key, value) for key, value in engine.items() if key != INCARNATION_KEY]
        for key, value in rows:
            db[key] = value
        del engine
        db.drop_column_family(ENGINE_FAMILY)
    finally:
        db.close()
    return len(rows)


def test_a_data_dir_of_the_earlier_layout_is_migrated_and_resumed_from(
    start_tallies: Any, tally_topics: dict[str, str], service_env: dict[str, str]
) -> None:
    history = generate(8, 150, seed=23, logins_per_program=20)
    half = len(history.events) // 2
    proc = start_tallies("u", **ENV)
    produce(tally_topics["events"], history.events[:half])
    wait_all_input_consumed(proc)
    proc.stop()

    data_dir = Path(service_env["STATEFLEET_DATA_DIR"]) / "tallies" / "u"
    databases = partition_databases(data_dir)
    assert databases, f"no partition database under {data_dir}"
    moved = sum(to_earlier_layout(path) for path in databases)
    assert moved > 0
    assert all(ENGINE_FAMILY not in Rdict.list_cf(str(path), Options(raw_mode=True)) for path in databases)

    upgraded = start_tallies("u", **ENV)
    produce(tally_topics["events"], history.events[half:])
    produce(tally_topics["logins"], history.logins)
    assert_tallies_settle(upgraded, history.expected)
    log = upgraded.log_path.read_text(errors="replace")
    assert log.count("engine rows to the") >= 1, "the upgraded worker moved no engine row"
    assert sum(int(n) for n in re.findall(r": moved (\d+) engine rows to the", log)) == moved
    # Its offsets came along: nothing of the changelogs it had applied was read again.
    assert "partitions lag their changelogs" not in log
    assert all(ENGINE_FAMILY in Rdict.list_cf(str(path), Options(raw_mode=True)) for path in databases)
