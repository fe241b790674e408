"""The consumer-side deduplication store: idempotent consumers across crashes.

A producer controller that restarts on its durable queue resends every message it had not
seen confirmed, with its original seq_nr (reference section 3.5); so does a retried task
that replays its messages under the same producer id. Some of those the consumer may have
processed already. A consumer controller given a `DedupStore` keeps, per producer id, the
highest seq_nr its consumer confirmed, and does not hand a message at or below it to the
application twice (the core's rules: consumer_core.py, "deduplication across restarts").

The store holds one number per producer id, written behind: the core emits
`RecordConfirmed` per confirmation, the shell `record`\\ s it (buffered) and `flush`\\ es the
store before any `Request` or `Ack` leaves, since those are what let the producer side drop
a message. So a producer never forgets a message this consumer could forget it confirmed,
and a flush costs one commit per `Request` (about two per flow-control window), not one per
message.

What it guarantees, and what not:

* After a producer restart (or a lost `Request`): no message confirmed here is delivered
  again, whatever the producer resends.
* After a consumer crash: confirmations not flushed yet (at most the ones since the last
  `Request`/`Ack`) are lost, and those messages are delivered again, unless
  ``SqliteDedupSettings.flush_every`` is 1 (each confirmation its own commit). A message
  processed but not confirmed when the process died is always delivered again: to make
  its effect and its confirmation one, the application must store both in one transaction:
  `SqliteTxDedupStore` (dedup_tx.py) keeps the positions in the application's database for
  that.

Contract of every implementation (tests/delivery/stores/test_dedup.py and, for `fence`,
test_dedup_fencing.py hold each store to it; the shared parts: dedup_base.py):

* `load` returns the positions (producer id -> seq_nr) of this consumer: what was
  flushed, with what this store object recorded since (a store opened after a crash
  finds the flushed ones only).
* `record` sets a producer id's position (the caller keeps it rising, except to forget a
  position with 0); it may be buffered until `flush`.
* `flush` makes every recorded position durable, all or none; on failure it raises
  `DedupStoreError` and keeps them buffered, so calling it again retries.
* `close` flushes and releases the store; calls afterwards raise `ClosedError`.
* A failing call raises `DedupStoreError` naming the store, the cause and the fix.
* Optionally, `fence(epoch)`: "this store now writes for activation ``epoch`` of its
  consumer" (the fencing epoch a coordinator gives each activation). It raises
  `ConsumerFenced` if a higher epoch is stored already, else stores ``epoch`` durably;
  from then on every write of this store object checks, in the transaction that writes,
  that no higher epoch was stored since (by the store object of a newer activation), and
  if one was, writes nothing and raises `ConsumerFenced`. So the late writes of a
  consumer that was replaced while it was paused (a GC pause, SIGSTOP, a partition) are
  refused where they land. A store never fenced checks nothing (as before fencing). The
  consumer calls it only if the store has it (a store of one's own may not).

Who owns what: the application creates the store and closes it; a consumer controller or
handle given one loads it when created, records and flushes, and flushes when it stops,
but does not close it (the same store may serve the next consumer of that id).
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pykka_delivery import _sqlite
from pykka_delivery._fields import check_field_types
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.stores.dedup_base import (
    BufferedDedupStore,
    DedupStore,
    DedupStoreError,
    _check_position,
    check_epoch,
    check_flush_every,
    fenced,
)
from pykka_delivery.errors import ClosedError, ConsumerFenced
from pykka_delivery.protocol.messages import Ack, Request
from pykka_delivery.retry import Backoff, call_with_retries

__all__ = [
    "BufferedDedupStore",
    "DedupStore",
    "DedupStoreError",
    "DedupWriter",
    "MemoryDedupStore",
    "SqliteDedupSettings",
    "SqliteDedupStore",
]

logger = logging.getLogger("pykka_delivery.consumer")

_T = TypeVar("_T")


# --- in memory ---------------------------------------------------------------------------


class MemoryDedupStore:
    """A `DedupStore` in memory, with write-behind and failure injection, for tests.

    ``positions`` is what a flush made durable, ``pending`` what is recorded but not
    flushed yet: ``MemoryDedupStore(old.positions, epoch=old.epoch)`` stands for the store
    after a crash.

    Args:
        positions: the durable positions to start from.
        epoch: the durable fencing epoch to start from (attribute ``epoch``: the highest
            one `fence` stored; a test sets it higher to stand for the fence of a newer
            activation through another store object).
        fail_when: asked ``fail_when(op, arg)`` before each call, ``op`` one of
            ``"load"`` (arg None), ``"record"`` (arg ``(producer_id, seq_nr)``) and
            ``"flush"`` (arg: the pending positions); True makes the call raise
            `DedupStoreError` and change nothing.

    Attributes:
        calls: how many times each operation was called (failed ones included).
        failures: how many calls ``fail_when`` made fail, per operation.

    Thread-safe: a controller calls it from its thread while a test reads it.
    """

    def __init__(
        self,
        positions: Mapping[str, int] | None = None,
        *,
        epoch: int = 0,
        fail_when: Callable[[str, object], bool] | None = None,
    ) -> None:
        check_epoch(epoch)
        self.positions: dict[str, int] = dict(positions or {})
        self.epoch = epoch
        self._fenced_at: int | None = None
        self.pending: dict[str, int] = {}
        self._fail_when = fail_when
        self._lock = threading.Lock()
        self._closed = False
        self.calls: dict[str, int] = {"load": 0, "record": 0, "flush": 0}
        self.failures: dict[str, int] = {"load": 0, "record": 0, "flush": 0}

    def __repr__(self) -> str:
        return "MemoryDedupStore()"

    def _enter(self, op: str, arg: object) -> None:
        if self._closed:
            msg = f"{self!r} was closed; create a new one"
            raise ClosedError(msg)
        self.calls[op] += 1
        if self._fail_when is not None and self._fail_when(op, arg):
            self.failures[op] += 1
            msg = f"{self!r}: {op} failed (injected failure)"
            raise DedupStoreError(msg)

    def load(self) -> dict[str, int]:
        with self._lock:
            self._enter("load", None)
            return {**self.positions, **self.pending}

    def record(self, producer_id: str, seq_nr: int) -> None:
        _check_position(producer_id, seq_nr)
        with self._lock:
            self._enter("record", (producer_id, seq_nr))
            self.pending[producer_id] = seq_nr

    def fence(self, epoch: int) -> None:
        check_epoch(epoch)
        with self._lock:
            if self._closed:
                self._enter("fence", None)  # raises
            if self.epoch > epoch:
                raise fenced(self, None, epoch, self.epoch)
            self.epoch = self._fenced_at = epoch

    def flush(self) -> None:
        with self._lock:
            self._enter("flush", dict(self.pending))
            if self._fenced_at is not None and self.epoch > self._fenced_at:
                raise fenced(self, None, self._fenced_at, self.epoch)
            self.positions.update(self.pending)
            self.pending.clear()

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush()
        except ConsumerFenced:
            self._closed = True
            raise
        self._closed = True


# --- SQLite ----------------------------------------------------------------------------

SCHEMA_COMPONENT = "dedup_store"
SCHEMA_VERSION = 2  # 2: dedup_fence (fencing epochs; version 1 files get it on opening)
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL")

# Versions live in the table the durable producer queue uses too (one row per component),
# not in PRAGMA user_version: one file may hold both stores.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    component TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS dedup_position (
    consumer_id TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    seq_nr INTEGER NOT NULL,
    PRIMARY KEY (consumer_id, producer_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dedup_fence (
    consumer_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL
) WITHOUT ROWID;
"""

_UPSERT = (
    "INSERT INTO dedup_position (consumer_id, producer_id, seq_nr) VALUES (?, ?, ?) "
    "ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = excluded.seq_nr"
)
# A fenced store's write: nothing if a higher epoch than its own (the last ?) is stored.
_UPSERT_FENCED = (
    "INSERT INTO dedup_position (consumer_id, producer_id, seq_nr) SELECT ?, ?, ? "
    "WHERE coalesce((SELECT epoch FROM dedup_fence WHERE consumer_id = ?), 0) <= ? "
    "ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = excluded.seq_nr"
)
_FENCE = (
    "INSERT INTO dedup_fence (consumer_id, epoch) VALUES (?, ?) "
    "ON CONFLICT (consumer_id) DO UPDATE SET epoch = excluded.epoch "
    "WHERE excluded.epoch > dedup_fence.epoch"
)
_EPOCH = "SELECT coalesce(max(epoch), 0) FROM dedup_fence WHERE consumer_id = ?"


@dataclass(frozen=True, slots=True)
class SqliteDedupSettings:
    """Settings of a `SqliteDedupStore`.

    Attributes:
        synchronous: the fsync policy (SQLite's ``PRAGMA synchronous`` in WAL mode).
            ``"normal"`` (default): a flushed position survives a crash of the process; a
            power cut or OS crash may lose the last flushes (never corrupts the file), so
            some messages may be delivered twice after one. ``"full"``: each flush is
            fsynced, it survives a power cut too (slower: one fsync per flush).
            ``"off"``: no fsync at all; survives a process crash, but a power cut or OS
            crash may corrupt the file.
        flush_every: also commit after this many `record` calls. 0 (default): only on
            `flush` (the consumer controllers flush before each Request/Ack, about twice
            per window), so a consumer crash may redeliver what was confirmed since. 1:
            write-through, each confirmation its own commit (slower; redelivers at most the
            message being processed).
        busy_timeout: seconds a commit waits while another connection writes to the same
            file (other consumers sharing it). Default 5.
        lock_timeout: seconds to wait for another holder of the same consumer id in the
            file (one writer per consumer id) before giving up. Default 5.
    """

    synchronous: str = "normal"
    flush_every: int = 0
    busy_timeout: float = 5.0
    lock_timeout: float = 5.0

    def __post_init__(self) -> None:
        check_field_types(self)
        _sqlite.check_synchronous(self.synchronous, _SYNCHRONOUS)
        check_flush_every(self.flush_every)
        _sqlite.check_seconds("busy_timeout", self.busy_timeout)
        _sqlite.check_seconds("lock_timeout", self.lock_timeout)


class SqliteDedupStore(BufferedDedupStore):
    """A `DedupStore` in an SQLite file (created if missing), in WAL mode.

    One file may hold the positions of many consumers, keyed by ``consumer_id``: one file
    per consumer, or one per node, both work. Each consumer id has one writer at a time
    (an OS lock on a file beside the database, released when its process dies), until it
    is fenced: then its epoch keeps older writers out, and the lock is let go.

    Args:
        path: the database file, or ``":memory:"`` (nothing durable, for tests).
        consumer_id: whose positions these are: the same id must be used by the consumer
            that replaces this one (after a crash, or on another node sharing the file).
        settings: see `SqliteDedupSettings`.

    Raises:
        DedupStoreError: another live process (or store object) holds this consumer id in
            this file, the file is not an SQLite database or is corrupt, it was written by
            a newer version, or it cannot be opened.
        ValueError: an empty consumer id.
    """

    _db_error = sqlite3.Error

    def __init__(
        self,
        path: str | os.PathLike[str],
        consumer_id: str,
        settings: SqliteDedupSettings | None = None,
    ) -> None:
        self.settings = settings = settings or SqliteDedupSettings()
        super().__init__(consumer_id, settings.flush_every)
        self.path = path if str(path) == _sqlite.MEMORY else Path(path)
        self._file_lock: _sqlite.FileLock | None = None
        if str(path) != _sqlite.MEMORY:
            self._file_lock = self._take_consumer_id()
        try:
            self._conn: sqlite3.Connection | None = self._open()
        except BaseException:
            if self._file_lock is not None:
                self._file_lock.release()
            raise

    def __repr__(self) -> str:
        return f"SqliteDedupStore({str(self.path)!r}, {self.consumer_id!r})"

    def _take_consumer_id(self) -> _sqlite.FileLock:
        path = Path(self.path)
        # Beside the durable queues' locks (<db>.locks/), prefixed so that a consumer id
        # and a producer id of the same name do not share a lock.
        digest = hashlib.sha256(self.consumer_id.encode()).hexdigest()[:32]
        return _sqlite.take_lock(
            path.parent / f"{path.name}.locks" / f"dedup-{digest}.lock",
            timeout=self.settings.lock_timeout,
            label=f"dedup consumer {self.consumer_id}",
            what=f"dedup store {path}",
            held=f"consumer id {self.consumer_id!r} is in use by another store",
            fix=(
                "Close that one first (or stop its process), or give this consumer another "
                "id: two writers of one consumer id would overwrite each other's positions."
            ),
            error=DedupStoreError,
        )

    def _open(self) -> sqlite3.Connection:
        return _sqlite.open_wal(
            self.path,
            busy_timeout=self.settings.busy_timeout,
            synchronous=self.settings.synchronous.upper(),
            prepare=self._prepare,
            error=lambda error: self._error("cannot be opened", error),
        )

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Refuse a newer schema, create the tables."""
        _sqlite.prepare_versioned(
            conn,
            _SCHEMA,
            component=SCHEMA_COMPONENT,
            version=SCHEMA_VERSION,
            what=f"dedup store {self.path}",
            refuse=DedupStoreError,
        )

    def _error(self, doing: str, error: sqlite3.Error) -> DedupStoreError:
        kind = _sqlite.classify(error)
        if kind == "locked":
            fix = (
                f"another connection kept the file busy longer than busy_timeout "
                f"({self.settings.busy_timeout} s): retry, or raise busy_timeout"
            )
        elif kind == "unreadable":
            fix = (
                "the file is not an SQLite database or is corrupt: restore it from a "
                "backup, or move it away to start without positions (messages processed "
                "before may then be delivered again)"
            )
        else:
            fix = "check that the file and its directory are writable and the disk not full"
        return DedupStoreError(f"dedup store {self.path}: {doing} ({error}); {fix}")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            msg = f"{self!r} was closed; open the file again with a new SqliteDedupStore"
            raise ClosedError(msg)
        return self._conn

    def _select(self, conn: sqlite3.Connection) -> dict[str, int]:
        rows = conn.execute(
            "SELECT producer_id, seq_nr FROM dedup_position WHERE consumer_id = ?",
            (self.consumer_id,),
        ).fetchall()
        return {producer_id: seq_nr for producer_id, seq_nr in rows}

    def _upsert(self, conn: sqlite3.Connection, pending: dict[str, int], epoch: int | None) -> int:
        consumer_id = self.consumer_id
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            if epoch is None:
                conn.executemany(_UPSERT, [(consumer_id, p, s) for p, s in pending.items()])
                return 0
            rows = [(consumer_id, p, s, consumer_id, epoch) for p, s in pending.items()]
            if conn.executemany(_UPSERT_FENCED, rows).rowcount > 0:
                return 0
            newer: int = conn.execute(_EPOCH, (consumer_id,)).fetchone()[0]
            return newer

    def _store_epoch(self, conn: sqlite3.Connection, epoch: int) -> int:
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(_FENCE, (self.consumer_id, epoch))
            stored: int = conn.execute(_EPOCH, (self.consumer_id,)).fetchone()[0]
            return stored

    def _unlock(self, conn: sqlite3.Connection) -> None:
        if self._file_lock is not None:
            self._file_lock.release()

    def _release(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
        if self._file_lock is not None:
            self._file_lock.release()


# --- what the shells share ---------------------------------------------------------------

_CONFIRMING = (Request, Ack)


class DedupWriter:
    """A consumer shell's side of its `DedupStore`: every call retried, failures raised.

    The shells (the `ConsumerController` actor, the `Consumer` and `AsyncConsumer`
    handles) `load` once when created, `record` each `RecordConfirmed`, and call
    `before_send` for every message they send to the producer side: it flushes when a
    `Request` or `Ack` would leave with a confirmation not yet flushed.

    A call that fails is tried ``settings.dedup_store_attempts`` times in all, waiting
    ``settings.dedup_store_backoff`` seconds (doubled each time, up to
    ``dedup_store_backoff_max``; see `pykka_delivery.retry`) in between, in the
    caller's thread; then `DedupStoreError` is raised and the writer is *broken*: the
    shell must stop and send no further `Request` or `Ack` (the producer side keeps the
    unconfirmed messages for the next consumer).
    """

    __slots__ = ("_attempts", "_backoff", "_sleep", "broken", "dirty", "store")

    def __init__(
        self,
        store: DedupStore,
        settings: ConsumerControllerSettings,
        *,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not isinstance(store, DedupStore):
            msg = (
                f"dedup_store must have load, record, flush and close (a DedupStore, such "
                f"as SqliteDedupStore), got {type(store).__name__}"
            )
            raise TypeError(msg)
        self.store = store
        self._attempts = settings.dedup_store_attempts
        self._backoff = Backoff(settings.dedup_store_backoff, settings.dedup_store_backoff_max)
        self._sleep = sleep
        self.dirty = False  # recorded, not flushed
        self.broken: DedupStoreError | None = None

    def load(self) -> dict[str, int]:
        return self._retry("load", self.store.load)

    def record(self, producer_id: str, seq_nr: int) -> None:
        if self.broken is not None:
            raise self.broken
        try:  # once per confirmation: the first attempt without the retry loop
            self.store.record(producer_id, seq_nr)
        except Exception as error:
            self._retry("record", self.store.record, producer_id, seq_nr, failed=error)
        self.dirty = True

    def before_send(self, message: Any) -> None:
        """Flush if ``message`` tells the producer side of confirmations not flushed."""
        if self.dirty and type(message) in _CONFIRMING:
            self.flush()

    def flush(self) -> None:
        if self.dirty:
            self._retry("flush", self.store.flush)
            self.dirty = False

    def _retry(
        self, op: str, call: Callable[..., _T], *args: Any, failed: Exception | None = None
    ) -> _T:
        """``call(*args)``, tried up to ``dedup_store_attempts`` times in all (``failed``:
        the first attempt was made already and raised it)."""
        if self.broken is not None:
            raise self.broken

        def on_retry(attempt: int, _delay: float, error: Exception) -> None:
            logger.warning(
                "Deduplication store %r: %s failed (attempt %d of %d), retrying: %s",
                self.store,
                op,
                attempt,
                self._attempts,
                error,
            )

        # Anything but a DedupStoreError is a bug or a closed store: retrying will not help.
        return call_with_retries(
            call,
            *args,
            attempts=self._attempts,
            backoff=self._backoff,
            retry_on=DedupStoreError,
            on_retry=on_retry,
            give_up=lambda attempt, error: self._give_up(op, attempt, error),
            sleep=self._sleep,
            failed=failed,
        )

    def _give_up(self, op: str, attempt: int, error: Exception) -> DedupStoreError:
        msg = (
            f"deduplication store {self.store!r}: {op} failed {attempt} time(s), giving up: "
            f"{type(error).__name__}: {error}. The consumer stops without confirming further "
            f"messages to the producer side (they stay there for the next consumer); fix "
            f"the store, then start a consumer on it again"
        )
        self.broken = DedupStoreError(msg)
        return self.broken
