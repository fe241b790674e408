"""Deduplication inside the application's own transaction: exactly-once effect.

A `DedupStore` with a connection of its own (`SqliteDedupStore`) writes a consumer's
positions in transactions of its own, behind the application's effects: a consumer killed
after it applied a message but before that position was written applies the message again
when it is redelivered. A *transactional* store keeps the positions in the application's
own database instead, and the handler writes the message's position in the very
transaction that applies its effect::

    store = SqliteTxDedupStore("app.db", "billing")
    consumer = Consumer(dedup_store=store)
    conn = sqlite3.connect("app.db", isolation_level=None)
    for delivery in consumer:
        with store.transaction(conn, delivery):
            conn.execute("INSERT INTO invoices ...")  # the effect
        delivery.confirm()  # after the commit

The effect and the position commit together or not at all; when the consumer restarts (or
the next one takes over), the store loads the positions and the consumer does not deliver
what was applied (the consumer core's floor, consumer_dedup.py).

Fencing at the sink: the position row only rises. Writing a position at or below the one
stored raises `AlreadyApplied` inside the transaction, which `transaction` rolls back: a
consumer that was replaced while it still handled a message (a hand-over, a paused
process) cannot apply it a second time after its successor did. This holds whatever the
timing, since the check and the effect commit in one transaction.

Fencing by epoch (`fence`, dedup.py) goes further: once the store of a newer activation
of the consumer id was fenced, every transaction of an older fenced store raises
`ConsumerFenced` where it writes its position, so `transaction` rolls the effect back
with it, whatever message it was (not only one the newer consumer applied already). The
epoch is a row per consumer id (``pykka_delivery_dedup_fence``) read by the statement
that writes the position; a store never fenced does not read it.

Confirmations the application did not record (``confirm()`` without `transaction` or
`record_in`, or a message sent to the dead letters) are written by the store in a
transaction of its own when the consumer records them (write-through, with a warning the
first time): the position stays right, but such an effect is only at least once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pykka_delivery import _sqlite
from pykka_delivery._fields import check_field_types
from pykka_delivery.delivery.stores.dedup_base import (
    DedupStoreError,
    _check_position,
    check_consumer_id,
    check_epoch,
    fenced,
)
from pykka_delivery.errors import ClosedError, DeliveryError

__all__ = [
    "AlreadyApplied",
    "SqliteTxDedupSettings",
    "SqliteTxDedupStore",
    "TxDedupStore",
    "transactional",
]

logger = logging.getLogger("pykka_delivery.consumer")

# What `_write_rising` returns besides a newer epoch: written, or at or above it already.
WRITTEN = 0
APPLIED = -1


class AlreadyApplied(DeliveryError):
    """`TxDedupStore.record_in` found the message's position recorded already: its effect
    was applied before (by this consumer, or by one that replaced it). Roll the
    transaction back, then confirm the delivery (`TxDedupStore.transaction` rolls back
    itself and ends the block normally)."""


class Positioned(Protocol):
    """What a transaction needs of a delivery: a `Delivery` or a `GroupDelivery`."""

    @property
    def producer_id(self) -> str: ...

    @property
    def seq_nr(self) -> int: ...


class TxDedupStore(ABC):
    """A `DedupStore` whose positions live in the application's database (module
    docstring). Subclasses supply the database's dialect: `SqliteTxDedupStore`, and
    ``PostgresTxDedupStore`` (dedup_tx_postgres.py, the ``[postgres]`` extra).

    Attributes:
        consumer_id: whose positions these are.
        already_applied: transactions rolled back by `transaction` because their message
            had been applied before.
    """

    consumer_id: str

    def __init__(self, consumer_id: str) -> None:
        check_consumer_id(consumer_id)
        self.consumer_id = consumer_id
        self.already_applied = 0
        self._lock = threading.Lock()  # the store's own connection
        self._closed = False
        self._warned = False
        # Positions written in the application's transactions (producer id -> seq_nr):
        # the consumer's `record` of them then writes nothing.
        self._written: dict[str, int] = {}
        self._inside = threading.local()  # in a `transaction` body on this thread
        self._epoch: int | None = None  # None: never fenced, the writes check nothing

    def fence(self, epoch: int) -> None:
        """This store now writes for activation ``epoch`` of its consumer id: from now
        on a position written (in the application's transaction or the store's own) once
        a higher epoch was stored raises `ConsumerFenced` instead (dedup.py).

        Raises:
            ConsumerFenced: a higher epoch is stored (nothing changed).
            DedupStoreError: the epoch could not be stored.
            ValueError: ``epoch`` is not an int >= 0.
        """
        check_epoch(epoch)
        with self._lock:
            self._check_open()
            stored = self._store_epoch(epoch)
            if stored > epoch:
                raise fenced(self, self.consumer_id, epoch, stored)
            self._epoch = epoch

    # --- the application's side ---------------------------------------------------------

    @contextlib.contextmanager
    def transaction(self, conn: Any, delivery: Positioned) -> Iterator[Any]:
        """Begin a transaction on the application's connection ``conn``, let the body
        apply the effect of ``delivery`` on it, then record the delivery's position in it
        and commit. Confirm the delivery after the ``with`` block, not inside it.

        If the body raises, the transaction is rolled back and the error propagates (do
        not confirm: reject, or let it come again). If the message was applied before
        (`AlreadyApplied`), the transaction is rolled back and the block ends normally:
        confirm it all the same.

        Yields:
            ``conn``.

        Raises:
            ValueError: ``conn`` is in a transaction already (commit it first, or call
                `record_in` inside your own transaction).
            DedupStoreError: the position could not be written (``conn`` is not a
                connection to this store's database, or the database failed).
        """
        self._begin(conn)
        inside = self._inside
        inside.open = True
        try:
            yield conn
            self.record_in(conn, delivery)
        except AlreadyApplied:
            self._rollback(conn)
            self.already_applied += 1
            return
        except BaseException:
            self._rollback(conn)
            raise
        finally:
            inside.open = False
        self._commit(conn)

    def record_in(self, conn: Any, delivery: Positioned) -> None:
        """Write ``delivery``'s position in ``conn``'s open transaction (the one applying
        its effect); commit it before confirming the delivery.

        Raises:
            AlreadyApplied: the position is recorded already (the effect was applied
                before): roll the transaction back, then confirm the delivery.
            ConsumerFenced: the store was fenced and a newer activation's epoch is
                stored: roll the transaction back and stop the consumer.
            DedupStoreError: the position could not be written.
        """
        producer_id, seq_nr = delivery.producer_id, delivery.seq_nr
        if seq_nr.__class__ is not int or seq_nr < 1:
            msg = f"seq_nr of producer {producer_id!r} must be an int >= 1, got {seq_nr!r}"
            raise ValueError(msg)
        self._written[producer_id] = seq_nr
        outcome = self._write_rising(conn, producer_id, seq_nr, self._epoch)
        if outcome:
            if outcome > 0:
                raise fenced(self, self.consumer_id, self._epoch or 0, outcome)
            raise AlreadyApplied(
                f"seq_nr {seq_nr} of producer {producer_id!r} was applied before by consumer "
                f"{self.consumer_id!r}: roll the transaction back and confirm the delivery"
            )

    # --- the consumer's side (the DedupStore protocol) ------------------------------------

    def load(self) -> dict[str, int]:
        with self._lock:
            self._check_open()
            positions = self._select()
        self._written.update(positions)
        return positions

    def record(self, producer_id: str, seq_nr: int) -> None:
        # Called once per confirmation: written in the application's transaction already.
        if seq_nr.__class__ is not int or seq_nr < 0:
            _check_position(producer_id, seq_nr)
        if self._closed:
            self._check_open()
        if 0 < seq_nr <= self._written.get(producer_id, 0):
            return
        if getattr(self._inside, "open", False):
            msg = (
                f"{self!r}: seq_nr {seq_nr} of {producer_id!r} was confirmed inside "
                "store.transaction(...), before its commit: confirm after the with block"
            )
            raise DedupStoreError(msg)
        if seq_nr and not self._warned:
            self._warned = True
            logger.warning(
                "%r: seq_nr %d of %r was confirmed without its position recorded in the "
                "application's transaction (store.transaction or store.record_in): writing "
                "it in a transaction of its own, so its effect is at least once, not exactly "
                "once (expected for a message sent to the dead letters)",
                self,
                seq_nr,
                producer_id,
            )
        with self._lock:
            self._check_open()
            newer = self._write_own(producer_id, seq_nr, self._epoch)
        if newer:
            raise fenced(self, self.consumer_id, self._epoch or 0, newer)
        self._written[producer_id] = seq_nr

    def flush(self) -> None:
        """Nothing to do: every position is written when it is recorded."""
        self._check_open()

    def close(self) -> None:
        """Release the store's own connection (the application's stay open)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_own()

    def _check_open(self) -> None:
        if self._closed:
            msg = f"{self!r} was closed; create a new one"
            raise ClosedError(msg)

    # --- the dialect -----------------------------------------------------------------------

    @abstractmethod
    def _begin(self, conn: Any) -> None:
        """Begin a transaction on the application's ``conn``."""

    @abstractmethod
    def _commit(self, conn: Any) -> None:
        """Commit ``conn``'s transaction."""

    @abstractmethod
    def _rollback(self, conn: Any) -> None:
        """Roll ``conn``'s transaction back."""

    @abstractmethod
    def _write_rising(self, conn: Any, producer_id: str, seq_nr: int, epoch: int | None) -> int:
        """In ``conn``'s transaction: set the position if ``seq_nr`` is above it
        (`WRITTEN`), `APPLIED` if it is not; unless ``epoch`` is not None and a higher one
        is stored: then write nothing and return that one."""

    @abstractmethod
    def _select(self) -> dict[str, int]:
        """The positions, read on the store's own connection."""

    @abstractmethod
    def _write_own(self, producer_id: str, seq_nr: int, epoch: int | None) -> int:
        """Set the position in a transaction of the store's own (rising; 0 forgets it) and
        return 0; unless ``epoch`` is not None and a higher one is stored: then write
        nothing and return that one."""

    @abstractmethod
    def _store_epoch(self, epoch: int) -> int:
        """In a transaction of the store's own: store ``epoch`` unless a higher one is
        stored; return the stored one."""

    @abstractmethod
    def _close_own(self) -> None:
        """Close the store's own connection."""


# --- SQLite --------------------------------------------------------------------------------

SCHEMA_COMPONENT = "dedup_tx"
SCHEMA_VERSION = 2  # 2: the fence table (fencing epochs; version 1 gets it on opening)
_TABLE = "pykka_delivery_dedup_position"
_FENCES = "pykka_delivery_dedup_fence"
_VERSIONS = "pykka_delivery_schema_version"

# Prefixed: these tables live in the application's own database, beside its tables.
_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {_VERSIONS} (
    component TEXT PRIMARY KEY,
    version INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS {_TABLE} (
    consumer_id TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    seq_nr INTEGER NOT NULL,
    PRIMARY KEY (consumer_id, producer_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS {_FENCES} (
    consumer_id TEXT PRIMARY KEY,
    epoch INTEGER NOT NULL
) WITHOUT ROWID;
"""

_RISING = (
    f"INSERT INTO {_TABLE} (consumer_id, producer_id, seq_nr) VALUES (?, ?, ?) "
    f"ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = excluded.seq_nr "
    f"WHERE excluded.seq_nr > {_TABLE}.seq_nr"
)
_RESET = (
    f"INSERT INTO {_TABLE} (consumer_id, producer_id, seq_nr) VALUES (?, ?, 0) "
    f"ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = 0"
)
# A fenced store's write: nothing if a higher epoch than its own (the last ?) is stored.
_RISING_FENCED = (
    f"INSERT INTO {_TABLE} (consumer_id, producer_id, seq_nr) SELECT ?, ?, ? "
    f"WHERE coalesce((SELECT epoch FROM {_FENCES} WHERE consumer_id = ?), 0) <= ? "
    f"ON CONFLICT (consumer_id, producer_id) DO UPDATE SET seq_nr = excluded.seq_nr "
    f"WHERE excluded.seq_nr > {_TABLE}.seq_nr"
)
_FENCE = (
    f"INSERT INTO {_FENCES} (consumer_id, epoch) VALUES (?, ?) "
    f"ON CONFLICT (consumer_id) DO UPDATE SET epoch = excluded.epoch "
    f"WHERE excluded.epoch > {_FENCES}.epoch"
)
_EPOCH = f"SELECT coalesce(max(epoch), 0) FROM {_FENCES} WHERE consumer_id = ?"
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL")


@dataclass(frozen=True, slots=True)
class SqliteTxDedupSettings:
    """Settings of a `SqliteTxDedupStore`'s own connection (the application's
    transactions follow the application's connection settings).

    Attributes:
        synchronous: the fsync policy of the store's own writes (positions it writes
            through, `SqliteDedupSettings`): ``"normal"`` (default), ``"full"`` or
            ``"off"``. The effects' commits follow the application's connection's
            ``PRAGMA synchronous``.
        busy_timeout: seconds a statement of the store waits while the application
            writes to the database. Default 5.
    """

    synchronous: str = "normal"
    busy_timeout: float = 5.0

    def __post_init__(self) -> None:
        check_field_types(self)
        _sqlite.check_synchronous(self.synchronous, _SYNCHRONOUS)
        _sqlite.check_seconds("busy_timeout", self.busy_timeout)


class SqliteTxDedupStore(TxDedupStore):
    """A transactional `DedupStore` (module docstring) in the application's SQLite
    database: its positions are a table there (``pykka_delivery_dedup_position``, created
    if missing, the database switched to WAL mode), written by the application's
    transactions through `transaction` or `record_in`.

    Many consumers may share a database, keyed by ``consumer_id``; two stores of one
    consumer id at once are safe (the position only rises: `AlreadyApplied`).

    Args:
        path: the application's database file; open the application's connections to
            the same file (``sqlite3.connect(path, isolation_level=None)``: `transaction`
            begins and commits itself).
        consumer_id: whose positions these are: the consumer that replaces this one (after
            a crash, on another node sharing the file) uses the same id.
        settings: see `SqliteTxDedupSettings`.

    Raises:
        DedupStoreError: the file cannot be opened, is not an SQLite database, or was
            written by a newer version.
        ValueError: an empty consumer id, or ``":memory:"`` (the positions must be in
            the database of the effects).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        consumer_id: str,
        settings: SqliteTxDedupSettings | None = None,
    ) -> None:
        super().__init__(consumer_id)
        if str(path) == _sqlite.MEMORY:
            msg = (
                "SqliteTxDedupStore needs the application's database file, not ':memory:': "
                "the positions must be in the database its effects are written to"
            )
            raise ValueError(msg)
        self.settings = settings = settings or SqliteTxDedupSettings()
        self.path = Path(path)
        self._conn = _sqlite.open_wal(
            self.path,
            busy_timeout=settings.busy_timeout,
            synchronous=settings.synchronous.upper(),
            prepare=self._prepare,
            error=lambda error: self._error("cannot be opened", error),
        )

    def __repr__(self) -> str:
        return f"SqliteTxDedupStore({str(self.path)!r}, {self.consumer_id!r})"

    def _prepare(self, conn: sqlite3.Connection) -> None:
        _sqlite.prepare_versioned(
            conn,
            _SCHEMA,
            component=SCHEMA_COMPONENT,
            version=SCHEMA_VERSION,
            what=f"transactional dedup store {self.path}",
            refuse=DedupStoreError,
            versions_table=_VERSIONS,
        )

    def _error(self, doing: str, error: sqlite3.Error) -> DedupStoreError:
        kind = _sqlite.classify(error)
        if kind == "locked":
            fix = (
                f"the application kept the database busy longer than busy_timeout "
                f"({self.settings.busy_timeout} s): retry, or raise busy_timeout"
            )
        elif kind == "unreadable":
            fix = "the file is not an SQLite database or is corrupt: restore it from a backup"
        elif "no such table" in str(error):
            fix = (
                f"the connection is not to {self.path}: write the position in the "
                f"database of the effect, which SqliteTxDedupStore was given"
            )
        else:
            fix = "check that the file and its directory are writable and the disk not full"
        return DedupStoreError(f"transactional dedup store {self.path}: {doing} ({error}); {fix}")

    def _begin(self, conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            msg = (
                f"{self!r}.transaction: the connection is in a transaction already; commit "
                f"or roll it back first, or call record_in(conn, delivery) inside it"
            )
            raise ValueError(msg)
        # IMMEDIATE: the write lock now, so that the commit cannot fail as "busy" midway.
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as error:
            raise self._error("cannot begin a transaction", error) from error

    def _commit(self, conn: sqlite3.Connection) -> None:
        try:
            conn.commit()
        except sqlite3.Error as error:
            with contextlib.suppress(sqlite3.Error):
                conn.rollback()
            raise self._error("cannot commit the effect and its position", error) from error

    def _rollback(self, conn: sqlite3.Connection) -> None:
        with contextlib.suppress(sqlite3.Error):  # a failed commit may have ended it
            conn.rollback()

    def _write_rising(
        self, conn: sqlite3.Connection, producer_id: str, seq_nr: int, epoch: int | None
    ) -> int:
        consumer_id = self.consumer_id
        try:
            if epoch is None:
                written = conn.execute(_RISING, (consumer_id, producer_id, seq_nr)).rowcount
                return WRITTEN if written > 0 else APPLIED
            args = (consumer_id, producer_id, seq_nr, consumer_id, epoch)
            if conn.execute(_RISING_FENCED, args).rowcount > 0:
                return WRITTEN
            newer: int = conn.execute(_EPOCH, (consumer_id,)).fetchone()[0]
        except sqlite3.Error as error:
            raise self._error("cannot write a position", error) from error
        return newer if newer > epoch else APPLIED

    def _select(self) -> dict[str, int]:
        try:
            rows = self._conn.execute(
                f"SELECT producer_id, seq_nr FROM {_TABLE} WHERE consumer_id = ?",
                (self.consumer_id,),
            ).fetchall()
        except sqlite3.Error as error:
            raise self._error("cannot load positions", error) from error
        return dict(rows)

    def _write_own(self, producer_id: str, seq_nr: int, epoch: int | None) -> int:
        conn = self._conn
        consumer_id = self.consumer_id
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                if epoch is None:
                    if seq_nr:
                        conn.execute(_RISING, (consumer_id, producer_id, seq_nr))
                    else:
                        conn.execute(_RESET, (consumer_id, producer_id))
                    return 0
                newer: int = conn.execute(_EPOCH, (consumer_id,)).fetchone()[0]
                if newer > epoch:
                    return newer
                if seq_nr:
                    conn.execute(_RISING, (consumer_id, producer_id, seq_nr))
                else:
                    conn.execute(_RESET, (consumer_id, producer_id))
        except sqlite3.Error as error:
            raise self._error("cannot write a position", error) from error
        return 0

    def _store_epoch(self, epoch: int) -> int:
        conn = self._conn
        try:
            with conn:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(_FENCE, (self.consumer_id, epoch))
                stored: int = conn.execute(_EPOCH, (self.consumer_id,)).fetchone()[0]
        except sqlite3.Error as error:
            raise self._error(f"cannot store fencing epoch {epoch}", error) from error
        return stored

    def _close_own(self) -> None:
        self._conn.close()


def transactional(store: object, owner: str) -> TxDedupStore:
    """``store`` if it records in the application's transaction, for ``owner``'s
    ``transaction`` method.

    Raises:
        TypeError: it does not (or there is none), naming the fix.
    """
    if not isinstance(store, TxDedupStore):
        msg = (
            f"{owner}.transaction needs a deduplication store that records in the "
            f"application's transaction (dedup_store=SqliteTxDedupStore(...)), but it has "
            f"{store!r}"
        )
        raise TypeError(msg)
    return store
