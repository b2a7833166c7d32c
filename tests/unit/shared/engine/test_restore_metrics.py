"""Each restore is measured: its time from the assignment, the changelog records read by the
bulk restore and by Faust's reader, and how many partitions had a local copy (see
``shared/engine/_restore.py``)."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from shared.engine._restore import BulkRestoringRecovery, RestoreTally
from shared.metrics import REGISTRY

A0, A1, S0 = TP("svc-t-changelog", 0), TP("svc-t-changelog", 1), TP("svc-t-changelog", 2)


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_partitions_with_a_persisted_offset_had_local_state() -> None:
    tally = RestoreTally(started=0.0)
    tally.note_partitions({A0: 41, A1: None})
    # a restarted recovery sees A0 restored meanwhile: it is not counted again
    tally.note_partitions({A0: None, S0: 7})
    assert tally.partitions == {A0, A1, S0}
    assert tally.with_local_state == {A0, S0}


def test_faust_records_are_the_offsets_its_reader_moved_past() -> None:
    tally = RestoreTally(started=0.0, faust_from={A0: -1, A1: 99})
    assert tally.faust_records({A0: 9, A1: 149}) == 10 + 50
    assert tally.faust_records({A0: 0, A1: None}) == 1  # offset 0 read; A1 not known (revoked)


def test_a_restore_from_the_changelog_is_told_from_one_from_the_local_volume(caplog: pytest.LogCaptureFixture) -> None:
    before_records = sample("statefleet_restored_records_total", service="restoretest", source="changelog")
    before_count = sample("statefleet_restore_seconds_count", service="restoretest")

    cold = RestoreTally(started=100.0, bulk_records=5_000, faust_from={A0: 4_999, A1: -1})
    cold.note_partitions({A0: None, A1: None})
    with caplog.at_level(logging.INFO, logger="shared.engine._restore"):
        assert cold.finish("restoretest", {A0: 5_009, A1: 19}, now=112.5) == (5_030, 12.5)
    assert "restored 5030 records from the changelog in 12.5 s (0 of 2 partitions had local state)" in caplog.text

    warm = RestoreTally(started=200.0, faust_from={A0: 5_009, A1: 19})
    warm.note_partitions({A0: 5_009, A1: 19})
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="shared.engine._restore"):
        assert warm.finish("restoretest", {A0: 5_011, A1: 19}, now=200.25) == (2, 0.25)
    assert "restored 2 records from the changelog in 0.2 s (2 of 2 partitions had local state)" in caplog.text

    assert sample("statefleet_restored_records_total", service="restoretest", source="changelog") - before_records == 5_032
    assert sample("statefleet_restore_seconds_count", service="restoretest") - before_count == 2
    assert sample("statefleet_restore_seconds_bucket", service="restoretest", le="0.5") >= 1


def store(persisted: dict[TP, int | None]) -> Any:
    def persisted_offset(tp: TP) -> int | None:
        if tp not in persisted:
            raise RuntimeError("database lock held by another worker")
        return persisted[tp]

    return SimpleNamespace(data=SimpleNamespace(persisted_offset=persisted_offset))


def test_the_recovery_notes_its_partitions_local_copies_once() -> None:
    table = store({A0: 3, A1: None})
    recovery: Any = SimpleNamespace(
        _tally=RestoreTally(started=0.0),
        active_tps={A0, A1},
        standby_tps={S0},  # its database cannot be opened here: no local copy
        tp_to_table={A0: table, A1: table, S0: table},
    )
    BulkRestoringRecovery._note_partitions(recovery)
    assert recovery._tally.partitions == {A0, A1, S0}
    assert recovery._tally.with_local_state == {A0}

    recovery._tally = None  # nothing measured between restores
    BulkRestoringRecovery._note_partitions(recovery)
