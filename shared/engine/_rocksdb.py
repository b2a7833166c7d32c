"""RocksDB memory bounded by configuration: one block cache and one write-buffer budget for
every partition database of the process.

Faust opens each table partition's database with options of its own, a new 2 GiB block
cache and up to three 64 MiB memtables each. A service with four tables of eight
partitions thus has 32 caches and up to 6 GiB of memtables, and its memory grows with
what it stores until those limits: about 1 KB per entry for the retry scheduler.

Here every database of the process shares one ``rocksdict.Cache`` of
``STATEFLEET_ROCKSDB_CACHE_MB`` (data blocks, and also index and filter blocks, which
RocksDB would otherwise keep outside any cache for each open file) and one
``WriteBufferManager`` of ``STATEFLEET_ROCKSDB_WRITE_BUFFER_MB``, which flushes the
largest memtables when all of them together reach it. The table stores are Faust's
own, opened with these options (``store="statefleet-rocksdb://"``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust.stores
import rocksdict
from faust.stores.rocksdb import RocksDBOptions
from faust.stores.rocksdb import Store as FaustRocksDBStore

from shared.settings import Settings

MIB = 1024 * 1024
#: URL scheme of :class:`SharedMemoryStore` (the ``store`` setting of the services' Faust apps).
STORE_SCHEME = "statefleet-rocksdb"
#: Memtables one database may have (the active one and one being flushed).
MAX_WRITE_BUFFERS_PER_DB = 2
#: Smallest memtable of one database, however small the process's budget.
MIN_WRITE_BUFFER_BYTES = 1 * MIB


@dataclass(frozen=True)
class RocksDBMemory:
    """The block cache and the memtable budget every database of the process shares."""

    cache_bytes: int
    write_buffer_bytes: int
    cache: rocksdict.Cache
    write_buffers: rocksdict.WriteBufferManager

    @property
    def write_buffer_per_db(self) -> int:
        """One database's memtable size: half the budget. The manager keeps all of them together
        within the budget; smaller memtables flush a partition restored in bulk into many small
        level-0 files (loading 125,000 entries into one partition took 7.7 s with 16 MiB
        memtables, 3.8-4.4 s with 32-64 MiB, on the loaded 2-core machine of docs/benchmarks.md)."""
        return max(MIN_WRITE_BUFFER_BYTES, self.write_buffer_bytes // 2)


_memory: RocksDBMemory | None = None


def configure_rocksdb_memory(settings: Settings) -> RocksDBMemory:
    """Size the process's shared block cache and memtable budget from ``settings``.

    Called before any database opens (by :func:`shared.engine._app.create_app`). Calling it
    again with other sizes resizes the same cache and budget, so databases already open
    keep sharing them.
    """
    global _memory
    cache_bytes = settings.rocksdb_cache_mb * MIB
    write_buffer_bytes = settings.rocksdb_write_buffer_mb * MIB
    if _memory is None:
        _memory = RocksDBMemory(
            cache_bytes, write_buffer_bytes, rocksdict.Cache(cache_bytes),
            rocksdict.WriteBufferManager(write_buffer_bytes, False),
        )
    elif (_memory.cache_bytes, _memory.write_buffer_bytes) != (cache_bytes, write_buffer_bytes):
        _memory.cache.set_capacity(cache_bytes)
        _memory.write_buffers.set_buffer_size(write_buffer_bytes)
        _memory = RocksDBMemory(cache_bytes, write_buffer_bytes, _memory.cache, _memory.write_buffers)
    return _memory


def rocksdb_memory() -> RocksDBMemory:
    """The shared cache and budget (sized with the defaults if nothing configured them yet)."""
    return _memory if _memory is not None else configure_rocksdb_memory(Settings())


class SharedMemoryOptions(RocksDBOptions):
    """Faust's RocksDB options, with the process's shared cache and memtable budget."""

    def as_options(self) -> Any:
        memory = rocksdb_memory()
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        if self.max_open_files is not None:
            options.set_max_open_files(self.max_open_files)
        options.set_target_file_size_base(self.target_file_size_base)
        options.set_write_buffer_size(memory.write_buffer_per_db)
        options.set_max_write_buffer_number(MAX_WRITE_BUFFERS_PER_DB)
        options.set_write_buffer_manager(memory.write_buffers)
        table = rocksdict.BlockBasedOptions()
        table.set_bloom_filter(self.bloom_filter_size, True)
        table.set_block_cache(memory.cache)
        # Index and filter blocks in the cache too, so they count towards its limit; level 0's
        # stay pinned there, since every read consults each level-0 file.
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        table.set_index_type(rocksdict.BlockBasedIndexType.binary_search())
        options.set_block_based_table_factory(table)
        return options

    def open(self, path: Path, *, read_only: bool = False) -> Any:
        access = rocksdict.AccessType.read_write() if self.ttl is None else rocksdict.AccessType.with_ttl(self.ttl)
        db = rocksdict.Rdict(str(path), options=self.as_options(), access_type=access)
        db.set_read_options(rocksdict.ReadOptions())
        return db


class SharedMemoryStore(FaustRocksDBStore):
    """Faust's RocksDB table store (rocksdict), its databases opened with :class:`SharedMemoryOptions`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rocksdb_options = SharedMemoryOptions(**(self.options or {}), use_rocksdict=True)


faust.stores.STORES.aliases[STORE_SCHEME] = f"{__name__}:SharedMemoryStore"
