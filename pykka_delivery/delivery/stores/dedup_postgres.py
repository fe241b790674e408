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

Fencing (`fence`, dedup.py): the epoch is a row of ``dedup_fence`` per consumer id. A
fenced store's write reads it ``FOR SHARE`` in the statement that writes the positions
and writes nothing if it is higher than its own; a `fence` of a newer store waits for
such a write in flight, so once it returned no write of an older epoch commits. Once
fenced, a store lets go of the advisory lock (the epoch keeps older writers out): the
store of a newer activation opens at once, even while a cut-off process's session, and
its lock, lingers on the server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pykka_delivery import _postgres
from pykka_delivery._fields import check_field_types
from pykka_delivery._sqlite import check_seconds
from pykka_delivery.delivery.stores.dedup_base import (
    BufferedDedupStore,
    DedupStoreError,
    check_flush_every,
)
from pykka_delivery.errors import ClosedError

__all__ = ["PostgresDedupSettings", "PostgresDedupStore"]

SCHEMA_COMPONENT = "dedup_store"
SCHEMA_VERSION = 2  # 2: dedup_fence (fencing epochs; version 1 gets it on opening)
LOCK_NAMESPACE = "pykka_delivery.dedup_store"

SCHEMA = """
CREATE TABLE IF NOT EXISTS dedup_position (
    consumer_id TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    PRIMARY KEY (consumer_id, producer_id)
);
CREATE TABLE IF NOT EXISTS dedup_fence (
    consumer_id TEXT PRIMARY KEY,
    epoch BIGINT NOT NULL
)
"""

_UPSERT = (
    "INSERT INTO dedup_position (consumer_id, producer_id, seq_nr)"
    " SELECT %s, * FROM unnest(%s::text[], %s::bigint[])"
    " ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = EXCLUDED.seq_nr"
)
# A fenced store's write: nothing if a higher epoch than its own (the last %s) is stored.
_UPSERT_FENCED = (
    "WITH fence AS (SELECT epoch FROM dedup_fence WHERE consumer_id = %s FOR SHARE)"
    " INSERT INTO dedup_position (consumer_id, producer_id, seq_nr)"
    " SELECT %s, * FROM unnest(%s::text[], %s::bigint[])"
    " WHERE coalesce((SELECT epoch FROM fence), 0) <= %s"
    " ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = EXCLUDED.seq_nr"
)
_FENCE = (
    "INSERT INTO dedup_fence (consumer_id, epoch) VALUES (%s, %s)"
    " ON CONFLICT (consumer_id) DO UPDATE SET epoch = EXCLUDED.epoch"
    " WHERE dedup_fence.epoch < EXCLUDED.epoch"
)
_EPOCH = "SELECT coalesce(max(epoch), 0) FROM dedup_fence WHERE consumer_id = %s"


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
        check_flush_every(self.flush_every)
        choices = ("on", "off", "local", "remote_write", "remote_apply")
        if self.synchronous_commit not in choices:
            msg = (
                f"synchronous_commit must be one of {', '.join(choices)}, got "
                f"{self.synchronous_commit!r}"
            )
            raise ValueError(msg)
        check_seconds("PostgresDedupSettings.connect_timeout", self.connect_timeout)
        check_seconds("PostgresDedupSettings.lock_timeout", self.lock_timeout)


class PostgresDedupStore(BufferedDedupStore):
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

    _db_error = _postgres.Error

    def __init__(
        self, source: Any, consumer_id: str, settings: PostgresDedupSettings | None = None
    ) -> None:
        self.settings = settings = settings or PostgresDedupSettings()
        super().__init__(consumer_id, settings.flush_every)
        opened = _postgres.open_source(
            source,
            what="PostgresDedupStore",
            max_size=1,
            connect_timeout=settings.connect_timeout,
            error=DedupStoreError,
        )
        self.name = opened.name
        self._session = _postgres.LockedSession(
            opened,
            _postgres.advisory_key(LOCK_NAMESPACE, consumer_id),
            lock_timeout=settings.lock_timeout,
            held=lambda _conn: self._held(),
            fail=lambda error, what: self._error(f"cannot {what}", error),
            lock_name="the consumer id's lock",
            synchronous_commit=settings.synchronous_commit,
        )
        try:
            conn = self._session.connection()
            with conn.transaction():
                _postgres.create_versioned(
                    conn,
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

    # --- what BufferedDedupStore asks of a store ----------------------------------------------

    def _connection(self) -> _postgres.Connection:
        if self._closed:
            msg = f"{self!r} was closed; open the store again with a new PostgresDedupStore"
            raise ClosedError(msg)
        # A lost session took the consumer id's lock with it: both are taken again.
        return self._session.connection()

    def _select(self, conn: _postgres.Connection) -> dict[str, int]:
        rows = conn.execute(
            "SELECT producer_id, seq_nr FROM dedup_position WHERE consumer_id = %s",
            (self.consumer_id,),
        ).fetchall()
        return {producer_id: seq_nr for producer_id, seq_nr in rows}

    def _upsert(
        self, conn: _postgres.Connection, pending: dict[str, int], epoch: int | None
    ) -> int:
        consumer_id = self.consumer_id
        with conn.transaction():
            if epoch is None:
                conn.execute(_UPSERT, (consumer_id, list(pending), list(pending.values())))
                return 0
            args = (consumer_id, consumer_id, list(pending), list(pending.values()), epoch)
            if conn.execute(_UPSERT_FENCED, args).rowcount > 0:
                return 0
            return self._stored_epoch(conn)

    def _store_epoch(self, conn: _postgres.Connection, epoch: int) -> int:
        with conn.transaction():
            conn.execute(_FENCE, (self.consumer_id, epoch))
            return self._stored_epoch(conn)

    def _stored_epoch(self, conn: _postgres.Connection) -> int:
        row = conn.execute(_EPOCH, (self.consumer_id,)).fetchone()
        return int(row[0]) if row is not None else 0

    def _unlock(self, conn: _postgres.Connection) -> None:
        key, self._session.key = self._session.key, None  # a new session takes none
        if key is not None:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))

    def _release(self) -> None:
        self._closed = True
        self._session.release()

    def _held(self) -> DedupStoreError:
        msg = (
            f"dedup store {self.name}: consumer id {self.consumer_id!r} is in use by another "
            f"store (still held after lock_timeout {self.settings.lock_timeout} s). Close "
            "that one first (or stop its process), or give this consumer another id: two "
            "writers of one consumer id would overwrite each other's positions."
        )
        return DedupStoreError(msg)

    def _error(self, doing: str, error: BaseException) -> DedupStoreError:
        if _postgres.classify(error) == "transient":
            fix = "PostgreSQL was unreachable or busy: it is retried; check that the server runs"
        else:
            fix = (
                "check the database's permissions and that its dedup_position table was "
                "made by pykka-delivery"
            )
        return DedupStoreError(f"dedup store {self.name}: {doing} ({error}); {fix}")
