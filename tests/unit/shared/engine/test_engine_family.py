"""The engine's own rows (Faust's persisted offset, the next-offset rows) live in a column family
of each partition database, apart from the service's rows: a database of an earlier version is
migrated when opened, and changelog records are applied each to its family."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from faust.types import TP, EventT
from rocksdict import Options, Rdict

from shared.engine._app import create_app
from shared.engine._durable import DurableTable, next_offset_key
from shared.engine._faust import FAUST_OFFSET_KEY
from shared.engine._restore import write_batch
from shared.engine._rocksdb import (
    ENGINE_FAMILY,
    SharedMemoryStore,
    engine_family,
    open_partition_db,
    persisted_offset,
    release_engine_family,
)
from shared.settings import Settings

SERVICE_ROWS = [(b"\x00a", b"sorts among the engine's rows"), (b"a", b"A"), (b"z", b"Z"), (b"\xff", b"last")]
NEXT_OFFSETS = {next_offset_key("in"): b"17", next_offset_key("other-in"): b"5"}
MIGRATED = "engine rows to the"


def store_and_table(tmp_path: Path) -> tuple[SharedMemoryStore, DurableTable]:
    settings = Settings(topic_prefix="cftest.", instance_id="cftest", data_dir=tmp_path)
    app = create_app("cftest", settings, 18999)
    table = app.Table("t", partitions=1, key_type=bytes, value_type=bytes)
    store = table.data
    assert isinstance(store, SharedMemoryStore)
    return store, DurableTable(app, table)


def close(store: SharedMemoryStore, partition: int) -> None:
    """Close a partition database the store opened (Faust leaves that to the garbage collector),
    its kept engine family first, as the store lets both go."""
    db = cast(Any, store)._dbs.pop(partition)
    release_engine_family(db)
    db.close()


def old_format_db(path: Path) -> None:
    """A partition database as the engine wrote it before the engine family: its rows, Faust's
    offset row and the next-offset rows, all in the default family."""
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    db = Rdict(str(path), options)
    for key, value in SERVICE_ROWS:
        db.put(key, value)
    db.put(FAUST_OFFSET_KEY, b"41")
    for key, value in NEXT_OFFSETS.items():
        db.put(key, value)
    db.close()


def migrations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if MIGRATED in r.getMessage()]


def test_a_database_of_the_earlier_layout_is_migrated_once_when_opened(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store, table = store_and_table(tmp_path)
    tp = TP(table.changelog, 0)
    path = store.partition_path(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    old_format_db(path)
    assert Rdict.list_cf(str(path)) == ["default"]
    caplog.set_level(logging.INFO, logger="shared.engine._rocksdb")

    for opening in (1, 2):
        # Read back unchanged, through the store (Faust's recovery, the bulk restore) and the table.
        assert store.persisted_offset(tp) == 41
        for key, value in NEXT_OFFSETS.items():
            assert table.get(0, key) == value
        # The default family holds the service's rows only, the engine family the engine's.
        db = store._db_for_partition(0)
        assert list(db.items()) == SERVICE_ROWS
        assert list(table.items(0)) == SERVICE_ROWS
        assert dict(engine_family(db).items()) == {FAUST_OFFSET_KEY: b"41", **NEXT_OFFSETS}
        assert sorted(Rdict.list_cf(str(path))) == sorted(["default", ENGINE_FAMILY])
        # Moved once, logged once with the count; the second opening finds nothing to move.
        assert len(migrations(caplog)) == 1, opening
        assert "moved 3 engine rows" in migrations(caplog)[0]
        del db
        close(store, 0)


def test_a_new_database_gets_the_engine_family_and_nothing_to_migrate(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="shared.engine._rocksdb")
    db = open_partition_db(tmp_path / "new.db")
    try:
        assert persisted_offset(db) is None and list(engine_family(db).items()) == []
        assert migrations(caplog) == []
    finally:
        db.close()
    assert sorted(Rdict.list_cf(str(tmp_path / "new.db"))) == sorted(["default", ENGINE_FAMILY])


@dataclass
class Message:
    tp: TP
    offset: int
    key: bytes
    value: bytes | None

    @property
    def partition(self) -> int:
        return self.tp.partition


@dataclass
class Event:
    message: Message


def test_fausts_changelog_batches_put_each_row_into_its_family(tmp_path: Path) -> None:
    store, table = store_and_table(tmp_path)
    tp = TP(table.changelog, 0)
    records = [
        Message(tp, 10, b"k", b"v"),
        Message(tp, 11, next_offset_key("in"), b"3"),
        Message(tp, 12, next_offset_key("gone"), b"1"),
        Message(tp, 13, b"old", b"x"),
    ]
    later = [Message(tp, 14, next_offset_key("gone"), None), Message(tp, 15, b"old", None)]
    for messages in (records, later):
        store.apply_changelog_batch([cast(EventT[Any], Event(m)) for m in messages], lambda k: k, lambda v: v)
    db = store._db_for_partition(0)
    assert list(db.items()) == [(b"k", b"v")]
    assert dict(engine_family(db).items()) == {FAUST_OFFSET_KEY: b"15", next_offset_key("in"): b"3"}
    assert store.persisted_offset(tp) == 15 and table.get(0, next_offset_key("in")) == b"3"
    del db
    close(store, 0)


@dataclass
class Target:
    path: Path
    _db: Rdict | None = None

    def db(self) -> Rdict:
        if self._db is None:
            self._db = open_partition_db(self.path)
        return self._db

    def persisted_offset(self) -> int | None:
        return persisted_offset(self.db())

    def set_persisted_offset(self, offset: int) -> None:
        engine_family(self.db()).put(FAUST_OFFSET_KEY, str(offset).encode())


def test_the_bulk_restore_puts_each_row_into_its_family(tmp_path: Path) -> None:
    target = Target(tmp_path / "p.db")
    tp = TP("t-changelog", 0)
    write_batch(
        target,
        [
            Message(tp, 0, b"k", b"v"),
            Message(tp, 1, next_offset_key("in"), b"9"),
            Message(tp, 2, next_offset_key("gone"), b"2"),
            Message(tp, 3, next_offset_key("gone"), None),
        ],
    )
    db = target.db()
    try:
        assert list(db.items()) == [(b"k", b"v")]
        assert dict(engine_family(db).items()) == {FAUST_OFFSET_KEY: b"3", next_offset_key("in"): b"9"}
    finally:
        db.close()


def test_reading_the_engine_rows_of_an_open_partition_writes_no_file_and_a_revoked_one_reopens(tmp_path: Path) -> None:
    """rocksdict flushes a column family to a new SST file whenever an Rdict for it is dropped:
    the engine family of a store's database is kept open with it, not taken per read."""
    store, table = store_and_table(tmp_path)
    tp = TP(table.changelog, 0)
    store.set_persisted_offset(tp, 1)

    def sst_files() -> int:
        return len(list(store.partition_path(0).glob("*.sst")))

    before = sst_files()
    for offset in range(2, 52):  # one batch's commit and its reads of the engine rows, fifty times
        table.apply_rows({(0, b"row"): b"%d" % offset}, {0: offset})
        assert table.applied_offset(0) == offset and store.persisted_offset(tp) == offset
        assert table.get(0, next_offset_key("in")) is None
    assert sst_files() == before, "no flush per read"

    store.revoke_partitions(table.table, {tp})
    assert store.persisted_offset(tp) == 51  # opened again: the lock was let go with the database
