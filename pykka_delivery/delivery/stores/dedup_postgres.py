"""`PostgresDedupStore`: the consumer's deduplication store in PostgreSQL (the
``[postgres]`` extra), the twin of `SqliteDedupStore` (the contract: dedup.py).

Positions are written behind, as with SQLite: `record` buffers, `flush` writes every
buffered position in one transaction. One database holds the positions of many consumers
(table ``dedup_position``, keyed by consumer id), on as many hosts as reach the server: a
consumer that takes over on another host finds what its predecessor flushed.

One writer per consumer id: the store holds a session advisory lock named after the
consumer id on its connection for its life; the server releases it when that connection
dies (a SIGKILLed process), so the consumer that replaces it opens the store at once. If
the store loses its connection, it takes a new one and the lock again before writing.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from typing import Any

from pykka_delivery import _postgres
from pykka_delivery._fields import check_field_types
from pykka_delivery._sqlite import check_seconds
from pykka_delivery.delivery.stores.dedup import DedupStoreError, _check_position
from pykka_delivery.errors import ClosedError

__all__ = ["PostgresDedupSettings", "PostgresDedupStore"]

SCHEMA_COMPONENT = "dedup_store"
SCHEMA_VERSION = 1
LOCK_NAMESPACE = "pykka_delivery.dedup_store"
_LOCK_POLL_SECONDS = 0.05

SCHEMA = """
CREATE TABLE IF NOT EXISTS dedup_position (
    consumer_id TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    PRIMARY KEY (consumer_id, producer_id)
)
"""

_UPSERT = (
    "INSERT INTO dedup_position (consumer_id, producer_id, seq_nr)"
    " SELECT %s, * FROM unnest(%s::text[], %s::bigint[])"
    " ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = EXCLUDED.seq_nr"
)


@dataclass(frozen=True, slots=True)
class PostgresDedupSettings:
    """Settings of a `PostgresDedupStore`.

    Attributes:
        flush_every: also commit after this many `record` calls. 0 (default): only on
            `flush` (before each Request/Ack, about twice per window); 1: each
            confirmation its own commit. As `SqliteDedupSettings.flush_every`.
        synchronous_commit: PostgreSQL's ``synchronous_commit`` for the store's
            transactions: ``"on"`` (default: a flush returns once the server has it on
            disk), ``"off"`` (faster; a server crash may lose the last flushes, whose
            messages are then delivered again), or ``"local"``, ``"remote_write"``,
            ``"remote_apply"`` (with replicas).
        connect_timeout: seconds to wait for a connection. Default 10; finite, >= 0.
        lock_timeout: seconds to wait for another holder of the same consumer id (one
            writer per consumer id) before giving up. Default 5; finite, >= 0.
    """

    flush_every: int = 0
    synchronous_commit: str = "on"
    connect_timeout: float = 10.0
    lock_timeout: float = 5.0

    def __post_init__(self) -> None:
        check_field_types(self)
        if type(self.flush_every) is not int or self.flush_every < 0:
            msg = (
                f"flush_every must be 0 (flush only on flush()) or a number of records "
                f">= 1, got {self.flush_every!r}"
            )
            raise ValueError(msg)
        choices = ("on", "off", "local", "remote_write", "remote_apply")
        if self.synchronous_commit not in choices:
            msg = (
                f"synchronous_commit must be one of {', '.join(choices)}, got "
                f"{self.synchronous_commit!r}"
            )
            raise ValueError(msg)
        check_seconds("PostgresDedupSettings.connect_timeout", self.connect_timeout)
        check_seconds("PostgresDedupSettings.lock_timeout", self.lock_timeout)


class PostgresDedupStore:
    """A `DedupStore` in a PostgreSQL database (table ``dedup_position``, created if
    missing).

    Args:
        source: a ``postgresql://`` URL (the store opens a pool of one connection, closed
            with it), a `psycopg_pool.ConnectionPool`, or a `psycopg.Connection` the store
            then uses alone (neither is closed by `close`).
        consumer_id: whose positions these are: the consumer that replaces this one (after
            a crash, or on another host) uses the same id.
        settings: see `PostgresDedupSettings`.

    Raises:
        DedupStoreError: the server cannot be reached, another live store holds this
            consumer id, or the database holds a newer schema version.
        ValueError: an empty consumer id, or a source that is none of the above.
    """

    def __init__(
        self, source: Any, consumer_id: str, settings: PostgresDedupSettings | None = None
    ) -> None:
        if not isinstance(consumer_id, str) or not consumer_id:
            msg = f"consumer_id must be a non-empty string, got {consumer_id!r}"
            raise ValueError(msg)
        self.settings = settings = settings or PostgresDedupSettings()
        self.consumer_id = consumer_id
        self._key = _postgres.advisory_key(LOCK_NAMESPACE, consumer_id)
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._since_flush = 0
        self._flush_every = settings.flush_every
        self._closed = False
        self._conn: _postgres.Connection | None = None
        try:
            self._source = _postgres.ConnectionSource(
                source,
                what="PostgresDedupStore",
                max_size=1,
                connect_timeout=settings.connect_timeout,
            )
        except ConnectionError as error:
            raise DedupStoreError(str(error)) from error
        self.name = self._source.name
        try:
            self._conn = self._take_connection()
            with self._conn.transaction():
                _postgres.create_versioned(
                    self._conn,
                    SCHEMA,
                    component=SCHEMA_COMPONENT,
                    version=SCHEMA_VERSION,
                    what=f"dedup store {self.name}",
                    refuse=DedupStoreError,
                )
        except BaseException as error:
            self._release()
            if isinstance(error, _postgres.Error):
                raise self._error("cannot be prepared", error) from error
            raise

    def __repr__(self) -> str:
        return f"PostgresDedupStore({self.name!r}, {self.consumer_id!r})"

    # --- the DedupStore protocol --------------------------------------------------------------

    def load(self) -> dict[str, int]:
        with self._lock:
            conn = self._connection()
            try:
                rows = conn.execute(
                    "SELECT producer_id, seq_nr FROM dedup_position WHERE consumer_id = %s",
                    (self.consumer_id,),
                ).fetchall()
            except _postgres.Error as error:
                raise self._error("cannot load positions", error) from error
            positions = {producer_id: seq_nr for producer_id, seq_nr in rows}
            positions.update(self._pending)
            return positions

    def record(self, producer_id: str, seq_nr: int) -> None:
        # Called once per confirmation: kept short.
        if seq_nr.__class__ is not int or seq_nr < 0:
            _check_position(producer_id, seq_nr)
        with self._lock:
            if self._closed:
                self._connection()  # raises
            self._pending[producer_id] = seq_nr
            if self._flush_every:
                self._since_flush += 1
                if self._since_flush >= self._flush_every:
                    self._flush()

    def flush(self) -> None:
        with self._lock:
            self._flush()

    def close(self) -> None:
        """Flush, then release the consumer id and the connection (and the pool, if the
        store opened it). If the flush fails, the store stays open (close again to retry)
        and `DedupStoreError` is raised."""
        with self._lock:
            if self._closed:
                return
            self._flush()
            self._release()

    # --- internals ----------------------------------------------------------------------------

    def _flush(self) -> None:
        conn = self._connection()
        pending = self._pending
        if not pending:
            return
        try:
            with conn.transaction():  # one transaction: all or none
                conn.execute(_UPSERT, (self.consumer_id, list(pending), list(pending.values())))
        except _postgres.Error as error:
            raise self._error(
                f"cannot write {len(pending)} position(s) (kept, retried at the next flush)",
                error,
            ) from error
        pending.clear()
        self._since_flush = 0

    def _connection(self) -> _postgres.Connection:
        if self._closed:
            msg = f"{self!r} was closed; open the store again with a new PostgresDedupStore"
            raise ClosedError(msg)
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            # The lost session took the consumer id's lock with it: take both again.
            self._conn = None
            if conn is not None:
                self._put_back(conn)
            self._conn = conn = self._take_connection()
        return conn

    def _take_connection(self) -> _postgres.Connection:
        """A connection holding this consumer id's advisory lock."""
        try:
            conn = self._source.getconn()
        except Exception as error:
            raise self._error("cannot take a connection", error) from error
        try:
            deadline = time.monotonic() + self.settings.lock_timeout
            while True:
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self._key,)).fetchone()
                if row is not None and row[0]:
                    break
                if time.monotonic() >= deadline:
                    msg = (
                        f"dedup store {self.name}: consumer id {self.consumer_id!r} is in use "
                        f"by another store (still held after lock_timeout "
                        f"{self.settings.lock_timeout} s). Close that one first (or stop its "
                        "process), or give this consumer another id: two writers of one "
                        "consumer id would overwrite each other's positions."
                    )
                    raise DedupStoreError(msg)
                time.sleep(_LOCK_POLL_SECONDS)
            conn.execute(
                "SELECT set_config('synchronous_commit', %s, false)",
                (self.settings.synchronous_commit,),
            )
        except BaseException as error:
            self._put_back(conn)
            if isinstance(error, _postgres.Error):
                raise self._error("cannot take the consumer id's lock", error) from error
            raise
        return conn

    def _put_back(self, conn: _postgres.Connection) -> None:
        with contextlib.suppress(Exception):
            if not conn.closed and not conn.broken:
                conn.execute("SELECT pg_advisory_unlock(%s)", (self._key,))
        with contextlib.suppress(Exception):
            self._source.putconn(conn)

    def _release(self) -> None:
        self._closed = True
        conn, self._conn = self._conn, None
        try:
            if conn is not None:
                self._put_back(conn)
        finally:
            self._source.close()

    def _error(self, doing: str, error: BaseException) -> DedupStoreError:
        if _postgres.classify(error) == "transient":
            fix = "PostgreSQL was unreachable or busy: it is retried; check that the server runs"
        else:
            fix = (
                "check the database's permissions and that its dedup_position table was "
                "made by pykka-delivery"
            )
        return DedupStoreError(f"dedup store {self.name}: {doing} ({error}); {fix}")
