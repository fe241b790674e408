"""The coordinator's command log and snapshots in PostgreSQL (the ``[postgres]`` extra).

Same contract, encoding and compaction as `SqliteCommandLog` (`store.replay_stored`,
`store.snapshot_body`); rows are keyed by the log's ``name`` so several coordinators'
logs share one database (tables ``coordinator_*``, `store_postgres_sql`).

Who may write, in one of two ways, never both on one name:

* without a lease, one coordinator: the log holds a session advisory lock on its name for
  its life (a second opener waits ``lock_timeout`` and is refused), and raises a writer
  epoch at open; every append checks that epoch, so a log that lost its connection (and
  the lock with it) while another opened the name can never write again;
* with a `PostgresLease`, several coordinators, one leading: every `append_all` locks the
  lease row ``FOR SHARE`` in its transaction and writes nothing, raising `LogFencedError`,
  unless the row still carries the lease object's epoch and has not expired by the
  database's clock. A take-over updates that row, so it waits for an append in flight, and
  an append waits for a take-over in flight: an append either commits before the new
  leader can read the log, or is refused. Never lost, never written behind a new leader.

A connection lost during an append is replaced and the append retried once; first the
log checks whether the lost commit landed (rows carry the epoch they were written under),
so a command is never stored twice.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import NoReturn, TypeVar

from pykka_delivery import _postgres
from pykka_delivery._sqlite import check_seconds
from pykka_delivery.coordinator import store_postgres_sql as sql
from pykka_delivery.coordinator.commands import Command
from pykka_delivery.coordinator.lease_postgres import PostgresLease
from pykka_delivery.coordinator.state import CoordinatorState
from pykka_delivery.coordinator.store import (
    DEFAULT_SNAPSHOT_EVERY,
    CommandLogError,
    LogFencedError,
    check_snapshot_every,
    encode_command,
    replay_stored,
    snapshot_body,
)
from pykka_delivery.errors import ClosedError

__all__ = ["DEFAULT_LOCK_TIMEOUT", "PostgresCommandLog"]

logger = logging.getLogger("pykka_delivery.coordinator.store_postgres")

DEFAULT_LOCK_TIMEOUT = 5.0
"""Default seconds a log without a lease waits for its name while another log holds it."""

DEFAULT_CONNECT_TIMEOUT = 10.0
"""Default seconds to wait for a connection."""

DEFAULT_POOL_MAX_SIZE = 2
"""Default connections of the pool a log opens for a URL (one held, one to replace it)."""

T = TypeVar("T")


class PostgresCommandLog:
    """A `CommandLog` in a PostgreSQL database (tables created if missing).

    Args:
        source: a ``postgresql://`` URL (a small pool of the log's own, closed with it), a
            `psycopg_pool.ConnectionPool` or a `psycopg.Connection` (left open by `close`).
        name: which log of the database this is (several coordinators' logs share one).
        lease: None for a single coordinator (the log holds its name alone); a
            `PostgresLease` of the same ``name`` in the same database for coordinators
            taking turns: appends are then fenced by it (module docstring). The log does
            not acquire, renew or close the lease: its owner does.
        snapshot_every: after this many appended commands, write a snapshot and delete the
            commands it covers. Default `DEFAULT_SNAPSHOT_EVERY` (1000).
        lock_timeout: without a lease, seconds to wait for a name another log holds.
            Default `DEFAULT_LOCK_TIMEOUT` (5).
        connect_timeout: seconds to wait for a connection. Default 10.
        pool_max_size: connections of the pool opened for a URL. Default 2.

    Raises:
        CommandLogError: the server cannot be reached, the database holds a newer schema
            version, or (without a lease) another log holds ``name``.
        ValueError: a setting is out of range, or the lease is for another name.
    """

    def __init__(
        self,
        source: str | _postgres.ConnectionPool | _postgres.Connection,
        *,
        name: str = "default",
        lease: PostgresLease | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        pool_max_size: int = DEFAULT_POOL_MAX_SIZE,
    ) -> None:
        _check(name, lease, pool_max_size)
        check_snapshot_every(snapshot_every)
        check_seconds("lock_timeout", lock_timeout)
        check_seconds("connect_timeout", connect_timeout)
        self.name = name
        self.lease = lease
        self._snapshot_every = snapshot_every
        self._lock_timeout = lock_timeout
        self._lock = threading.Lock()
        self._writer_epoch = 0
        self._since_snapshot = 0
        self._last_written = 0  # the highest seq this object wrote
        self._closed = False
        opened = _postgres.open_source(
            source,
            what="PostgresCommandLog source",
            max_size=pool_max_size,
            connect_timeout=connect_timeout,
            error=CommandLogError,
        )
        self.where = f"coordinator store {name!r} in {opened.name}"
        # Without a lease, the connection holds the name's advisory lock.
        self._session = _postgres.LockedSession(
            opened,
            None if lease is not None else _postgres.advisory_key(sql.LOCK_NAMESPACE, name),
            lock_timeout=lock_timeout,
            held=self._held,
            fail=self._fail,
            lock_name="the log's lock",
        )
        try:
            self._open(self._session.connection())
        except BaseException:
            self._release()
            raise

    def __repr__(self) -> str:
        return f"PostgresCommandLog({self._session.source.name!r}, name={self.name!r})"

    # --- the CommandLog protocol --------------------------------------------------------------

    def load(self) -> CoordinatorState:
        """The state the stored snapshot and commands lead to, read in one snapshot of the
        database (a concurrent compaction never shows half)."""
        with self._lock:
            state, _, count = self._attempt("load the log", self._load)
            self._since_snapshot = count
            return state

    def append(self, command: Command) -> None:
        self.append_all((command,))

    def append_all(
        self, commands: Sequence[Command], state: CoordinatorState | None = None
    ) -> None:
        """Store ``commands`` in one transaction, all or none (``state``: see
        `CommandLog.append_all`).

        Raises:
            LogFencedError: with a lease: another coordinator leads now, or this one's
                lease expired (by the database's clock, or by `PostgresLease.valid_until`
                locally); without: another log opened this name since. Nothing stored.
            CommandLogError: PostgreSQL failed twice, or permanently (nothing stored).
            ClosedError: the log was closed.
        """
        if not commands:
            return
        rows = json.dumps([encode_command(command) for command in commands])
        with self._lock:
            self._connection()  # raises ClosedError first
            epoch = self._epoch_to_write()

            params = {"name": self.name, "epoch": epoch, "rows": rows}
            statement = sql.APPEND_ALONE if self.lease is None else sql.APPEND_LEASED

            def write(conn: _postgres.Connection) -> int:
                row = conn.execute(statement, params).fetchone()
                assert row is not None  # a SELECT of three scalars
                if row[2] is None:
                    self._refuse(row[0], row[1], epoch)
                return int(row[2])

            def landed(conn: _postgres.Connection) -> int | None:
                row = conn.execute(sql.LAST_SEQ_OF_EPOCH, (self.name, epoch)).fetchone()
                last = None if row is None or row[0] is None else int(row[0])
                return last if last is not None and last > self._last_written else None

            what = f"append {len(commands)} command(s)"
            self._last_written = self._attempt(what, write, landed)
            self._since_snapshot += len(commands)
            if self._since_snapshot >= self._snapshot_every:
                # The commands are committed: a failed compaction must not report them as
                # not stored. It is tried again at the next append.
                try:
                    self._attempt("compact the log", partial(self._compact, state=state))
                except CommandLogError:
                    logger.warning(
                        "Compaction of %s failed; retried at the next append",
                        self.where,
                        exc_info=True,
                    )

    def compact(self) -> None:
        """Write a snapshot of the stored state now and delete the commands it covers.

        Raises:
            LogFencedError: this log may not write (as `append_all`).
        """
        with self._lock:
            self._attempt("compact the log", self._compact)

    def close(self) -> None:
        """Release the name (without a lease) and the connection, and the pool if the log
        opened it. Calling it again does nothing; the lease is left to its owner."""
        with self._lock:
            if not self._closed:
                self._release()

    # --- opening ------------------------------------------------------------------------------

    def _held(self, conn: _postgres.Connection) -> CommandLogError:
        """The error when another log holds the name (or LogFencedError if another log
        opened it since this one did)."""
        self._check_not_replaced(conn)
        msg = (
            f"{self.where}: another coordinator has this log open (still held after "
            f"lock_timeout {self._lock_timeout} s). Stop that one first, give this one "
            "another name, or run both with a PostgresLease to let them take turns leading."
        )
        return CommandLogError(msg)

    def _check_not_replaced(self, conn: _postgres.Connection) -> None:
        """On reconnecting: LogFencedError if another log opened this name since."""
        if self._writer_epoch:
            row = conn.execute(
                "SELECT epoch FROM coordinator_writer WHERE name = %s", (self.name,)
            ).fetchone()
            if row is not None and int(row[0]) != self._writer_epoch:
                raise LogFencedError(self._replaced_message())

    def _open(self, conn: _postgres.Connection) -> None:
        try:
            with conn.transaction():
                sql.create_tables(conn, self.where)
                if self.lease is None:
                    row = conn.execute(sql.TAKE_WRITER, (self.name,)).fetchone()
                    assert row is not None  # the upsert returns its row
                    self._writer_epoch = int(row[0])
                count = conn.execute(
                    "SELECT count(*) FROM coordinator_log WHERE name = %s", (self.name,)
                ).fetchone()
                self._since_snapshot = int(count[0]) if count is not None else 0
        except _postgres.Error as error:
            self._fail(error, "open the log")

    # --- reading and writing ------------------------------------------------------------------

    def _load(self, conn: _postgres.Connection) -> tuple[CoordinatorState, int, int]:
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            return self._read(conn)

    def _read(self, conn: _postgres.Connection) -> tuple[CoordinatorState, int, int]:
        snapshot = conn.execute(
            "SELECT seq, body FROM coordinator_snapshot WHERE name = %s", (self.name,)
        ).fetchone()
        rows = conn.execute(
            "SELECT seq, kind, body FROM coordinator_log WHERE name = %s AND seq > %s ORDER BY seq",
            (self.name, 0 if snapshot is None else snapshot[0]),
        ).fetchall()
        return replay_stored(snapshot, rows, self.where)

    def _compact(self, conn: _postgres.Connection, state: CoordinatorState | None = None) -> None:
        """Snapshot the stored state: ``state`` if the caller gave the one its last append
        led to (under the fence, nobody else wrote after it), else read back."""
        epoch = self._epoch_to_write()
        with conn.transaction():
            self._fence(conn, epoch)
            if state is None:
                state, last_seq, count = self._read(conn)
            else:
                last_seq, count = self._last_written, 1
            if count:
                # Never replace a newer snapshot (one a later leader wrote).
                conn.execute(
                    "INSERT INTO coordinator_snapshot AS s (name, seq, body) VALUES (%s, %s, %s)"
                    " ON CONFLICT (name) DO UPDATE SET seq = EXCLUDED.seq, body = EXCLUDED.body"
                    " WHERE s.seq < EXCLUDED.seq",
                    (self.name, last_seq, snapshot_body(state)),
                )
                conn.execute(
                    "DELETE FROM coordinator_log WHERE name = %s AND seq <= %s",
                    (self.name, last_seq),
                )
        self._since_snapshot = 0

    def _epoch_to_write(self) -> int:
        """The epoch this log writes under, refused at once if its lease is not held."""
        if self.lease is None:
            return self._writer_epoch
        epoch = self.lease.epoch
        if epoch is None:
            msg = f"{self.where}: this coordinator never acquired the lease; it may not write"
            raise LogFencedError(msg)
        if time.monotonic() >= self.lease.valid_until:
            msg = (
                f"{self.where}: the lease (epoch {epoch}) was not renewed in time by this "
                "process's clock; it may have been taken over. Stop serving; acquire it again."
            )
            raise LogFencedError(msg)
        return epoch

    def _fence(self, conn: _postgres.Connection, epoch: int) -> None:
        """First statement of a multi-statement write (a compaction): lock the row that
        says who may write, and refuse unless it still names this log (LogFencedError;
        the transaction rolls back). An append does the same in its one statement."""
        fence = sql.FENCE_WRITER if self.lease is None else sql.FENCE_LEASE
        row = conn.execute(fence, (self.name,)).fetchone()
        if row is None:
            self._refuse(None, None, epoch)
        live = True if self.lease is None else bool(row[1])
        if int(row[0]) != epoch or not live:
            self._refuse(row[0], live, epoch)

    def _refuse(self, row_epoch: int | None, live: bool | None, epoch: int) -> NoReturn:
        """LogFencedError for a fence row with ``row_epoch`` (None: no row) and ``live``
        when this log writes under ``epoch``."""
        if self.lease is None:
            raise LogFencedError(self._replaced_message())
        if row_epoch is None or int(row_epoch) != epoch:
            now = "nobody" if row_epoch is None else f"epoch {row_epoch}"
            msg = (
                f"{self.where}: another coordinator leads now ({now}; this one's epoch is "
                f"{epoch}). Stop serving: this one is no longer the leader."
            )
            raise LogFencedError(msg)
        msg = (
            f"{self.where}: the lease (epoch {epoch}) expired by the database's clock. "
            "Stop serving; renew or acquire it again before writing."
        )
        raise LogFencedError(msg)

    def _replaced_message(self) -> str:
        return (
            f"{self.where}: another coordinator opened this log since this one did: this "
            "one may not write any more. Close it; only one may run without a lease."
        )

    def _attempt(
        self,
        what: str,
        work: Callable[[_postgres.Connection], T],
        landed: Callable[[_postgres.Connection], T | None] | None = None,
    ) -> T:
        """``work`` on the log's connection; on a transient error, once more on a new one
        (after asking ``landed`` whether the lost attempt committed: its result then)."""
        try:
            return work(self._connection())
        except (_postgres.Error, CommandLogError) as error:
            if isinstance(error, CommandLogError) or _postgres.classify(error) != "transient":
                if isinstance(error, _postgres.Error):
                    self._fail(error, what)
                raise
            logger.info("%s: cannot %s (%s); reconnecting", self.where, what, error)
        try:
            conn = self._connection()
            if landed is not None:
                result = landed(conn)
                if result is not None:
                    return result
            return work(conn)
        except _postgres.Error as error:
            self._fail(error, what)

    # --- connections, errors and release ------------------------------------------------------

    def _connection(self) -> _postgres.Connection:
        if self._closed:
            msg = f"{self!r} was closed; open the log again with a new PostgresCommandLog"
            raise ClosedError(msg)
        # A lost session took the advisory lock with it: the fence of the next write
        # tells whether another log opened the name meanwhile.
        return self._session.connection()

    def _fail(self, error: BaseException, what: str) -> NoReturn:
        if _postgres.classify(error) == "transient":
            msg = (
                f"{self.where}: cannot {what}, PostgreSQL is unreachable or busy "
                f"({type(error).__name__}: {error}). Nothing was stored; check that the "
                "server runs and accepts connections."
            )
        else:
            msg = (
                f"{self.where}: cannot {what} ({type(error).__name__}: {error}). Check the "
                "database's permissions and that its coordinator_ tables were made by "
                "pykka-delivery."
            )
        raise CommandLogError(msg) from error

    def _release(self) -> None:
        self._closed = True
        self._session.release()


def _check(name: str, lease: PostgresLease | None, pool_max_size: int) -> None:
    if not isinstance(name, str) or not name:
        msg = f"name must be a non-empty str naming the log in its database, got {name!r}"
        raise ValueError(msg)
    if lease is not None and lease.name != name:
        msg = (
            f"the lease is for log {lease.name!r}, not {name!r}: give PostgresLease and "
            "PostgresCommandLog the same name"
        )
        raise ValueError(msg)
    if isinstance(pool_max_size, bool) or not isinstance(pool_max_size, int) or pool_max_size < 1:
        msg = f"pool_max_size must be 1 or more connections, got {pool_max_size!r}"
        raise ValueError(msg)
