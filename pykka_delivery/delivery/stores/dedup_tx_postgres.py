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
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from pykka_delivery import _postgres
from pykka_delivery._fields import check_field_types
from pykka_delivery._sqlite import check_seconds
from pykka_delivery.delivery.stores.dedup import DedupStoreError
from pykka_delivery.delivery.stores.dedup_tx import TxDedupStore

__all__ = ["PostgresTxDedupSettings", "PostgresTxDedupStore"]

SCHEMA_COMPONENT = "dedup_tx"
SCHEMA_VERSION = 1
_TABLE = "pykka_delivery_dedup_position"

SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {_TABLE} (
    consumer_id TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    PRIMARY KEY (consumer_id, producer_id)
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


@dataclass(frozen=True, slots=True)
class PostgresTxDedupSettings:
    """Settings of a `PostgresTxDedupStore`'s own connection.

    Attributes:
        connect_timeout: seconds to wait for a connection (opening the pool the store
            makes for a URL, or one from a busy pool). Default 10.0; finite, >= 0.
    """

    connect_timeout: float = 10.0

    def __post_init__(self) -> None:
        check_field_types(self)
        check_seconds("PostgresTxDedupSettings.connect_timeout", self.connect_timeout)


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

    def _write_rising(self, conn: Any, producer_id: str, seq_nr: int) -> bool:
        try:
            cursor = conn.execute(_RISING, (self.consumer_id, producer_id, seq_nr))
        except _postgres.Error as error:
            raise self._error("cannot write a position", error) from error
        return bool(cursor.rowcount > 0)

    def _select(self) -> dict[str, int]:
        try:
            rows = self._conn.execute(
                f"SELECT producer_id, seq_nr FROM {_TABLE} WHERE consumer_id = %s",
                (self.consumer_id,),
            ).fetchall()
        except _postgres.Error as error:
            raise self._error("cannot load positions", error) from error
        return {producer_id: seq_nr for producer_id, seq_nr in rows}

    def _write_own(self, producer_id: str, seq_nr: int) -> None:
        try:
            with self._conn.transaction():
                if seq_nr:
                    self._conn.execute(_RISING, (self.consumer_id, producer_id, seq_nr))
                else:
                    self._conn.execute(_RESET, (self.consumer_id, producer_id))
        except _postgres.Error as error:
            raise self._error("cannot write a position", error) from error

    def _close_own(self) -> None:
        with contextlib.suppress(_postgres.Error):
            self._source.putconn(self._conn)
        self._source.close()
