"""Every table partition database of a process shares one block cache and one memtable budget,
sized by settings."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path

import faust.stores
import pytest

from shared.engine._rocksdb import MIB, SharedMemoryOptions, SharedMemoryStore, configure_rocksdb_memory, rocksdb_memory
from shared.settings import Settings


@pytest.fixture
def sized() -> Iterator[None]:
    configure_rocksdb_memory(Settings(rocksdb_cache_mb=16, rocksdb_write_buffer_mb=8))
    yield
    configure_rocksdb_memory(Settings())


def test_sizes_come_from_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATEFLEET_ROCKSDB_CACHE_MB", "32")
    monkeypatch.setenv("STATEFLEET_ROCKSDB_WRITE_BUFFER_MB", "16")
    try:
        memory = configure_rocksdb_memory(Settings())
        assert (memory.cache_bytes, memory.write_buffer_bytes) == (32 * MIB, 16 * MIB)
        assert memory.write_buffers.get_buffer_size() == 16 * MIB
        assert memory.write_buffer_per_db == 8 * MIB
    finally:
        monkeypatch.delenv("STATEFLEET_ROCKSDB_CACHE_MB")
        monkeypatch.delenv("STATEFLEET_ROCKSDB_WRITE_BUFFER_MB")
        configure_rocksdb_memory(Settings())


def test_resizing_keeps_the_same_cache_and_budget(sized: None) -> None:
    before = rocksdb_memory()
    after = configure_rocksdb_memory(Settings(rocksdb_cache_mb=24, rocksdb_write_buffer_mb=12))
    assert after.cache is before.cache and after.write_buffers is before.write_buffers
    assert after.write_buffers.get_buffer_size() == 12 * MIB


def test_memtables_of_every_database_count_towards_one_budget(sized: None, tmp_path: Path) -> None:
    # Databases other tests left to the garbage collector share this budget; one closed mid-test
    # would give its memtables back between two readings.
    gc.collect()
    budget = rocksdb_memory().write_buffers
    # Those still open hold memtables too: past the budget, each write below would flush one
    # and give memory back (a CI run's test process held 25 MiB of an 8 MiB budget). Room above
    # what they hold; the memtables' own size stays as `sized` set it.
    budget.set_buffer_size(budget.get_usage() + 32 * MIB)
    options = SharedMemoryOptions()
    first, second = (options.open(tmp_path / name) for name in ("a", "b"))
    try:
        baseline = budget.get_usage()
        for i in range(2000):
            first[b"k%06d" % i] = b"x" * 200
        after_first = budget.get_usage()
        for i in range(2000):
            second[b"k%06d" % i] = b"y" * 200
        after_second = budget.get_usage()
        assert baseline < after_first < after_second
        assert first[b"k000007"] == b"x" * 200 and second[b"k001999"] == b"y" * 200
    finally:
        first.close()
        second.close()
        budget.set_buffer_size(rocksdb_memory().write_buffer_bytes)


def test_reads_fill_the_one_shared_cache(sized: None, tmp_path: Path) -> None:
    cache = rocksdb_memory().cache
    options = SharedMemoryOptions()
    dbs = [options.open(tmp_path / name) for name in ("a", "b")]
    try:
        for db in dbs:
            for i in range(2000):
                db[b"k%06d" % i] = b"z" * 200
            db.flush()  # to an SST file, whose blocks are read through the cache
        usage = [cache.get_usage()]
        for db in dbs:
            assert db[b"k000100"] == b"z" * 200
            usage.append(cache.get_usage())
        assert usage[0] < usage[1] < usage[2] <= 16 * MIB
    finally:
        for db in dbs:
            db.close()


def test_faust_opens_the_service_tables_with_the_shared_options(tmp_path: Path) -> None:
    from shared.engine._app import create_app

    settings = Settings(topic_prefix="memtest.", instance_id="memtest", data_dir=tmp_path)
    app = create_app("memtest", settings, 18999)
    table = app.Table("t", partitions=1, key_type=bytes, value_type=bytes)
    store = table.data
    assert isinstance(store, SharedMemoryStore)
    assert isinstance(store.rocksdb_options, SharedMemoryOptions)
    assert faust.stores.by_url("statefleet-rocksdb://") is SharedMemoryStore
