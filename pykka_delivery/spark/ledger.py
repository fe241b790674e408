"""The sink's row ledger: each (producer id, row) applied once, across worker processes.

A Spark task of a write is one producer: it numbers its rows from 0, and a retried task
sends the same rows under the same producer id and numbers. A worker killed before it
confirmed hands its rows to another worker. So a row may reach the workers of a host more
than once; the ledger makes its effect happen once.

How: one SQLite file (WAL mode) shared by every worker process of a host. `apply` runs,
in one ``BEGIN IMMEDIATE`` transaction, the check "was (producer id, row) recorded?", the
record, and the application's effect, written with the same connection into its own tables
of the same file. The effect and its mark commit together or not at all: a worker that
dies in between leaves neither, and the row's next delivery applies it.

Many processes write the file: SQLite's lock lets one transaction write at a time, the
others wait up to ``busy_timeout``.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from pykka_delivery import _sqlite
from pykka_delivery.errors import ClosedError, DeliveryError

__all__ = ["Key", "LedgerBase", "LedgerError", "RowLedger", "SqliteRowLedger", "check_key"]

SCHEMA_COMPONENT = "row_ledger"
SCHEMA_VERSION = 1
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL")

# ``schema_version`` (one row per component), as the durable queue and the dedup store:
# the file also holds the application's tables, which may use ``PRAGMA user_version``.
_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    component TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS row_ledger (
    producer_id TEXT NOT NULL,
    row INTEGER NOT NULL,
    PRIMARY KEY (producer_id, row)
) WITHOUT ROWID
"""

_MARK = "INSERT OR IGNORE INTO row_ledger (producer_id, row) VALUES (?, ?)"

Key = tuple[str, int]
C = TypeVar("C")


class LedgerError(DeliveryError):
    """A row ledger cannot be opened or written; the message names the file (or the
    database), the cause and the fix."""


@runtime_checkable
class RowLedger(Protocol):
    """What a `SinkWorker` needs of a ledger: `SqliteRowLedger` (one file per host) and
    ``PostgresRowLedger`` (ledger_postgres.py: one database for every host)."""

    def apply_many(
        self, items: Sequence[Key], effect: Callable[[Any, list[Key]], None] | None = None
    ) -> list[Key]:
        """Record the new keys and run ``effect(connection, new_keys)`` in the same
        transaction; return the new keys."""
        ...

    def close(self) -> None:
        """Release the ledger."""
        ...


class LedgerBase(ABC, Generic[C]):
    """What `SqliteRowLedger` and ``PostgresRowLedger`` share: the key checks, `apply` as
    a batch of one, and the application's effect run inside the ledger's transaction
    (connections of type ``C``). A subclass records the batch (`_apply`) and says how to
    roll back (`_rollback`) and whether a transaction is open (`_in_transaction`)."""

    def apply(self, producer_id: str, row: int, effect: Callable[[C], None] | None = None) -> bool:
        """Apply row ``row`` of ``producer_id`` once: True if it was new (recorded, and
        ``effect`` ran in the same transaction), False for a duplicate (nothing ran).

        Args:
            producer_id: the producer (Spark task) the row comes from.
            row: the row's number in that producer.
            effect: called with the ledger's connection (sqlite3 or psycopg) inside the
                transaction: write the row's effect with it (no ``COMMIT``, ``ROLLBACK``
                or ``BEGIN``: the ledger commits). An exception rolls back the effect and
                the record, and propagates.

        Raises:
            LedgerError: the transaction failed (nothing was recorded), or ``effect``
                ended the transaction itself.
            ValueError: a bad key.
            ClosedError: the ledger was closed.
        """
        check_key((producer_id, row))

        def run(conn: C, new: list[Key]) -> None:
            if effect is not None:
                effect(conn)

        return bool(self._apply([(producer_id, row)], run))

    def apply_many(
        self, items: Sequence[Key], effect: Callable[[C, list[Key]], None] | None = None
    ) -> list[Key]:
        """Like `apply`, for a batch in one transaction: returns the keys that were new
        (in the order given, each once), and calls ``effect(connection, new_keys)`` with
        them; when none is new, ``effect`` is not called."""
        for key in items:
            check_key(key)
        return self._apply(items, effect)

    def _run_effect(self, conn: C, effect: Callable[[C, list[Key]], None], new: list[Key]) -> None:
        """``effect(conn, new)`` in the open transaction; rolled back if it raises (the
        exception propagates as it is: it is the application's)."""
        try:
            effect(conn, new)
        except BaseException:
            self._rollback(conn)
            raise
        if not self._in_transaction(conn):
            msg = (
                f"{self!r}: the effect ended the ledger's transaction (it must not run "
                f"COMMIT, ROLLBACK or BEGIN, nor call commit()); {len(new)} row(s) may be "
                f"recorded without their effect, or the effect kept without them"
            )
            raise LedgerError(msg)

    @staticmethod
    def _not_committed(new: list[Key]) -> str:
        return f"cannot commit {len(new)} row(s) and their effect (neither was kept)"

    @abstractmethod
    def _apply(
        self, items: Sequence[Key], effect: Callable[[C, list[Key]], None] | None
    ) -> list[Key]:
        """Record the new keys of ``items`` and run ``effect`` with them, in one
        transaction (keys checked already)."""

    @abstractmethod
    def _rollback(self, conn: C) -> None:
        """Roll back the open transaction, if any."""

    @abstractmethod
    def _in_transaction(self, conn: C) -> bool:
        """Whether ``conn``'s transaction is still open."""


_NOT_RECORDED = "cannot record rows (nothing was recorded)"


class SqliteRowLedger(LedgerBase[sqlite3.Connection]):
    """Which (producer id, row) were applied, in an SQLite file shared by processes.

    Args:
        path: the SQLite file (created if missing). It may hold the application's tables.
        busy_timeout: seconds a transaction waits for the other writers of the file.
            Default 30.
        synchronous: SQLite's fsync policy (WAL mode): ``"NORMAL"`` (default) survives a
            process crash, a power cut may lose the last transactions (their rows are then
            applied again, effects included, as the two are lost together); ``"FULL"``
            fsyncs every transaction; ``"OFF"`` never (a power cut may corrupt the file).

    Raises:
        LedgerError: the file is not a database, is corrupt, was written by a newer
            version, or cannot be opened.
        ValueError: a bad setting.

    Thread-safe: a lock serializes the calls of one instance; processes are serialized by
    SQLite's lock.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        busy_timeout: float = 30.0,
        synchronous: str = "NORMAL",
    ) -> None:
        _sqlite.check_seconds("busy_timeout", busy_timeout)
        self._synchronous = _sqlite.check_synchronous(synchronous, _SYNCHRONOUS)
        self.path = Path(path)
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self._reader: sqlite3.Connection | None = None
        self._conn: sqlite3.Connection | None = self._open()

    def __repr__(self) -> str:
        return f"SqliteRowLedger({str(self.path)!r})"

    def _open(self) -> sqlite3.Connection:
        return _sqlite.open_wal(
            self.path,
            busy_timeout=self.busy_timeout,
            synchronous=self._synchronous,
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
            what=f"row ledger {self.path}",
            refuse=LedgerError,
        )

    def _error(self, doing: str, error: sqlite3.Error) -> LedgerError:
        kind = _sqlite.classify(error)
        if kind == "locked":
            fix = (
                f"other workers kept the file busy longer than busy_timeout "
                f"({self.busy_timeout} s): retry, raise busy_timeout, or make the effects "
                f"shorter"
            )
        elif kind == "unreadable":
            fix = (
                "the file is not an SQLite database or is corrupt: restore it from a backup "
                "(without it, rows applied before would be applied again)"
            )
        else:
            fix = "check that the file and its directory are writable and the disk not full"
        return LedgerError(f"row ledger {self.path}: {doing} ({error}); {fix}")

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            msg = f"{self!r} was closed; open the file again with a new SqliteRowLedger"
            raise ClosedError(msg)
        return self._conn

    def _apply(
        self,
        items: Sequence[Key],
        effect: Callable[[sqlite3.Connection, list[Key]], None] | None,
    ) -> list[Key]:
        with self._lock:
            conn = self._connection()
            try:
                conn.execute("BEGIN IMMEDIATE")
                try:
                    new = [key for key in items if conn.execute(_MARK, key).rowcount == 1]
                except BaseException:
                    conn.rollback()
                    raise
            except sqlite3.Error as error:
                raise self._error(_NOT_RECORDED, error) from error
            if not new:
                conn.rollback()
                return new
            if effect is not None:
                self._run_effect(conn, effect, new)
            try:
                conn.commit()
            except sqlite3.Error as error:
                self._rollback(conn)
                raise self._error(self._not_committed(new), error) from error
            return new

    def _rollback(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            conn.rollback()

    def _in_transaction(self, conn: sqlite3.Connection) -> bool:
        return conn.in_transaction

    def seen(self, producer_id: str, row: int) -> bool:
        """True if row ``row`` of ``producer_id`` was applied (by any process)."""
        check_key((producer_id, row))
        with self._lock:
            conn = self._connection()
            try:
                found = conn.execute(
                    "SELECT 1 FROM row_ledger WHERE producer_id = ? AND row = ?",
                    (producer_id, row),
                ).fetchone()
            except sqlite3.Error as error:
                raise self._error("cannot read", error) from error
            return found is not None

    def count(self) -> int:
        """How many rows were applied (by every process)."""
        with self._lock:
            conn = self._connection()
            try:
                count: int = conn.execute("SELECT COUNT(*) FROM row_ledger").fetchone()[0]
            except sqlite3.Error as error:
                raise self._error("cannot read", error) from error
            return count

    def connection(self) -> sqlite3.Connection:
        """A second connection to the file, for reading the application's tables from any
        thread: it sees committed transactions only, never one `apply` is running.
        Autocommit mode; closed by `close`. Write effects in ``effect``, not with it."""
        with self._lock:
            self._connection()
            if self._reader is None:
                try:
                    self._reader = _sqlite.connect(self.path, busy_timeout=self.busy_timeout)
                except sqlite3.Error as error:
                    raise self._error("cannot open a reading connection", error) from error
            return self._reader

    def close(self) -> None:
        """Release the file; later calls raise `ClosedError`. A second close does nothing."""
        with self._lock:
            conn, self._conn = self._conn, None
            reader, self._reader = self._reader, None
            for c in (reader, conn):
                if c is not None:
                    c.close()


def check_key(key: Key) -> None:
    """Raise `ValueError` naming ``key`` unless it is (non-empty str, int >= 0)."""
    match key:
        case (str() as producer_id, int() as row) if producer_id and row >= 0:
            if type(row) is int:
                return
    msg = f"a row key must be (producer id: non-empty str, row: int >= 0), got {key!r}"
    raise ValueError(msg)
