"""`PostgresRowLedger`: the sink's row ledger in PostgreSQL (the ``[postgres]`` extra), the
twin of `SqliteRowLedger` (ledger.py) for workers on several hosts: the rows of a retried
Spark task are recognised whichever host's worker receives them.

How: `apply_many` runs, in one transaction on one connection, the insertion of the rows'
marks (``INSERT ... ON CONFLICT DO NOTHING RETURNING``: the rows returned are the new ones)
and the application's effect, written with the same psycopg connection into its own tables
of the same database. The effect and its marks commit together or not at all.

Why each row is applied once with workers racing: under read committed, a transaction
inserting a mark another open transaction inserted waits for it; if that one commits, the
row is not new here (nothing applied), if it rolls back, the row is new here. Marks are
inserted in key order, so two batches overlapping in any order cannot deadlock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from pykka_delivery import _postgres
from pykka_delivery._sqlite import check_seconds
from pykka_delivery.errors import ClosedError
from pykka_delivery.spark.ledger import _NOT_RECORDED, Key, LedgerBase, LedgerError, check_key

__all__ = ["PostgresRowLedger"]

SCHEMA_COMPONENT = "row_ledger"
SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS row_ledger (
    producer_id TEXT NOT NULL,
    row BIGINT NOT NULL,
    PRIMARY KEY (producer_id, row)
)
"""

_MARK = (
    "INSERT INTO row_ledger (producer_id, row)"
    " SELECT p, r FROM unnest(%s::text[], %s::bigint[]) AS k (p, r) ORDER BY p, r"
    " ON CONFLICT DO NOTHING RETURNING producer_id, row"
)


class PostgresRowLedger(LedgerBase[_postgres.Connection]):
    """Which (producer id, row) were applied, in a PostgreSQL database shared by the
    workers of every host.

    Args:
        source: a ``postgresql://`` URL (the ledger opens a pool of its own, closed with
            it), a `psycopg_pool.ConnectionPool` shared with the application, or a
            `psycopg.Connection` the ledger then uses alone (neither is closed by
            `close`).
        pool_max_size: connections of the pool opened for a URL: one per concurrent
            `apply_many` (a worker applies one message per producer at a time), and one
            for `connection`. Default 4; 1 to 1,000.
        connect_timeout: seconds to wait for a connection. Default 10; finite, >= 0.

    Raises:
        LedgerError: the server cannot be reached, or the database holds a newer schema
            version.
        ValueError: a bad setting, or a source that is none of the above.

    Thread-safe: with a pool, calls run at once on their own connections; with one
    connection, one at a time.
    """

    def __init__(
        self, source: Any, *, pool_max_size: int = 4, connect_timeout: float = 10.0
    ) -> None:
        if type(pool_max_size) is not int or not 1 <= pool_max_size <= 1_000:
            msg = f"pool_max_size must be an int from 1 to 1000, got {pool_max_size!r}"
            raise ValueError(msg)
        check_seconds("connect_timeout", connect_timeout)
        self._closed = False
        self._reader: _postgres.Connection | None = None
        self._reader_lock = threading.Lock()
        self._source = _postgres.open_source(
            source,
            what="PostgresRowLedger",
            max_size=pool_max_size,
            connect_timeout=connect_timeout,
            error=LedgerError,
        )
        self.name = self._source.name
        # A lone connection serves one call at a time; a pool lends one per call.
        self._lock = threading.Lock() if not self._source.lends_more else None
        try:
            with self._borrowed() as conn, conn.transaction():
                _postgres.create_versioned(
                    conn,
                    SCHEMA,
                    component=SCHEMA_COMPONENT,
                    version=SCHEMA_VERSION,
                    what=f"row ledger {self.name}",
                    refuse=LedgerError,
                )
        except _postgres.Error as error:
            self._closed = True
            self._source.close()
            raise self._error("cannot be opened", error) from error
        except BaseException:
            self._closed = True
            self._source.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresRowLedger({self.name!r})"

    def _apply(
        self,
        items: Sequence[Key],
        effect: Callable[[_postgres.Connection, list[Key]], None] | None,
    ) -> list[Key]:
        with self._borrowed() as conn:
            try:
                conn.execute("BEGIN")
                inserted = conn.execute(
                    _MARK, ([p for p, _ in items], [r for _, r in items])
                ).fetchall()
            except BaseException as error:
                self._rollback(conn)
                if isinstance(error, _postgres.Error):
                    raise self._error(_NOT_RECORDED, error) from error
                raise
            fresh = {(p, int(r)) for p, r in inserted}
            new = [key for key in dict.fromkeys(items) if key in fresh]
            if not new:
                self._rollback(conn)
                return new
            if effect is not None:
                self._run_effect(conn, effect, new)
            try:
                conn.execute("COMMIT")
            except _postgres.Error as error:
                self._rollback(conn)
                raise self._error(self._not_committed(new), error) from error
            return new

    def _in_transaction(self, conn: _postgres.Connection) -> bool:
        return _postgres.in_transaction(conn)  # the source's connections are autocommit

    def seen(self, producer_id: str, row: int) -> bool:
        """True if row ``row`` of ``producer_id`` was applied (by any worker)."""
        check_key((producer_id, row))
        found = self._read_one(
            "SELECT 1 FROM row_ledger WHERE producer_id = %s AND row = %s", (producer_id, row)
        )
        return found is not None

    def count(self) -> int:
        """How many rows were applied (by every worker)."""
        found = self._read_one("SELECT COUNT(*) FROM row_ledger", ())
        return int(found[0]) if found is not None else 0

    def _read_one(self, query: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        with self._borrowed() as conn:
            try:
                return conn.execute(query, params).fetchone()
            except _postgres.Error as error:
                raise self._error("cannot read", error) from error

    def connection(self) -> _postgres.Connection:
        """A connection of the ledger's pool kept for reading the application's tables
        from any thread (autocommit; closed by `close`). Write effects in ``effect``, not
        with it.

        Raises:
            LedgerError: the ledger was given one connection (use your own for reading).
        """
        if not self._source.lends_more:
            msg = (
                f"{self!r} was given one psycopg connection, which it uses alone: read the "
                f"application's tables with a connection of your own"
            )
            raise LedgerError(msg)
        with self._reader_lock:
            if self._closed:
                raise ClosedError(self._closed_message())
            if self._reader is None:
                try:
                    self._reader = self._source.getconn()
                except Exception as error:
                    raise self._error("cannot open a reading connection", error) from error
            return self._reader

    def close(self) -> None:
        """Release the connections (and the pool, if the ledger opened it); later calls
        raise `ClosedError`. A second close does nothing."""
        with self._reader_lock:
            if self._closed:
                return
            self._closed = True
            reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):
                self._source.putconn(reader)
        self._source.close()

    @contextlib.contextmanager
    def _borrowed(self) -> Iterator[_postgres.Connection]:
        """A connection of the source for one call (the only one, under a lock, when the
        ledger was given one connection)."""
        if self._closed:
            raise ClosedError(self._closed_message())
        with self._lock if self._lock is not None else contextlib.nullcontext():
            try:
                conn = self._source.getconn()
            except Exception as error:
                raise self._error("cannot take a connection", error) from error
            try:
                yield conn
            finally:
                self._source.putconn(conn)

    def _rollback(self, conn: _postgres.Connection) -> None:
        with contextlib.suppress(_postgres.Error):  # a broken connection ended it
            conn.execute("ROLLBACK")

    def _closed_message(self) -> str:
        return f"{self!r} was closed; open the database again with a new PostgresRowLedger"

    def _error(self, doing: str, error: BaseException) -> LedgerError:
        if _postgres.classify(error) == "transient":
            fix = (
                "PostgreSQL was unreachable or busy, or two batches conflicted: the message "
                "is handed over again"
            )
        else:
            fix = "check the database's permissions and that its row_ledger table is ours"
        return LedgerError(f"row ledger {self.name}: {doing} ({error}); {fix}")
