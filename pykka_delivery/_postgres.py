"""What our PostgreSQL stores share: where their connections come from (a ``postgresql://``
URL, a `psycopg_pool.ConnectionPool` or a `psycopg.Connection`), the schema version check,
telling transient errors from permanent ones, and advisory-lock keys.

The only module of ours that imports psycopg (the ``[postgres]`` extra): the library
imports without it, and a PostgreSQL store fails to open with an error naming the extra.

Every store keeps its tables in one database shared with the others (and, for the
transactional outbox, with the application's own tables): the table names are prefixed by
the store, and ``schema_versions`` has one row per component.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal, TypeAlias
from urllib.parse import urlsplit, urlunsplit

from pykka_delivery._sqlite import newer_schema_message

try:
    import psycopg
    import psycopg_pool
    from psycopg import errors as pg_errors
except ImportError as missing:  # pragma: no cover - exercised without the extra only
    _msg = (
        "the PostgreSQL stores need psycopg 3 and psycopg_pool: install the extra with "
        "pip install 'pykka-delivery[postgres]'"
    )
    raise ImportError(_msg) from missing

__all__ = [
    "Connection",
    "ConnectionPool",
    "ConnectionSource",
    "Error",
    "LockedSession",
    "advisory_key",
    "check_url",
    "classify",
    "create_versioned",
    "in_transaction",
    "open_source",
    "pipelined",
    "put_back",
    "redact",
]

logger = logging.getLogger("pykka_delivery.postgres")

Connection: TypeAlias = "psycopg.Connection[Any]"
ConnectionPool: TypeAlias = "psycopg_pool.ConnectionPool[Any]"
Error = psycopg.Error

SCHEMA_LOCK_KEY = 0x706B6B615F736368  # "pkka_sch": serializes schema creation per database

LOCK_POLL_SECONDS = 0.05  # between two tries of an advisory lock another session holds

_TRANSIENT_SQLSTATE_CLASSES = ("08", "40", "53", "55", "57")
"""Connection exception, transaction rollback (serialization failure, deadlock),
insufficient resources, lock not available / object in use, operator intervention (admin
shutdown, cannot connect now): another attempt may succeed."""


def check_url(url: str, what: str) -> str:
    """``url`` if it is a ``postgresql://`` (or ``postgres://``) URL.

    Raises:
        ValueError: anything else; the message names ``what`` and the expected form.
    """
    if not isinstance(url, str) or urlsplit(url).scheme not in ("postgresql", "postgres"):
        msg = (
            f"{what} must be a postgresql:// URL (postgresql://user@host:5432/dbname), a "
            f"psycopg_pool.ConnectionPool or a psycopg.Connection, got {url!r}"
        )
        raise ValueError(msg)
    return url


def redact(conninfo: str) -> str:
    """``conninfo`` without its password, for messages and logs."""
    parts = urlsplit(conninfo)
    if parts.scheme not in ("postgresql", "postgres") or parts.password is None:
        return conninfo
    host = parts.netloc.rpartition("@")[2]
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def advisory_key(namespace: str, name: str) -> int:
    """A signed 64-bit key for ``pg_advisory_lock`` naming ``name`` in ``namespace`` (one
    store's producer ids, say): stable across processes and versions."""
    digest = hashlib.sha256(f"{namespace}\0{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def classify(error: BaseException) -> Literal["transient", "permanent"]:
    """Whether another attempt of what raised ``error`` may succeed (``"transient"``: the
    connection was lost, the server is restarting or overloaded, a lock or serialization
    conflict) or cannot (``"permanent"``: bad SQL or data, a constraint, a schema or
    permission problem: a person must fix it)."""
    if isinstance(error, psycopg_pool.PoolTimeout | psycopg.OperationalError):
        sqlstate = getattr(error, "sqlstate", None)
        if sqlstate is None or sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES:
            return "transient"
    if isinstance(error, psycopg.Error):
        sqlstate = error.sqlstate
        if sqlstate is not None and sqlstate[:2] in _TRANSIENT_SQLSTATE_CLASSES:
            return "transient"
    return "permanent"


def create_versioned(
    conn: Connection,
    schema: str,
    *,
    component: str,
    version: int,
    what: str,
    refuse: Callable[[str], Exception],
) -> None:
    """In ``conn``'s open transaction: refuse a database whose ``component`` has a newer
    schema version than ``version`` (raising ``refuse(message)``, the message naming
    ``what``), create the tables of ``schema`` and record the version.

    A transaction-scoped advisory lock serializes this between processes opening a new
    database together (two ``CREATE TABLE IF NOT EXISTS`` racing can fail in PostgreSQL).
    """
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK_KEY,))
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_versions ("
        " component TEXT PRIMARY KEY, version INTEGER NOT NULL)"
    )
    row = conn.execute(
        "SELECT version FROM schema_versions WHERE component = %s", (component,)
    ).fetchone()
    if row is not None and row[0] > version:
        raise refuse(newer_schema_message(what, row[0], version))
    for statement in schema.split(";"):
        if statement.strip():
            conn.execute(statement)
    # An older version is upgraded in place: ``schema`` adds what it lacks (IF NOT EXISTS).
    conn.execute(
        "INSERT INTO schema_versions (component, version) VALUES (%s, %s)"
        " ON CONFLICT (component) DO UPDATE SET version = EXCLUDED.version"
        " WHERE schema_versions.version < EXCLUDED.version",
        (component, version),
    )


class ConnectionSource:
    """Where a store takes its connections from.

    * a ``postgresql://`` URL: a `ConnectionPool` of the store's own (closed with it),
      ``max_size`` connections at most;
    * a `ConnectionPool`: shared with the application and other stores (left open);
    * a `psycopg.Connection`: used as it is by this store alone (left open).

    Connections handed out are in autocommit mode (the stores write explicit
    transactions); a connection's previous mode is restored when it goes back.
    """

    def __init__(
        self,
        source: str | ConnectionPool | Connection,
        *,
        what: str,
        max_size: int,
        connect_timeout: float,
    ) -> None:
        self.what = what
        self._connect_timeout = connect_timeout
        self._owned_pool = False
        self._pool: ConnectionPool | None = None
        self._conn: Connection | None = None
        self._lent: dict[int, bool] = {}
        self._lock = threading.Lock()
        if isinstance(source, psycopg_pool.ConnectionPool):
            self._pool = source
            conninfo = source.conninfo
            self.name = redact(conninfo) if isinstance(conninfo, str) else f"pool {source.name}"
        elif isinstance(source, psycopg.Connection):
            self._conn = source
            self.name = redact(source.info.dsn)
        else:
            url = check_url(source, what)
            self.name = redact(url)
            self._pool = psycopg_pool.ConnectionPool(
                url,
                min_size=1,
                max_size=max_size,
                open=False,
                name=what,
                timeout=connect_timeout,
            )
            self._owned_pool = True
            try:
                self._pool.open(wait=True, timeout=connect_timeout)
            except psycopg_pool.PoolTimeout as error:
                self._pool.close()
                msg = (
                    f"{what}: cannot connect to {self.name} within {connect_timeout} s "
                    f"({error}). Check that the server runs and the URL is right."
                )
                raise ConnectionError(msg) from error

    def getconn(self) -> Connection:
        """A connection for this store, in autocommit mode, until `putconn`.

        Raises:
            psycopg_pool.PoolTimeout: no connection within ``connect_timeout``.
        """
        conn: Connection
        if self._pool is not None:
            conn = self._pool.getconn(timeout=self._connect_timeout)
        else:
            assert self._conn is not None  # one or the other, from __init__
            conn = self._conn
        with self._lock:
            self._lent[id(conn)] = conn.autocommit
        if not conn.autocommit:
            conn.autocommit = True
        return conn

    def putconn(self, conn: Connection) -> None:
        """Give ``conn`` back (a broken one is discarded by the pool)."""
        with self._lock:
            autocommit = self._lent.pop(id(conn), True)
        if not conn.closed and conn.autocommit != autocommit:
            # A connection in a failed state refuses; the pool discards it.
            with contextlib.suppress(psycopg.Error):
                conn.autocommit = autocommit
        if self._pool is not None:
            self._pool.putconn(conn)

    @property
    def lends_more(self) -> bool:
        """Whether `getconn` can hand out another connection than the store's (a pool)."""
        return self._pool is not None

    def close(self) -> None:
        """Close the pool if this source opened it."""
        if self._owned_pool and self._pool is not None:
            self._pool.close()


def open_source(
    source: str | ConnectionPool | Connection,
    *,
    what: str,
    max_size: int,
    connect_timeout: float,
    error: Callable[[str], Exception],
) -> ConnectionSource:
    """A `ConnectionSource` for a store; a server it cannot reach raises ``error(message)``
    (the store's own error class)."""
    try:
        return ConnectionSource(
            source, what=what, max_size=max_size, connect_timeout=connect_timeout
        )
    except ConnectionError as failure:
        raise error(str(failure)) from failure


def put_back(source: ConnectionSource, conn: Connection, key: int | None = None) -> None:
    """Release the session advisory lock ``key`` (if not None) held on ``conn`` and give
    ``conn`` back to ``source``. Never raises: a lost connection took its lock with it."""
    try:
        if key is not None and not conn.closed and not conn.broken:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
    except Exception:
        logger.debug("%s: unlock on a failing connection", source.name, exc_info=True)
    try:
        source.putconn(conn)
    except Exception:
        logger.debug("%s: giving a connection back failed", source.name, exc_info=True)


class LockedSession:
    """The one connection a store keeps for its life, holding the session advisory lock
    ``key`` (None: no lock) so that one process at a time writes what ``key`` names.

    The lock belongs to the session: the server releases it when the connection dies (a
    SIGKILLed process), so a successor takes it at once; a connection this store lost is
    replaced, and the lock taken again, by the next `connection`.

    Args:
        source: where the connections come from.
        key: the lock (`advisory_key`), or None.
        lock_timeout: seconds to wait while another session holds ``key``.
        held: the error to raise when ``key`` is still held after ``lock_timeout``,
            given the connection (it may raise another of its own).
        fail: the error to raise for a PostgreSQL error, given it and what was being
            done ("take a connection", "take " + ``lock_name``).
        lock_name: what ``key`` stands for in messages ("the consumer id's lock").
        synchronous_commit: PostgreSQL's ``synchronous_commit`` for the session, or None.
    """

    __slots__ = (
        "_fail",
        "_held",
        "_lock_name",
        "_lock_timeout",
        "_synchronous_commit",
        "conn",
        "key",
        "source",
    )

    def __init__(
        self,
        source: ConnectionSource,
        key: int | None,
        *,
        lock_timeout: float,
        held: Callable[[Connection], BaseException],
        fail: Callable[[BaseException, str], BaseException],
        lock_name: str = "the lock",
        synchronous_commit: str | None = None,
    ) -> None:
        self.source = source
        self.key = key
        self.conn: Connection | None = None
        self._lock_timeout = lock_timeout
        self._held = held
        self._fail = fail
        self._lock_name = lock_name
        self._synchronous_commit = synchronous_commit

    @property
    def lost(self) -> bool:
        """Whether there is no live connection (none yet, or it closed or broke)."""
        conn = self.conn
        return conn is None or conn.closed or conn.broken

    def connection(self) -> Connection:
        """The session's connection; a new one holding the lock if it was lost."""
        conn = self.conn
        if conn is None or conn.closed or conn.broken:
            self.conn = None
            if conn is not None:
                put_back(self.source, conn, self.key)
            self.conn = conn = self._take()
        return conn

    def release(self) -> None:
        """Release the lock and the connection, then close the source (its own pool)."""
        conn, self.conn = self.conn, None
        try:
            if conn is not None:
                put_back(self.source, conn, self.key)
        finally:
            self.source.close()

    def _take(self) -> Connection:
        try:
            conn = self.source.getconn()
        except Exception as error:
            raise self._fail(error, "take a connection") from error
        try:
            if self.key is not None and not self._try_lock(conn, self.key):
                raise self._held(conn)
            if self._synchronous_commit is not None:
                conn.execute(
                    "SELECT set_config('synchronous_commit', %s, false)",
                    (self._synchronous_commit,),
                )
        except BaseException as error:
            put_back(self.source, conn, self.key)
            if isinstance(error, psycopg.Error):
                raise self._fail(error, f"take {self._lock_name}") from error
            raise
        return conn

    def _try_lock(self, conn: Connection, key: int) -> bool:
        """Take ``key`` on ``conn``, polling while another session holds it: False if it
        still does after ``lock_timeout``."""
        deadline = time.monotonic() + self._lock_timeout
        while True:
            row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            if row is not None and row[0]:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(LOCK_POLL_SECONDS)


def in_transaction(conn: Connection) -> bool:
    """Whether what ``conn`` executes now is part of a transaction the application
    commits: one is open, or the connection opens one implicitly (not autocommit)."""
    if not conn.autocommit:
        return True
    return conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE


def pipelined(conn: Connection) -> contextlib.AbstractContextManager[Any]:
    """``conn`` in pipeline mode for the block (its statements sent without waiting for
    each result, so several cost one round trip), or as it is where libpq is too old for
    it (below 14)."""
    return conn.pipeline() if psycopg.Pipeline.is_supported() else contextlib.nullcontext()


UndefinedTable = pg_errors.UndefinedTable
LockNotAvailable = pg_errors.LockNotAvailable
