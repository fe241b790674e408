"""The default durable producer queue: an embedded SQLite database (stdlib `sqlite3`).

One file may hold the queues of many producers (rows are keyed by producer id), so a
deployment chooses one file per queue or one per node. Each producer id has one writer at
a time: opening a queue takes an OS lock on a small file of its own beside the database
(``<db>.locks/<hash of producer id>.lock``), released on `close` or by the kernel when the
process dies, so a restarted producer reopens its queue at once.

Tables (see docs/durable.md, "Stores"):

* ``schema_version``: the version of these tables (a newer file is refused).
* ``producer``: per producer id, the next seq_nr and the highest confirmed seq_nr (kept
  when every message is confirmed and deleted).
* ``message_sent``: the unconfirmed messages, one row per message or chunk: seq_nr,
  qualifier, ack, timestamp, and the payload as ``(serializer_id, manifest, data)``
  written with `pykka_delivery.protocol.serialization` (a `ChunkedMessage` keeps its own
  bytes, serializer, manifest and first/last flags). Confirmed rows are deleted.
* ``confirmed``: per producer id and qualifier, the highest confirmed seq_nr and when.

Writes: `store_message_sent` is one transaction, and so is `store_messages_sent` however
many messages it holds (batching a burst costs one commit). Confirmations are written
behind (``SqliteQueueSettings.confirm_flush_every``): buffered and written in the next
store's transaction, every N confirmations, or on `flush` / `close`. A crash loses the
buffered ones, so their messages are sent again after a restart (duplicates, as in Akka).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from pykka_delivery import _sqlite
from pykka_delivery._fields import check_field_types
from pykka_delivery.delivery.stores.durable_memory import check_batch
from pykka_delivery.delivery.stores.durable_queue import (
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.delivery.stores.durable_rows import (
    ConfirmBuffer,
    decode_row,
    encode_row,
    partial_chunk_drops,
)
from pykka_delivery.protocol.serialization import Serialization, default_serialization

__all__ = ["SqliteDurableQueue", "SqliteQueueSettings"]

SCHEMA_COMPONENT = "durable_producer_queue"
SCHEMA_VERSION = 1

_SYNCHRONOUS = ("OFF", "NORMAL", "FULL")
_CONFIRM_FLUSH_EVERY_MAX = 1_000_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    component TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS producer (
    producer_id TEXT PRIMARY KEY,
    current_seq_nr INTEGER NOT NULL,
    highest_confirmed_seq_nr INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS message_sent (
    producer_id TEXT NOT NULL,
    seq_nr INTEGER NOT NULL,
    qualifier TEXT NOT NULL,
    ack INTEGER NOT NULL,
    timestamp_millis INTEGER NOT NULL,
    chunked INTEGER NOT NULL,
    first_chunk INTEGER NOT NULL,
    last_chunk INTEGER NOT NULL,
    serializer_id INTEGER NOT NULL,
    manifest TEXT NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (producer_id, seq_nr)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS confirmed (
    producer_id TEXT NOT NULL,
    qualifier TEXT NOT NULL,
    seq_nr INTEGER NOT NULL,
    timestamp_millis INTEGER NOT NULL,
    PRIMARY KEY (producer_id, qualifier)
) WITHOUT ROWID;
"""


_INSERT = (
    "INSERT INTO message_sent (producer_id, seq_nr, qualifier, ack, timestamp_millis, chunked,"
    " first_chunk, last_chunk, serializer_id, manifest, data) VALUES "
)
_ROW = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_ROWS_PER_INSERT = 32  # 352 parameters: below even an old SQLite's limit of 999
_INSERT_ONE = _INSERT + _ROW
_INSERT_MANY = _INSERT + ", ".join([_ROW] * _ROWS_PER_INSERT)


def _insert_rows(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
    """Insert ``rows`` (`encode_row`'s), `_ROWS_PER_INSERT` per statement, the rest one by
    one: a multi-row INSERT costs a fifth less per batch than one statement per row, and
    two statements in all keep the connection's statement cache small."""
    whole = len(rows) - len(rows) % _ROWS_PER_INSERT
    for start in range(0, whole, _ROWS_PER_INSERT):
        chunk = rows[start : start + _ROWS_PER_INSERT]
        conn.execute(_INSERT_MANY, [value for row in chunk for value in row])
    if whole < len(rows):
        conn.executemany(_INSERT_ONE, rows[whole:])


@dataclass(frozen=True, slots=True)
class SqliteQueueSettings:
    """Settings of `SqliteDurableQueue`.

    Attributes:
        synchronous: the fsync policy (SQLite's ``PRAGMA synchronous`` in WAL mode):

            * ``"normal"`` (default): a commit is written to the WAL file but not fsynced
              (the WAL is fsynced at checkpoints). Survives a crash or kill of the
              process; a power cut or OS crash may lose the last commits (the file stays
              consistent, rolled back to an earlier commit).
            * ``"full"``: the WAL is fsynced at every commit: a stored message survives a
              power cut too (on a disk that honours fsync). Costs one fsync per store.
            * ``"off"``: never fsyncs. Survives a crash of the process (the OS still holds
              the writes); a power cut or OS crash may lose commits and may corrupt the
              file. For tests and throw-away data.
        busy_timeout: seconds a statement waits while another connection (another
            producer sharing the file) writes. Default 5.0; finite, >= 0.
        lock_timeout: seconds to wait for this producer id's lock when another queue holds
            it (a process shutting down). Default 5.0; finite, >= 0. Past it, opening
            fails with `DurableQueueError`.
        confirm_flush_every: confirmations buffered before they are written (write-behind;
            they are also written with the next store, and by `flush` / `close`).
            1 writes each at once. Default 64; 1 to 1,000,000.
        wal_autocheckpoint: WAL pages after which SQLite copies the WAL into the database
            (SQLite's ``PRAGMA wal_autocheckpoint``). Default 1000 (about 4 MiB); 1 to
            1,000,000.
        journal_size_limit: bytes the WAL file is truncated to after a checkpoint (it
            otherwise keeps its largest size). Default 64 MiB; 0 to 2**40.
    """

    synchronous: str = "normal"
    busy_timeout: float = 5.0
    lock_timeout: float = 5.0
    confirm_flush_every: int = 64
    wal_autocheckpoint: int = 1000
    journal_size_limit: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        check_field_types(self)
        _sqlite.check_synchronous(
            self.synchronous, _SYNCHRONOUS, name="SqliteQueueSettings.synchronous"
        )
        _sqlite.check_seconds("SqliteQueueSettings.busy_timeout", self.busy_timeout)
        _sqlite.check_seconds("SqliteQueueSettings.lock_timeout", self.lock_timeout)
        _check_int("confirm_flush_every", self.confirm_flush_every, 1, _CONFIRM_FLUSH_EVERY_MAX)
        _check_int("wal_autocheckpoint", self.wal_autocheckpoint, 1, 1_000_000)
        _check_int("journal_size_limit", self.journal_size_limit, 0, 2**40)


def _check_int(name: str, value: int, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        msg = f"SqliteQueueSettings.{name} must be an int from {low:,} to {high:,}, got {value!r}"
        raise ValueError(msg)


class SqliteDurableQueue(ConfirmBuffer):
    """A `DurableProducerQueue` in an SQLite file (created if missing), in WAL mode.

    Args:
        path: the database file; ``":memory:"`` for a private in-memory one (not durable,
            not locked: for tests).
        producer_id: whose queue this is; other producer ids in the same file are left
            alone.
        settings: fsync policy, timeouts, write-behind; `SqliteQueueSettings` defaults when
            None.
        serialization: writes and reads the payloads; `default_serialization` when None.
            Give the one the application registered its serializers with. A producer on
            this queue checks each payload with it before numbering it, and refuses one it
            cannot encode (`payload_serialization`).

    Raises:
        DurableQueueError: another queue holds ``producer_id`` in this file, or the file is
            locked, unreadable (not a database, corrupt) or of a newer schema version; the
            message names the file and the fix.
        ValueError: an empty ``producer_id``.

    Thread-safe; meant for one caller (the producer controller).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        producer_id: str,
        settings: SqliteQueueSettings | None = None,
        *,
        serialization: Serialization | None = None,
    ) -> None:
        if not isinstance(producer_id, str) or not producer_id:
            msg = f"producer_id must be a non-empty str, got {producer_id!r}"
            raise ValueError(msg)
        self.settings: SqliteQueueSettings = (
            settings if settings is not None else SqliteQueueSettings()
        )
        self.path = path if path == _sqlite.MEMORY else Path(path)
        self.producer_id = producer_id
        self._serialization = serialization or default_serialization
        self._lock = threading.Lock()
        # What is durable, mirrored in memory (one writer per producer id, so it stays
        # true): the next seq_nr and each qualifier's confirmed seq_nr, buffered ones
        # included.
        self._current_seq_nr = 1
        self._confirmed: dict[str, tuple[int, int]] = {}
        # Confirmations not written yet: qualifier -> (seq_nr, timestamp_millis).
        self._pending: dict[str, tuple[int, int]] = {}
        self._pending_count = 0
        self._file_lock: _sqlite.FileLock | None = None
        self._conn: sqlite3.Connection | None = None
        try:
            self._acquire_producer_lock()
            self._conn = self._open()
        except BaseException:
            self._release()
            raise

    def __repr__(self) -> str:
        return f"SqliteDurableQueue({str(self.path)!r}, {self.producer_id!r})"

    # --- the DurableProducerQueue protocol ----------------------------------------------------

    def payload_serialization(self) -> Serialization:
        """The serializers payloads are stored with (`EncodesPayloads`): a producer
        checks each payload with them before it numbers it."""
        return self._serialization

    def load_state(self) -> DurableProducerState:
        """The stored state, partially stored chunked messages removed (their rows are
        deleted, so the next message reuses their seq_nrs); buffered confirmations are
        written first.

        Raises:
            DurableQueueError: SQLite failed, or a stored payload cannot be read with this
                queue's serialization.
        """
        with self._lock, self._write("load the state") as conn:
            self._write_pending(conn)
            self._cleanup_partial(conn)
            current, highest = self._producer_row(conn)
            rows = conn.execute(
                "SELECT seq_nr, qualifier, ack, timestamp_millis, chunked, first_chunk,"
                " last_chunk, serializer_id, manifest, data FROM message_sent"
                " WHERE producer_id = ? ORDER BY seq_nr",
                (self.producer_id,),
            ).fetchall()
            where = f"durable queue {self.path}"
            unconfirmed = tuple(
                decode_row(self._serialization, row, where, self.producer_id) for row in rows
            )
            confirmed = self._confirmed_rows(conn)
        return self._loaded(current, highest, confirmed, unconfirmed)

    def store_message_sent(self, sent: MessageSent) -> None:
        """Store ``sent`` (with the buffered confirmations) in one transaction; storing again
        the seq_nr stored last changes nothing.

        Raises:
            DurableQueueError: ``sent.seq_nr`` is neither the next seq_nr nor the last one
                stored, its message cannot be serialized, or SQLite failed (nothing stored).
        """
        self.store_messages_sent((sent,))

    def store_messages_sent(self, sents: Sequence[MessageSent]) -> None:
        """Store consecutive messages (with the buffered confirmations) in one transaction:
        all or none. The batch stored last, stored again, changes nothing.

        Raises:
            DurableQueueError: the seq_nrs do not follow the stored ones, a message cannot
                be serialized, or SQLite failed (nothing stored).
        """
        batch = tuple(sents)
        with self._lock:
            self._connection()
            if not check_batch(self._current_seq_nr, batch):
                return
            where = f"durable queue {self.path}"
            rows = [
                encode_row(self._serialization, self.producer_id, sent, where) for sent in batch
            ]
            next_seq_nr = batch[-1].seq_nr + 1
            with self._write(f"store seq_nr {batch[0].seq_nr}..{batch[-1].seq_nr}") as conn:
                self._write_pending(conn)
                _insert_rows(conn, rows)
                conn.execute(
                    "UPDATE producer SET current_seq_nr = ? WHERE producer_id = ?",
                    (next_seq_nr, self.producer_id),
                )
            self._after_commit()
            self._current_seq_nr = next_seq_nr

    def close(self) -> None:
        """Write the buffered confirmations, close the file and release the producer id.
        Calling it again does nothing.

        Raises:
            DurableQueueError: the confirmations could not be written (the queue is closed
                and released all the same; their messages will be sent again).
        """
        with self._lock:
            if self._conn is None:
                return
            try:
                self._flush_pending()
            finally:
                self._release()

    # --- beyond the protocol ------------------------------------------------------------------

    def cleanup(self, qualifiers: Sequence[str]) -> None:
        """Forget the confirmation records of ``qualifiers`` (workers gone): the
        ``confirmed`` rows of this producer id for them are deleted."""
        gone = tuple(qualifiers)
        with self._lock:
            self._connection()
            with self._write("clean up qualifiers") as conn:
                self._write_pending(conn)
                conn.executemany(
                    "DELETE FROM confirmed WHERE producer_id = ? AND qualifier = ?",
                    [(self.producer_id, q) for q in gone],
                )
            self._after_commit()
            for q in gone:
                self._confirmed.pop(q, None)

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._conn is None

    # --- opening ------------------------------------------------------------------------------

    def _acquire_producer_lock(self) -> None:
        if self.path == _sqlite.MEMORY:
            return
        path = Path(self.path)
        digest = hashlib.sha256(self.producer_id.encode()).hexdigest()[:32]
        self._file_lock = _sqlite.take_lock(
            path.parent / f"{path.name}.locks" / f"{digest}.lock",
            timeout=self.settings.lock_timeout,
            label=self.producer_id,
            what=f"durable queue {path}",
            held=f"producer id {self.producer_id!r} is already open",
            fix=(
                "One producer id has one writer: close that queue or stop its process "
                "first, or give this producer another id."
            ),
            error=DurableQueueError,
        )

    def _open(self) -> sqlite3.Connection:
        settings = self.settings
        try:
            conn = _sqlite.connect(self.path, busy_timeout=settings.busy_timeout)
        except sqlite3.Error as error:
            self._fail(error, "open the file")
        try:
            try:
                _sqlite.use_wal(
                    conn, settings.synchronous.upper(), busy_timeout=settings.busy_timeout
                )
                conn.execute(f"PRAGMA wal_autocheckpoint={settings.wal_autocheckpoint}")
                conn.execute(f"PRAGMA journal_size_limit={settings.journal_size_limit}")
                self._prepare(conn)
            except sqlite3.Error as error:
                self._fail(error, "open the file")
        except BaseException:
            conn.close()
            raise
        return conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            _sqlite.create_versioned(
                conn,
                _SCHEMA,
                component=SCHEMA_COMPONENT,
                version=SCHEMA_VERSION,
                what=f"durable queue {self.path}",
                refuse=DurableQueueError,
            )
            conn.execute(
                "INSERT OR IGNORE INTO producer (producer_id, current_seq_nr,"
                " highest_confirmed_seq_nr) VALUES (?, 1, 0)",
                (self.producer_id,),
            )
            # As Akka's queue at start: drop partially stored chunked messages now, so a
            # store before load_state continues from a complete message.
            self._cleanup_partial(conn)
            self._current_seq_nr = self._producer_row(conn)[0]
            self._confirmed = self._confirmed_rows(conn)
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    # --- writing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed on exit, rolled back on error. SQLite errors
        become `DurableQueueError`; after one, the mirror is read again from the file (a
        commit that reported an error may have landed)."""
        conn = self._connection()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error as error:
            self._resync(conn)
            self._fail(error, what)

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        with self._write("store confirmations") as conn:
            self._write_pending(conn)
        self._after_commit()

    def _write_pending(self, conn: sqlite3.Connection) -> None:
        """Write the buffered confirmations and delete the rows they confirm (inside the
        caller's transaction)."""
        producer_id = self.producer_id
        for qualifier, (seq_nr, timestamp_millis) in self._pending.items():
            conn.execute(
                "INSERT INTO confirmed (producer_id, qualifier, seq_nr, timestamp_millis)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (producer_id, qualifier) DO UPDATE SET"
                " seq_nr = excluded.seq_nr, timestamp_millis = excluded.timestamp_millis"
                " WHERE excluded.seq_nr > confirmed.seq_nr",
                (producer_id, qualifier, seq_nr, timestamp_millis),
            )
            conn.execute(
                "DELETE FROM message_sent WHERE producer_id = ? AND seq_nr <= ? AND qualifier = ?",
                (producer_id, seq_nr, qualifier),
            )
            conn.execute(
                "UPDATE producer SET highest_confirmed_seq_nr ="
                " MAX(highest_confirmed_seq_nr, ?) WHERE producer_id = ?",
                (seq_nr, producer_id),
            )

    def _cleanup_partial(self, conn: sqlite3.Connection) -> None:
        """Delete the rows of partially stored chunked messages and move the next seq_nr
        back, as `DurableProducerState.cleanup_partial_chunked_messages` decides (run on
        the flags only: no payload is read)."""
        rows = conn.execute(
            "SELECT seq_nr, first_chunk, last_chunk FROM message_sent"
            " WHERE producer_id = ? AND chunked = 1 AND NOT (first_chunk AND last_chunk)"
            " LIMIT 1",
            (self.producer_id,),
        ).fetchall()
        if not rows:
            return
        current, highest = self._producer_row(conn)
        flags = conn.execute(
            "SELECT seq_nr, chunked, first_chunk, last_chunk FROM message_sent"
            " WHERE producer_id = ? ORDER BY seq_nr",
            (self.producer_id,),
        ).fetchall()
        drops, current = partial_chunk_drops(current, highest, flags)
        dropped = [(self.producer_id, seq_nr) for seq_nr in drops]
        conn.executemany("DELETE FROM message_sent WHERE producer_id = ? AND seq_nr = ?", dropped)
        conn.execute(
            "UPDATE producer SET current_seq_nr = ? WHERE producer_id = ?",
            (current, self.producer_id),
        )
        self._current_seq_nr = current

    # --- reading ------------------------------------------------------------------------------

    def _producer_row(self, conn: sqlite3.Connection) -> tuple[int, int]:
        row = conn.execute(
            "SELECT current_seq_nr, highest_confirmed_seq_nr FROM producer WHERE producer_id = ?",
            (self.producer_id,),
        ).fetchone()
        if row is None:
            msg = (
                f"durable queue {self.path}: the row of producer id {self.producer_id!r} is "
                "gone (the file was changed behind this queue); reopen the queue"
            )
            raise DurableQueueError(msg)
        return int(row[0]), int(row[1])

    def _confirmed_rows(self, conn: sqlite3.Connection) -> dict[str, tuple[int, int]]:
        return {
            qualifier: (int(seq_nr), int(timestamp_millis))
            for qualifier, seq_nr, timestamp_millis in conn.execute(
                "SELECT qualifier, seq_nr, timestamp_millis FROM confirmed WHERE producer_id = ?",
                (self.producer_id,),
            )
        }

    def _resync(self, conn: sqlite3.Connection) -> None:
        # If the file cannot be read now, the next call reports it.
        with contextlib.suppress(sqlite3.Error, DurableQueueError):
            self._current_seq_nr = self._producer_row(conn)[0]

    # --- errors and release -------------------------------------------------------------------

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            msg = f"{self!r} is closed; open the file again with a new SqliteDurableQueue"
            raise DurableQueueError(msg)
        return self._conn

    def _fail(self, error: sqlite3.Error, what: str) -> NoReturn:
        kind = _sqlite.classify(error)
        where = f"durable queue {self.path} (producer id {self.producer_id!r})"
        if kind == "locked":
            msg = (
                f"{where}: cannot {what}, the file is locked by another connection (still "
                f"locked after busy_timeout {self.settings.busy_timeout} s: {error}). Another "
                "process holds it (a coordinator store keeps its file to itself): give this "
                "queue a file of its own, or raise SqliteQueueSettings.busy_timeout."
            )
        elif kind == "unreadable":
            msg = (
                f"{where}: cannot {what}, SQLite cannot read the file ({error}). Restore it "
                "from a backup, or move it away to start with an empty queue (its unconfirmed "
                "messages are then lost)."
            )
        else:
            msg = (
                f"{where}: cannot {what} ({type(error).__name__}: {error}). Check that the "
                "disk has room and the file and its directory are writable."
            )
        raise DurableQueueError(msg) from error

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                conn.close()
        finally:
            if self._file_lock is not None:
                self._file_lock.release()
                self._file_lock = None
