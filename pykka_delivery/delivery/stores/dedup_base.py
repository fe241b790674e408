"""What every deduplication store of pykka-delivery shares: the `DedupStore` Protocol,
its error, the checks of its arguments, and `BufferedDedupStore`, the write-behind rule
of the SQLite and PostgreSQL stores. The contract and the stores: dedup.py (which
re-exports these names)."""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from typing import Any, Protocol, runtime_checkable

from pykka_delivery.errors import ConsumerFenced, DeliveryError

__all__ = [
    "BufferedDedupStore",
    "DedupStore",
    "DedupStoreError",
    "check_consumer_id",
    "check_epoch",
    "check_flush_every",
    "fenced",
]


class DedupStoreError(DeliveryError):
    """A deduplication store could not load, record or flush; the message says what, why
    and what to do."""


@runtime_checkable
class DedupStore(Protocol):
    """Where a consumer keeps the highest confirmed seq_nr per producer id (module
    docstring: the contract).

    Optional, not part of the Protocol (a store of one's own may lack it):
    ``fence(epoch: int) -> None``, the fencing of the module docstring; every store of
    pykka-delivery has it.
    """

    def load(self) -> dict[str, int]:
        """The positions: producer id -> highest confirmed seq_nr."""
        ...

    def record(self, producer_id: str, seq_nr: int) -> None:
        """Set ``producer_id``'s position to ``seq_nr`` (may be buffered until `flush`)."""
        ...

    def flush(self) -> None:
        """Make every recorded position durable (all or none)."""
        ...

    def close(self) -> None:
        """Flush, then release the store."""
        ...


def _check_position(producer_id: str, seq_nr: int) -> None:
    if type(seq_nr) is not int or seq_nr < 0:
        msg = f"seq_nr of producer {producer_id!r} must be an int >= 0, got {seq_nr!r}"
        raise ValueError(msg)


def check_epoch(epoch: int) -> None:
    """Raise `ValueError` unless ``epoch`` is an int >= 0 (a fencing epoch)."""
    if type(epoch) is not int or epoch < 0:
        msg = (
            f"epoch must be an int >= 0 (the fencing epoch of the consumer's activation, "
            f"from its coordinator; 0 for none), got {epoch!r}"
        )
        raise ValueError(msg)


def fenced(store: object, consumer_id: str | None, epoch: int, newer: int) -> ConsumerFenced:
    """The `ConsumerFenced` a store raises when ``newer`` was stored above its ``epoch``."""
    whose = "its consumer" if consumer_id is None else f"consumer id {consumer_id!r}"
    msg = (
        f"{store!r}: {whose} was fenced at epoch {newer} by a newer activation, so this "
        f"store (epoch {epoch}) wrote nothing: another consumer is active in its place "
        f"(what this one did not write is delivered to that one); stop this consumer"
    )
    return ConsumerFenced(msg, epoch, newer)


def check_consumer_id(consumer_id: str) -> None:
    """Raise `ValueError` unless ``consumer_id`` is a non-empty str."""
    if not isinstance(consumer_id, str) or not consumer_id:
        msg = f"consumer_id must be a non-empty string, got {consumer_id!r}"
        raise ValueError(msg)


def check_flush_every(flush_every: int) -> None:
    """Raise `ValueError` unless ``flush_every`` is an int >= 0 (a setting of the stores
    writing behind)."""
    if type(flush_every) is not int or flush_every < 0:
        msg = (
            f"flush_every must be 0 (flush only on flush()) or a number of records "
            f">= 1, got {flush_every!r}"
        )
        raise ValueError(msg)


class BufferedDedupStore(ABC):
    """What the SQLite and PostgreSQL dedup stores share: the positions of one consumer id,
    buffered by `record` and written all at once by `flush` (or every ``flush_every``
    records), read back by `load` with the buffered ones on top.

    A subclass gives its connection (`_connection`, raising `ClosedError` once closed),
    reads and writes the positions and the fencing epoch with it (`_select`, `_upsert`,
    `_store_epoch`), lets go of the consumer id's one-writer lock once fenced (`_unlock`),
    releases it (`_release`), and names its database's error class (``_db_error``) and its
    messages (`_error`).
    """

    _db_error: type[Exception]

    def __init__(self, consumer_id: str, flush_every: int) -> None:
        check_consumer_id(consumer_id)
        self.consumer_id = consumer_id
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._since_flush = 0
        self._flush_every = flush_every
        self._closed = False
        self._epoch: int | None = None  # None: never fenced, the writes check nothing

    def fence(self, epoch: int) -> None:
        """This store now writes for activation ``epoch`` of its consumer id (the contract:
        dedup.py's module docstring). The epoch then keeps older writers out, so the store
        lets go of the consumer id's one-writer lock: the store of a newer activation opens
        even while this one's process still lives (paused, or cut off).

        Raises:
            ConsumerFenced: a higher epoch is stored (nothing changed).
            DedupStoreError: the epoch could not be stored.
            ValueError: ``epoch`` is not an int >= 0.
        """
        check_epoch(epoch)
        with self._lock:
            conn = self._connection()
            try:
                stored = self._store_epoch(conn, epoch)
                if stored <= epoch:
                    self._unlock(conn)
            except self._db_error as error:
                raise self._error(f"cannot store fencing epoch {epoch}", error) from error
            if stored > epoch:
                raise fenced(self, self.consumer_id, epoch, stored)
            self._epoch = epoch

    def load(self) -> dict[str, int]:
        with self._lock:
            conn = self._connection()
            try:
                positions = self._select(conn)
            except self._db_error as error:
                raise self._error("cannot load positions", error) from error
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
        """Flush, then release the store and the consumer id. If the flush fails, the
        store stays open (close again to retry) and `DedupStoreError` is raised; if it was
        fenced out (`ConsumerFenced`), the store is released all the same."""
        with self._lock:
            if self._closed:
                return
            try:
                self._flush()
            except ConsumerFenced:
                self._release()  # its positions are a replaced activation's: dropped
                raise
            self._release()

    def _flush(self) -> None:
        conn = self._connection()
        pending = self._pending
        if not pending:
            return
        epoch = self._epoch
        try:
            newer = self._upsert(conn, pending, epoch)  # one transaction: all or none
        except self._db_error as error:
            raise self._error(
                f"cannot write {len(pending)} position(s) (kept, retried at the next flush)",
                error,
            ) from error
        if newer:
            raise fenced(self, self.consumer_id, epoch or 0, newer)
        pending.clear()
        self._since_flush = 0

    @abstractmethod
    def _connection(self) -> Any:
        """The open connection; `ClosedError` once closed."""

    @abstractmethod
    def _select(self, conn: Any) -> dict[str, int]:
        """The stored positions of this consumer id."""

    @abstractmethod
    def _upsert(self, conn: Any, pending: dict[str, int], epoch: int | None) -> int:
        """Write ``pending`` in one transaction and return 0; unless ``epoch`` is not
        None and a higher one is stored: then write nothing and return that one."""

    @abstractmethod
    def _store_epoch(self, conn: Any, epoch: int) -> int:
        """In one transaction: store ``epoch`` unless a higher one is stored; return the
        stored one."""

    @abstractmethod
    def _unlock(self, conn: Any) -> None:
        """Let go of the consumer id's one-writer lock for good (the store is fenced)."""

    @abstractmethod
    def _release(self) -> None:
        """Mark the store closed (``_closed``), release its connection and consumer id."""

    @abstractmethod
    def _error(self, doing: str, error: Any) -> DedupStoreError:
        """The error for ``error`` raised while ``doing``, naming the store and the fix."""
