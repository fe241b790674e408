"""The streaming source's durable partition log: one SQLite file per (stream, partition).

Theory of operation:

* The source's consumer of a partition (a `GroupMember` handler, in one long-lived
  Spark-side process) `stage`\\ s each message it receives; the log keeps it in memory,
  with position 0, and marks its (producer id, seq_nr) as the partition's pending
  deduplication position.
* `flush` commits, in one transaction, the staged records, numbered on from the last
  committed position (1, 2, ...), and the pending positions. So a record is never
  durable without its position, and a position never without its record: after a crash
  the consumer's store (`dedup_store`) skips exactly what the log holds, and the producer
  resends the rest.
* The consumer controller flushes its deduplication store, that is the log, before any
  `Request` or `Ack` leaves (actors/dedup.py): what the producer side forgets is in the
  log. Spark's ``latestOffset()`` flushes too, then reads `end`.
* Executors (other processes) read committed ranges with `read_log`, over a read-only
  connection: WAL mode lets them read while the writer writes.
* Spark's ``commit(end)`` calls `trim`: the records up to ``end`` are deleted. Positions
  are never reused: the last one given is kept in the file, apart from the records.

One writer per file: an OS lock on ``<path>.lock`` (released by the kernel when its holder
dies, so a restarted process finds it free at once). Readers take no lock.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from pykka_delivery import _sqlite
from pykka_delivery._fields import check_field_types
from pykka_delivery.delivery.stores.dedup import DedupStore, DedupStoreError
from pykka_delivery.errors import ClosedError, DeliveryError

__all__ = [
    "LogError",
    "LogRecord",
    "PartitionLog",
    "PartitionLogSettings",
    "read_log",
]

_SCHEMA_VERSION = 1
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL")

# ``log_meta.last``: the highest position ever committed. Kept apart from the records, so
# that trimming every record does not let a position be given twice.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS log_meta (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    stream TEXT NOT NULL,
    partition INTEGER NOT NULL,
    trimmed INTEGER NOT NULL,
    last INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS log_record (
    position INTEGER PRIMARY KEY,
    producer_id TEXT NOT NULL,
    seq_nr INTEGER NOT NULL,
    key TEXT,
    payload BLOB NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    headers TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS log_position (
    producer_id TEXT PRIMARY KEY,
    seq_nr INTEGER NOT NULL
)
"""

_INSERT_RECORD = (
    "INSERT INTO log_record (position, producer_id, seq_nr, key, payload, timestamp_ms, "
    "headers) VALUES (?, ?, ?, ?, ?, ?, ?)"
)
_UPSERT_POSITION = (
    "INSERT INTO log_position (producer_id, seq_nr) VALUES (?, ?) "
    "ON CONFLICT (producer_id) DO UPDATE SET seq_nr = excluded.seq_nr"
)

# A staged record: producer_id, seq_nr, key, payload, timestamp_ms, headers (JSON).
_Staged = tuple[str, int, str | None, bytes, int, str]


class LogError(DeliveryError):
    """A partition log cannot be opened, written or read; the message names the file, the
    cause and the fix."""


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One message of a partition, as the log keeps it.

    Attributes:
        position: its place in the log (1, 2, ...; never reused), 0 while staged.
        stream: the stream's name.
        partition: the partition it came from.
        producer_id: the producer stream it belongs to (see `GroupDelivery`).
        seq_nr: its number in that producer stream.
        key: its key as text, or None for an unkeyed message.
        payload: the message, serialized.
        timestamp_ms: when it was staged (wall clock, milliseconds since the epoch).
        headers: text metadata.
    """

    position: int
    stream: str
    partition: int
    producer_id: str
    seq_nr: int
    key: str | None
    payload: bytes
    timestamp_ms: int
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class PartitionLogSettings:
    """Settings of a `PartitionLog`.

    Attributes:
        synchronous: SQLite's fsync policy (``PRAGMA synchronous``, WAL mode): ``"NORMAL"``
            (default) survives a crash of the process, a power cut may lose the last
            flushes (their messages are then received again: their positions are lost with
            them); ``"FULL"`` fsyncs every flush, surviving a power cut too; ``"OFF"``
            never fsyncs (a power cut may corrupt the file).
        busy_timeout: seconds a statement waits while a reader holds the file in a way
            that blocks it (a WAL checkpoint, rarely). Default 10.
        max_staged: at most this many records are staged in memory; `stage` flushes first
            when there are this many (bounded memory). Default 100 000.
        lock_timeout: seconds to wait for another writer of the same file to close it
            before giving up. Default 5.
    """

    synchronous: str = "NORMAL"
    busy_timeout: float = 10.0
    max_staged: int = 100_000
    lock_timeout: float = 5.0

    def __post_init__(self) -> None:
        check_field_types(self)
        _sqlite.check_synchronous(self.synchronous, _SYNCHRONOUS)
        _sqlite.check_seconds("busy_timeout", self.busy_timeout)
        _sqlite.check_seconds("lock_timeout", self.lock_timeout)
        if type(self.max_staged) is not int or self.max_staged < 1:
            msg = f"max_staged must be a number of records >= 1, got {self.max_staged!r}"
            raise ValueError(msg)


def _error(path: object, doing: str, error: sqlite3.Error, busy_timeout: float) -> LogError:
    kind = _sqlite.classify(error)
    if kind == "locked":
        fix = (
            f"another connection kept the file busy longer than busy_timeout ({busy_timeout} "
            f"s): retry, or raise busy_timeout"
        )
    elif kind == "unreadable":
        fix = (
            "the file is not an SQLite database or is corrupt: move it away and restart the "
            "query from a fresh checkpoint (its messages are lost with the file)"
        )
    else:
        fix = "check that the file exists, that it and its directory are writable, and the disk"
    return LogError(f"partition log {path}: {doing} ({error}); {fix}")


class PartitionLog:
    """The durable log of one (stream, partition): the module docstring says how it works.

    Args:
        path: the SQLite file (created if missing, with its directory).
        stream: the stream's name.
        partition: the partition's number.
        settings: see `PartitionLogSettings`.
        clock: the wall clock, seconds since the epoch (records' timestamps).

    Raises:
        LogError: another writer holds the file, it belongs to another (stream, partition),
            it is not a database or is corrupt, it was written by a newer version, or it
            cannot be opened.
        ValueError: an empty stream name or a negative partition.

    Thread-safe: the consumer's thread stages and flushes while Spark's thread flushes.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        stream: str,
        partition: int,
        settings: PartitionLogSettings | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not isinstance(stream, str) or not stream:
            msg = f"stream must be a non-empty string, got {stream!r}"
            raise ValueError(msg)
        if type(partition) is not int or partition < 0:
            msg = f"partition must be an int >= 0, got {partition!r}"
            raise ValueError(msg)
        self.settings = settings = settings or PartitionLogSettings()
        self.path = Path(path)
        self.stream = stream
        self.partition = partition
        self._clock = clock
        self._lock = threading.Lock()
        self._staged: list[_Staged] = []
        self._pending: dict[str, int] = {}
        self._file_lock = self._take_file()
        try:
            self._conn: sqlite3.Connection | None = self._open()
        except BaseException:
            self._file_lock.release()
            raise

    def __repr__(self) -> str:
        return f"PartitionLog({str(self.path)!r}, {self.stream!r}, {self.partition})"

    def _take_file(self) -> _sqlite.FileLock:
        return _sqlite.take_lock(
            self.path.with_name(self.path.name + ".lock"),
            timeout=self.settings.lock_timeout,
            label=f"partition log {self.stream}-{self.partition}",
            what=f"partition log {self.path}",
            held="another query or process uses this log directory",
            fix=(
                "Give each query its own log_dir, or stop the other one first: two writers "
                "would give the same positions twice."
            ),
            error=LogError,
        )

    def _open(self) -> sqlite3.Connection:
        return _sqlite.open_wal(
            self.path,
            busy_timeout=self.settings.busy_timeout,
            synchronous=self.settings.synchronous.upper(),
            prepare=self._prepare,
            error=lambda error: self._error("cannot be opened", error),
        )

    def _check_version(self, conn: sqlite3.Connection) -> None:
        version: int = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > _SCHEMA_VERSION:
            what = f"partition log {self.path}"
            raise LogError(_sqlite.newer_schema_message(what, version, _SCHEMA_VERSION))

    def _prepare(self, conn: sqlite3.Connection) -> None:
        """Create the tables and the meta row, or check that the file is this partition's,
        and read where the log starts and ends."""
        self._check_version(conn)
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            for statement in _SCHEMA.split(";"):  # executescript would commit
                if statement.strip():
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
            row = conn.execute(
                "SELECT stream, partition, trimmed, last FROM log_meta WHERE id = 1"
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO log_meta (id, stream, partition, trimmed, last) "
                    "VALUES (1, ?, ?, 0, 0)",
                    (self.stream, self.partition),
                )
                row = (self.stream, self.partition, 0, 0)
        if (row[0], row[1]) != (self.stream, self.partition):
            msg = (
                f"partition log {self.path} holds stream {row[0]!r} partition {row[1]}, not "
                f"stream {self.stream!r} partition {self.partition}: give each (stream, "
                f"partition) a file of its own"
            )
            raise LogError(msg)
        self._trimmed: int = row[2]
        self._last: int = row[3]

    def _error(self, doing: str, error: sqlite3.Error) -> LogError:
        return _error(self.path, doing, error, self.settings.busy_timeout)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            msg = f"{self!r} was closed; open the file again with a new PartitionLog"
            raise ClosedError(msg)
        return self._conn

    def stage(
        self,
        producer_id: str,
        seq_nr: int,
        key: str | None,
        payload: bytes,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Keep a received message in memory until the next `flush`, and make
        ``seq_nr`` the pending position of ``producer_id``.

        Raises:
            ValueError: an empty producer id, a seq_nr below 1, a key that is not text,
                a payload that is not bytes, or headers that are not text to text.
            LogError: there were ``max_staged`` records already and flushing them failed
                (they stay staged; nothing of this call is kept).
            ClosedError: the log was closed.
        """
        staged = self._check_record(producer_id, seq_nr, key, payload, headers)
        with self._lock:
            self._connection()
            if len(self._staged) >= self.settings.max_staged:
                self._flush()
            self._staged.append(staged)
            self._pending[producer_id] = seq_nr

    def _check_record(
        self,
        producer_id: str,
        seq_nr: int,
        key: str | None,
        payload: bytes,
        headers: Mapping[str, str] | None,
    ) -> _Staged:
        problem = None
        if not isinstance(producer_id, str) or not producer_id:
            problem = f"producer_id must be a non-empty string, got {producer_id!r}"
        elif type(seq_nr) is not int or seq_nr < 1:
            problem = f"seq_nr must be an int >= 1, got {seq_nr!r}"
        elif key is not None and not isinstance(key, str):
            problem = f"key must be text or None, got {type(key).__name__} (decode it first)"
        elif not isinstance(payload, bytes | bytearray | memoryview):
            problem = f"payload must be bytes, got {type(payload).__name__} (serialize it first)"
        elif headers is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            problem = f"headers must map text to text, got {headers!r}"
        if problem is not None:
            raise ValueError(f"{self!r}: cannot stage a record: {problem}")
        encoded = json.dumps(dict(headers or {}), sort_keys=True, separators=(",", ":"))
        timestamp_ms = int(self._clock() * 1000)
        return (producer_id, seq_nr, key, bytes(payload), timestamp_ms, encoded)

    def dedup_store(self) -> DedupStore:
        """A deduplication store whose positions live in this log's file: give it to the
        partition's consumer, so that a record and its position are committed together.

        Its ``close`` flushes the log and closes only the store object, not the log.
        """
        return _LogDedupStore(self)

    def flush(self) -> None:
        """Commit the staged records (positions given in order) and the pending positions,
        in one transaction.

        Raises:
            LogError: the commit failed; everything stays staged, to be retried.
            ClosedError: the log was closed.
        """
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        conn = self._connection()
        staged, pending = self._staged, self._pending
        if not staged and not pending:
            return
        first = self._last + 1
        last = self._last + len(staged)
        try:
            with conn:  # one transaction: all or none
                conn.execute("BEGIN IMMEDIATE")
                conn.executemany(_INSERT_RECORD, [(first + i, *r) for i, r in enumerate(staged)])
                conn.executemany(_UPSERT_POSITION, list(pending.items()))
                conn.execute("UPDATE log_meta SET last = ? WHERE id = 1", (last,))
        except sqlite3.Error as error:
            doing = (
                f"cannot commit {len(staged)} record(s) (kept staged, retried at the next flush)"
            )
            raise self._error(doing, error) from error
        self._last = last
        staged.clear()
        pending.clear()

    def end(self) -> int:
        """The highest committed position, 0 when none was ever committed (trimming does
        not lower it)."""
        with self._lock:
            self._connection()
            return self._last

    def start(self) -> int:
        """The position the log was trimmed up to: it keeps the records after it."""
        with self._lock:
            self._connection()
            return self._trimmed

    def trim(self, upto: int) -> int:
        """Delete the committed records at positions up to ``upto``; returns how many.

        Raises:
            ValueError: ``upto`` is negative or beyond `end`.
            LogError: the delete failed (nothing was deleted).
            ClosedError: the log was closed.
        """
        with self._lock:
            self._connection()
            if type(upto) is not int or not 0 <= upto <= self._last:
                msg = (
                    f"{self!r}: cannot trim up to {upto!r}: give a position from 0 to the "
                    f"log's end ({self._last})"
                )
                raise ValueError(msg)
            if upto <= self._trimmed:
                return 0
            conn = self._connection()
            try:
                with conn:
                    conn.execute("BEGIN IMMEDIATE")
                    count = conn.execute(
                        "DELETE FROM log_record WHERE position <= ?", (upto,)
                    ).rowcount
                    conn.execute("UPDATE log_meta SET trimmed = ? WHERE id = 1", (upto,))
            except sqlite3.Error as error:
                raise self._error(f"cannot trim up to {upto}", error) from error
            self._trimmed = upto
            return int(count)

    def close(self) -> None:
        """Flush, then release the file. If the flush fails, the log stays open (close
        again to retry) and `LogError` is raised. A second close does nothing."""
        with self._lock:
            if self._conn is None:
                return
            self._flush()
            self._conn.close()
            self._conn = None
            self._file_lock.release()

    # The deduplication store's side (`_LogDedupStore`).

    def _load_positions(self) -> dict[str, int]:
        with self._lock:
            conn = self._connection()
            try:
                rows = conn.execute("SELECT producer_id, seq_nr FROM log_position").fetchall()
            except sqlite3.Error as error:
                raise self._error("cannot load positions", error) from error
            positions = {producer_id: seq_nr for producer_id, seq_nr in rows}
            positions.update(self._pending)
            return positions

    def _record_position(self, producer_id: str, seq_nr: int) -> None:
        with self._lock:
            self._connection()
            self._pending[producer_id] = seq_nr


class _LogDedupStore:
    """The `DedupStore` of a `PartitionLog`: its positions are the log's."""

    def __init__(self, log: PartitionLog) -> None:
        self._log = log
        self._closed = False

    def __repr__(self) -> str:
        return f"{self._log!r}.dedup_store()"

    def _check_open(self) -> None:
        if self._closed:
            msg = f"{self!r} was closed; take a new one from the log"
            raise ClosedError(msg)

    def load(self) -> dict[str, int]:
        self._check_open()
        try:
            return self._log._load_positions()
        except LogError as error:
            raise DedupStoreError(str(error)) from error

    def record(self, producer_id: str, seq_nr: int) -> None:
        if type(seq_nr) is not int or seq_nr < 0:
            msg = f"seq_nr of producer {producer_id!r} must be an int >= 0, got {seq_nr!r}"
            raise ValueError(msg)
        self._check_open()
        self._log._record_position(producer_id, seq_nr)

    def flush(self) -> None:
        self._check_open()
        try:
            self._log.flush()
        except LogError as error:
            raise DedupStoreError(str(error)) from error

    def close(self) -> None:
        if self._closed:
            return
        if self._log._conn is not None:  # a closed log flushed when it closed
            self.flush()
        self._closed = True


def read_log(
    path: str | os.PathLike[str], start: int, end: int, *, busy_timeout: float = 10.0
) -> list[LogRecord]:
    """The committed records at positions ``start < position <= end``, in order, read over
    a read-only connection (any process, while the writer works).

    Args:
        path: the log's file.
        start: the position before the first one wanted (the range's exclusive start).
        end: the last position wanted, at most the log's end.
        busy_timeout: seconds to wait if the writer holds the file in a way that blocks
            readers (rare in WAL mode).

    Raises:
        ValueError: a range that is not ``0 <= start <= end``, that starts before what
            was trimmed already, or that ends beyond the log's end.
        LogError: the file is missing, unreadable, or not a partition log.
    """
    _sqlite.check_seconds("busy_timeout", busy_timeout)
    if type(start) is not int or type(end) is not int or not 0 <= start <= end:
        msg = f"partition log {path}: cannot read ({start!r}, {end!r}]: give 0 <= start <= end"
        raise ValueError(msg)
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=busy_timeout, isolation_level=None)
    except sqlite3.Error as error:
        raise _error(path, "cannot be opened to read", error, busy_timeout) from error
    try:
        with conn:  # one read transaction: the range check and the rows agree
            conn.execute("BEGIN")
            version: int = conn.execute("PRAGMA user_version").fetchone()[0]
            if version > _SCHEMA_VERSION:
                what = f"partition log {path}"
                raise LogError(_sqlite.newer_schema_message(what, version, _SCHEMA_VERSION))
            meta = conn.execute(
                "SELECT stream, partition, trimmed, last FROM log_meta WHERE id = 1"
            ).fetchone()
            if meta is None:
                msg = f"partition log {path}: not a partition log (no meta row); check the path"
                raise LogError(msg)
            stream, partition, trimmed, last = meta
            _check_range(path, start, end, trimmed, last)
            rows = conn.execute(
                "SELECT position, producer_id, seq_nr, key, payload, timestamp_ms, headers "
                "FROM log_record WHERE position > ? AND position <= ? ORDER BY position",
                (start, end),
            ).fetchall()
    except sqlite3.Error as error:
        raise _error(path, "cannot be read", error, busy_timeout) from error
    finally:
        conn.close()
    return [
        LogRecord(pos, stream, partition, pid, seq_nr, key, payload, ts, json.loads(headers))
        for pos, pid, seq_nr, key, payload, ts, headers in rows
    ]


def _check_range(path: object, start: int, end: int, trimmed: int, last: int) -> None:
    if end > last:
        msg = (
            f"partition log {path}: cannot read ({start}, {end}]: the log ends at {last} "
            f"(read only offsets the source reported)"
        )
        raise ValueError(msg)
    if start < trimmed and start < end:
        msg = (
            f"partition log {path}: cannot read ({start}, {end}]: positions up to {trimmed} "
            f"were trimmed already (Spark committed them). The query's checkpoint is behind "
            f"its log: another query may share this log_dir (give each its own), or restart "
            f"the query from a fresh checkpoint and log_dir"
        )
        raise ValueError(msg)
