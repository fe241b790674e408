"""`PostgresTxDedupStore`: the deduplication store inside the application's PostgreSQL
transaction (the ``[postgres]`` extra; the rules: dedup_tx.py).

The positions are a table of the application's database; each handler writes its
message's position in the transaction that applies its effect, on its own psycopg
connection::

    store = PostgresTxDedupStore("postgresql://app@db/app", "billing")
    consumer = Consumer(dedup_store=store)
    with psycopg.connect("postgresql://app@db/app", autocommit=True) as conn:
        for delivery in consumer:
            with consumer.transaction(conn, delivery):
                conn.execute("INSERT INTO invoices ...")
            delivery.confirm()

The fence holds under PostgreSQL's default isolation (read committed): a second
transaction writing the same position waits on the row until the first commits, then
finds it taken (`AlreadyApplied`) and rolls back.

A fenced store's position write reads the consumer id's epoch ``FOR SHARE`` in the same
statement, so the `fence` of a newer store waits for a transaction in flight to end: once
it returned, no transaction of an older epoch commits. A transaction left open by a
paused process holds that `fence` (and any writer of the same position) until its
session ends: `fence` gives up after ``fence_timeout`` (`DedupStoreError`); give the
application's connections an ``idle_in_transaction_session_timeout`` to end such sessions.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from pykka_delivery import _postgres
from pykka_delivery._fields import check_field_types
from pykka_delivery._sqlite import check_seconds
from pykka_delivery.delivery.stores.dedup_base import DedupStoreError
from pykka_delivery.delivery.stores.dedup_tx import APPLIED, WRITTEN, TxDedupStore

__all__ = ["PostgresTxDedupSettings", "PostgresTxDedupStore"]

SCHEMA_COMPONENT = "dedup_tx"
SCHEMA_VERSION = 2  # 2: the fence table (fencing epochs; version 1 gets it on opening)
_TABLE = "pykka_delivery_dedup_position"
_FENCES = "pykka_delivery_dedup_fence"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {_TABLE} (
    consumer_id TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    PRIMARY KEY (consumer_id, producer_id)
);
CREATE TABLE IF NOT EXISTS {_FENCES} (
    consumer_id TEXT PRIMARY KEY,
    epoch BIGINT NOT NULL
)
"""

_RISING = (
    f"INSERT INTO {_TABLE} (consumer_id, producer_id, seq_nr) VALUES (%s, %s, %s) "
    f"ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = EXCLUDED.seq_nr "
    f"WHERE {_TABLE}.seq_nr < EXCLUDED.seq_nr"
)
_RESET = (
    f"INSERT INTO {_TABLE} (consumer_id, producer_id, seq_nr) VALUES (%s, %s, 0) "
    f"ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = 0"
)
# A fenced store's write: nothing if a higher epoch than its own (the last %s) is stored;
# FOR SHARE: a newer store's fence waits for this transaction.
_UNFENCED = f"coalesce((SELECT epoch FROM {_FENCES} WHERE consumer_id = %s FOR SHARE), 0) <= %s"
_RISING_FENCED = (
    f"INSERT INTO {_TABLE} (consumer_id, producer_id, seq_nr) SELECT %s, %s, %s "
    f"WHERE {_UNFENCED} "
    f"ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = EXCLUDED.seq_nr "
    f"WHERE {_TABLE}.seq_nr < EXCLUDED.seq_nr"
)
_RESET_FENCED = (
    f"INSERT INTO {_TABLE} (consumer_id, producer_id, seq_nr) SELECT %s, %s, 0 "
    f"WHERE {_UNFENCED} "
    f"ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = 0"
)
_FENCE = (
    f"INSERT INTO {_FENCES} (consumer_id, epoch) VALUES (%s, %s) "
    f"ON CONFLICT (consumer_id) DO UPDATE SET epoch = EXCLUDED.epoch "
    f"WHERE {_FENCES}.epoch < EXCLUDED.epoch"
)
_EPOCH = f"SELECT coalesce(max(epoch), 0) FROM {_FENCES} WHERE consumer_id = %s"


@dataclass(frozen=True, slots=True)
class PostgresTxDedupSettings:
    """Settings of a `PostgresTxDedupStore`'s own connection.

    Attributes:
        connect_timeout: seconds to wait for a connection (opening the pool the store
            makes for a URL, or one from a busy pool). Default 10.0; finite, >= 0.
        fence_timeout: seconds `fence` waits for a transaction of an older activation
            still writing a position of this consumer id (a paused process's, say) before
            it raises `DedupStoreError`. Default 10.0; finite, > 0.
    """

    connect_timeout: float = 10.0
    fence_timeout: float = 10.0

    def __post_init__(self) -> None:
        check_field_types(self)
        check_seconds("PostgresTxDedupSettings.connect_timeout", self.connect_timeout)
        check_seconds("PostgresTxDedupSettings.fence_timeout", self.fence_timeout)
        if self.fence_timeout <= 0:  # 0 would be PostgreSQL's "wait forever"
            msg = (
                f"PostgresTxDedupSettings.fence_timeout must be above 0 seconds, got "
                f"{self.fence_timeout!r}"
            )
            raise ValueError(msg)


class PostgresTxDedupStore(TxDedupStore):
    """A transactional `DedupStore` (dedup_tx.py) in the application's PostgreSQL
    database: table ``pykka_delivery_dedup_position``, created if missing, written by the
    application's transactions through `transaction` or `record_in`.

    Args:
        source: the application's database: a ``postgresql://`` URL (the store opens a
            pool of one connection, closed with it), a `psycopg_pool.ConnectionPool`, or
            a `psycopg.Connection` the store then uses alone (neither is closed by
            `close`). The store's connection loads the positions and writes the ones the
            application did not; the effects go through the application's connections.
        consumer_id: whose positions these are (the consumer that replaces this one uses
            the same id).
        settings: see `PostgresTxDedupSettings`.

    Raises:
        DedupStoreError: the server cannot be reached, or the database holds a newer
            schema version.
        ValueError: an empty consumer id, or a source that is none of the above.
    """

    def __init__(
        self, source: Any, consumer_id: str, settings: PostgresTxDedupSettings | None = None
    ) -> None:
        super().__init__(consumer_id)
        self.settings = settings = settings or PostgresTxDedupSettings()
        self._source = _postgres.open_source(
            source,
            what="PostgresTxDedupStore",
            max_size=1,
            connect_timeout=settings.connect_timeout,
            error=DedupStoreError,
        )
        self.name = self._source.name
        try:
            self._conn = self._source.getconn()
        except _postgres.Error as error:
            self._source.close()
            raise self._error("cannot connect", error) from error
        try:
            with self._conn.transaction():
                _postgres.create_versioned(
                    self._conn,
                    SCHEMA,
                    component=SCHEMA_COMPONENT,
                    version=SCHEMA_VERSION,
                    what=f"transactional dedup store {self.name}",
                    refuse=DedupStoreError,
                )
        except BaseException as error:
            self._close_own()
            if isinstance(error, _postgres.Error):
                raise self._error("cannot be prepared", error) from error
            raise

    def __repr__(self) -> str:
        return f"PostgresTxDedupStore({self.name!r}, {self.consumer_id!r})"

    def _error(self, doing: str, error: BaseException) -> DedupStoreError:
        if isinstance(error, _postgres.UndefinedTable):
            fix = (
                f"the connection is not to {self.name}: write the position in the database "
                f"of the effect, which PostgresTxDedupStore was given"
            )
        elif _postgres.classify(error) == "transient":
            fix = "the server was unreachable or busy: retry"
        else:
            fix = "check the database's permissions and schema"
        return DedupStoreError(f"transactional dedup store {self.name}: {doing} ({error}); {fix}")

    def _begin(self, conn: Any) -> None:
        if conn.info.transaction_status != 0:  # psycopg.pq.TransactionStatus.IDLE
            msg = (
                f"{self!r}.transaction: the connection is in a transaction already; commit "
                f"or roll it back first, or call record_in(conn, delivery) inside it"
            )
            raise ValueError(msg)
        if conn.autocommit:  # otherwise psycopg begins one with the first statement
            try:
                conn.execute("BEGIN")
            except _postgres.Error as error:
                raise self._error("cannot begin a transaction", error) from error

    def _commit(self, conn: Any) -> None:
        try:
            conn.commit()
        except _postgres.Error as error:
            self._rollback(conn)
            raise self._error("cannot commit the effect and its position", error) from error

    def _rollback(self, conn: Any) -> None:
        with contextlib.suppress(_postgres.Error):  # a broken connection ended it
            conn.rollback()

    def _write_rising(self, conn: Any, producer_id: str, seq_nr: int, epoch: int | None) -> int:
        consumer_id = self.consumer_id
        try:
            if epoch is None:
                cursor = conn.execute(_RISING, (consumer_id, producer_id, seq_nr))
                return WRITTEN if cursor.rowcount > 0 else APPLIED
            args = (consumer_id, producer_id, seq_nr, consumer_id, epoch)
            if conn.execute(_RISING_FENCED, args).rowcount > 0:
                return WRITTEN
            newer = self._stored_epoch(conn)
        except _postgres.Error as error:
            raise self._error("cannot write a position", error) from error
        return newer if newer > epoch else APPLIED

    def _select(self) -> dict[str, int]:
        try:
            rows = self._conn.execute(
                f"SELECT producer_id, seq_nr FROM {_TABLE} WHERE consumer_id = %s",
                (self.consumer_id,),
            ).fetchall()
        except _postgres.Error as error:
            raise self._error("cannot load positions", error) from error
        return {producer_id: seq_nr for producer_id, seq_nr in rows}

    def _write_own(self, producer_id: str, seq_nr: int, epoch: int | None) -> int:
        conn, consumer_id = self._conn, self.consumer_id
        try:
            with conn.transaction():
                if epoch is None:
                    if seq_nr:
                        conn.execute(_RISING, (consumer_id, producer_id, seq_nr))
                    else:
                        conn.execute(_RESET, (consumer_id, producer_id))
                    return 0
                args = (consumer_id, producer_id, seq_nr, consumer_id, epoch)
                if seq_nr:
                    conn.execute(_RISING_FENCED, args)
                else:
                    conn.execute(_RESET_FENCED, args[:2] + args[3:])
                newer = self._stored_epoch(conn)
        except _postgres.Error as error:
            raise self._error("cannot write a position", error) from error
        return newer if newer > epoch else 0

    def _store_epoch(self, epoch: int) -> int:
        conn = self._conn
        wait = f"{max(1, round(self.settings.fence_timeout * 1000))}ms"
        try:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (wait,))
                conn.execute(_FENCE, (self.consumer_id, epoch))
                return self._stored_epoch(conn)
        except _postgres.LockNotAvailable as error:
            msg = (
                f"transactional dedup store {self.name}: cannot store fencing epoch {epoch}: "
                f"a transaction writing a position of consumer id {self.consumer_id!r} was "
                f"still open after fence_timeout ({self.settings.fence_timeout} s), an older "
                f"activation's (a paused process?). Retry; give the application's "
                f"connections an idle_in_transaction_session_timeout so that the server "
                f"ends such transactions"
            )
            raise DedupStoreError(msg) from error
        except _postgres.Error as error:
            raise self._error(f"cannot store fencing epoch {epoch}", error) from error

    def _stored_epoch(self, conn: Any) -> int:
        row = conn.execute(_EPOCH, (self.consumer_id,)).fetchone()
        return int(row[0]) if row is not None else 0

    def _close_own(self) -> None:
        with contextlib.suppress(_postgres.Error):
            self._source.putconn(self._conn)
        self._source.close()
