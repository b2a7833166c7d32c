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

**Two column families per partition database.** The default family holds the service's rows
only. The engine's own rows live in the family :data:`ENGINE_FAMILY`, created when a database
is opened: Faust's persisted changelog offset (:data:`FAUST_OFFSET_KEY`, read and written by
the store's ``persisted_offset``/``set_persisted_offset``) and the handlers' next-offset rows
(keys starting with :data:`NEXT_OFFSET_PREFIX`). Those rows travel in the table's changelog
like any other row; wherever changelog records are applied locally (:class:`PartitionWrite`:
Faust's recovery and standbys through :meth:`SharedMemoryStore.apply_changelog_batch`, the
bulk restore, the engine's commits), a key with the prefix goes to the engine family and any
other to the default one, in one atomic write batch. A database written before the engine
family existed (engine rows in the default family) is migrated when opened
(:func:`migrate_engine_rows`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import faust.stores
import rocksdict
from faust.stores.rocksdb import RocksDBOptions
from faust.stores.rocksdb import Store as FaustRocksDBStore
from faust.types import TP, CollectionT, EventT

from shared.engine._faust import FAUST_OFFSET_KEY, store_partition_db
from shared.settings import Settings

log = logging.getLogger(__name__)

#: The column family of each partition database that holds the engine's own rows.
ENGINE_FAMILY = "statefleet-engine"
#: Prefix of the rows holding an input partition's next expected offset (in the changelog as
#: in the engine family). A table that holds them must have no key of its own starting with it.
NEXT_OFFSET_PREFIX = b"\x00next-offset\x00"

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
        memtables, 3.8-4.4 s with 32-64 MiB, on the loaded 2-core machine of docs/benchmarks-log.md)."""
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
            cache_bytes, write_buffer_bytes, rocksdict.Cache(cache_bytes), rocksdict.WriteBufferManager(write_buffer_bytes, False)
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

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Every database opened with these options that its store has not given up yet, by path
        #: (Faust's store holds the same ones, by partition).
        self.opened: dict[Path, rocksdict.Rdict] = {}

    def as_options(self, write_buffer_bytes: int | None = None) -> Any:
        """The options of a database and its default family; ``write_buffer_bytes``, a smaller
        memtable (the engine family's, which holds a few rows per partition)."""
        memory = rocksdb_memory()
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
        if self.max_open_files is not None:
            options.set_max_open_files(self.max_open_files)
        options.set_target_file_size_base(self.target_file_size_base)
        options.set_write_buffer_size(write_buffer_bytes or memory.write_buffer_per_db)
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
        db = open_partition_db(path, self.as_options(), self.as_options(MIN_WRITE_BUFFER_BYTES), access_type=access)
        keep_engine_family(db)
        self.opened[Path(path)] = db
        return db


def open_partition_db(
    path: Path | str, options: Any = None, engine_options: Any = None, *, access_type: Any = None
) -> rocksdict.Rdict:
    """Open (or create) a partition database with its engine family (created if missing), and
    move engine rows a database of an earlier version kept in its default family there."""
    if options is None:
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.create_missing_column_families(True)
    families = {ENGINE_FAMILY: engine_options if engine_options is not None else options}
    if Path(path).is_dir():
        # Every existing family must be opened (with this database's options).
        try:
            existing = rocksdict.Rdict.list_cf(str(path), options)
        except Exception:  # no database there yet (rocksdict raises plain Exceptions)
            existing = []
        for name in existing:
            if name not in families and name != "default":
                families[name] = options
    db = rocksdict.Rdict(
        str(path),
        options=options,
        column_families=families,
        access_type=access_type if access_type is not None else rocksdict.AccessType.read_write(),
    )
    db.set_read_options(rocksdict.ReadOptions())
    migrate_engine_rows(db)
    return db


def is_engine_key(key: bytes) -> bool:
    """Whether a changelog record's ``key`` is one of the engine's rows (a next-offset row),
    applied to the engine family."""
    return key.startswith(NEXT_OFFSET_PREFIX)


#: The engine family of each partition database a store keeps open, by ``id`` of the database:
#: rocksdict flushes a column family's memtable to a new SST file whenever an Rdict for it is
#: dropped, so one taken per read flushed on every batch (2 ms each, and the files to compact).
#: Each entry holds its database too, so an id is never taken for another's; a store drops it
#: with the database (:meth:`SharedMemoryStore.revoke_partitions`, ``stop``, ``reset_state``).
_engine_families: dict[int, tuple[rocksdict.Rdict, rocksdict.Rdict]] = {}


def engine_family(db: rocksdict.Rdict) -> rocksdict.Rdict:
    """The engine family of a partition database, as a database of its own (get, put, items)."""
    kept = _engine_families.get(id(db))
    if kept is not None and kept[0] is db:
        return kept[1]
    # A database no store keeps open (a tool's, a test's): a family of its own for this use.
    return db.get_column_family(ENGINE_FAMILY)


def keep_engine_family(db: rocksdict.Rdict) -> None:
    """Keep ``db``'s engine family open with it, for :func:`engine_family`."""
    _engine_families[id(db)] = (db, db.get_column_family(ENGINE_FAMILY))


def release_engine_family(db: rocksdict.Rdict) -> None:
    """Let go of ``db``'s kept engine family (before the database itself is let go: the family
    holds it open)."""
    kept = _engine_families.get(id(db))
    if kept is not None and kept[0] is db:
        del _engine_families[id(db)]


def family_for(db: rocksdict.Rdict, key: bytes) -> rocksdict.Rdict:
    """The family of ``db`` that holds ``key``: the engine's for an engine key, else the default."""
    return engine_family(db) if is_engine_key(key) else db


def engine_rows_in_default(db: rocksdict.Rdict) -> list[tuple[bytes, bytes]]:
    """Engine rows in the default family (a database of an earlier version): Faust's offset row
    and the next-offset rows."""
    rows: list[tuple[bytes, bytes]] = []
    for key, value in db.items(from_key=NEXT_OFFSET_PREFIX):
        if not is_engine_key(cast(bytes, key)):
            break
        rows.append((cast(bytes, key), cast(bytes, value)))
    offset = db.get(FAUST_OFFSET_KEY)
    if offset is not None:
        rows.append((FAUST_OFFSET_KEY, cast(bytes, offset)))
    return rows


def migrate_engine_rows(db: rocksdict.Rdict) -> int:
    """Move the engine rows of ``db``'s default family to its engine family, in one write batch
    (a crash leaves them all in one family or the other); the number moved."""
    rows = engine_rows_in_default(db)
    if not rows:
        return 0
    batch = rocksdict.WriteBatch(raw_mode=True)
    engine = db.get_column_family_handle(ENGINE_FAMILY)
    for key, value in rows:
        batch.put(key, value, column_family=engine)
        batch.delete(key)
    db.write(batch)
    log.info("%s: moved %d engine rows to the %r column family", db.path(), len(rows), ENGINE_FAMILY)
    return len(rows)


class PartitionWrite:
    """One atomic write to a partition database: each row into its family (engine keys into the
    engine family, every other into the default one), and the persisted changelog offset."""

    def __init__(self, db: rocksdict.Rdict) -> None:
        self.db = db
        self.batch = rocksdict.WriteBatch(raw_mode=True)
        self._engine = db.get_column_family_handle(ENGINE_FAMILY)

    def put(self, key: bytes, value: bytes) -> None:
        if is_engine_key(key):
            self.batch.put(key, value, column_family=self._engine)
        else:
            self.batch.put(key, value)

    def delete(self, key: bytes) -> None:
        if is_engine_key(key):
            self.batch.delete(key, column_family=self._engine)
        else:
            self.batch.delete(key)

    def apply(self, key: bytes, value: bytes | None) -> None:
        """A changelog record: ``value`` None is a tombstone."""
        if value is None:
            self.delete(key)
        else:
            self.put(key, value)

    def apply_records(self, records: Iterable[Any]) -> None:
        """Changelog records (anything with ``key`` and ``value``, a None value a tombstone), in
        order: :meth:`apply` for each, written out here because a bulk restore spends on this
        loop most of the Python time that is its own (the method calls and lookups per record
        cost about a third of it)."""
        put, delete, engine, prefix = self.batch.put, self.batch.delete, self._engine, NEXT_OFFSET_PREFIX
        for record in records:
            key, value = record.key, record.value
            if key.startswith(prefix):
                if value is None:
                    delete(key, column_family=engine)
                else:
                    put(key, value, column_family=engine)
            elif value is None:
                delete(key)
            else:
                put(key, value)

    def apply_batches(self, batches: Iterable[Iterable[Any]], position: int) -> tuple[int, int]:
        """Changelog record batches (aiokafka's, each an iterable of records with ``offset``,
        ``key`` and ``value``), in order, leaving out records before ``position`` (a fetch's
        first batch may begin before the offset it was asked for): (records applied, offset of
        the last of them)."""
        put, delete, engine, prefix = self.batch.put, self.batch.delete, self._engine, NEXT_OFFSET_PREFIX
        count, last = 0, -1
        for batch in batches:
            for record in batch:
                offset = record.offset
                if offset < position:
                    continue
                key, value = record.key, record.value
                if key.startswith(prefix):
                    if value is None:
                        delete(key, column_family=engine)
                    else:
                        put(key, value, column_family=engine)
                elif value is None:
                    delete(key)
                else:
                    put(key, value)
                last = offset
                count += 1
        return count, last

    def set_persisted_offset(self, offset: int) -> None:
        """Faust's persisted changelog offset (the last offset applied)."""
        self.batch.put(FAUST_OFFSET_KEY, str(offset).encode(), column_family=self._engine)

    def write(self, *, wal: bool = True) -> None:
        """Write the batch; ``wal=False``: without the write-ahead log (a crash loses it unless
        :func:`flush_partition` ran after it), for bulk restores, which move the persisted
        offset only after a flush."""
        if wal:
            self.db.write(self.batch)
        else:
            self.db.write(self.batch, WITHOUT_WAL)


#: Write options of the writes a crash may lose (see :meth:`PartitionWrite.write`).
WITHOUT_WAL = rocksdict.WriteOptions()
cast(Any, WITHOUT_WAL).disable_wal = True  # a property (rocksdict's stub says a method, which it is not)


def flush_partition(db: rocksdict.Rdict) -> None:
    """Flush both families' memtables of a partition database to SST files, and wait: what was
    written without the WAL survives a crash from here on."""
    db.flush(True)
    engine_family(db).flush(True)


def persisted_offset(db: rocksdict.Rdict) -> int | None:
    """The last changelog offset applied to a partition database (None: none yet)."""
    raw = engine_family(db).get(FAUST_OFFSET_KEY)
    return int(raw) if raw is not None else None


def set_persisted_offset(db: rocksdict.Rdict, offset: int) -> None:
    engine_family(db).put(FAUST_OFFSET_KEY, str(offset).encode())


class SharedMemoryStore(FaustRocksDBStore):
    """Faust's RocksDB table store (rocksdict), its databases opened with :class:`SharedMemoryOptions`
    and its own rows (persisted offset, next-offset rows) in their engine family."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.shared_options = SharedMemoryOptions(**(self.options or {}), use_rocksdict=True)
        self.rocksdb_options = self.shared_options

    def revoke_partitions(self, table: CollectionT, tps: set[TP]) -> None:
        for tp in tps:
            if tp.topic in table.changelog_topic.topics:
                db = self.shared_options.opened.pop(self.partition_path(tp.partition), None)
                if db is not None:
                    release_engine_family(db)
        super().revoke_partitions(table, tps)

    async def stop(self) -> None:
        self._give_up_dbs()
        await super().stop()

    def reset_state(self) -> None:
        self._give_up_dbs()
        super().reset_state()

    def _give_up_dbs(self) -> None:
        # Faust drops every database it holds on stop and reset (it keeps no other handle).
        for db in self.shared_options.opened.values():
            release_engine_family(db)
        self.shared_options.opened.clear()

    def persisted_offset(self, tp: TP) -> int | None:
        return persisted_offset(store_partition_db(self, tp.partition))

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        set_persisted_offset(store_partition_db(self, tp.partition), offset)

    def apply_changelog_batch(
        self, batch: Iterable[EventT[Any]], to_key: Callable[[Any], Any], to_value: Callable[[Any], Any]
    ) -> None:
        """Faust's recovery and standbys: changelog records into each partition's families, with
        the partition's persisted offset in the same write batch."""
        writes: dict[int, PartitionWrite] = {}
        offsets: dict[int, int] = {}
        for event in batch:
            msg = event.message
            write = writes.get(msg.partition)
            if write is None:
                write = writes[msg.partition] = PartitionWrite(store_partition_db(self, msg.partition))
            write.apply(cast(bytes, msg.key), msg.value)
            offsets[msg.partition] = max(msg.offset, offsets.get(msg.partition, msg.offset))
        for partition, write in writes.items():
            write.set_persisted_offset(offsets[partition])
            write.write()


faust.stores.STORES.aliases[STORE_SCHEME] = f"{__name__}:SharedMemoryStore"
