"""The durable producer queue on PostgreSQL (the ``[postgres]`` extra), usable as a
transactional outbox (`pykka_delivery.delivery.stores.durable_postgres_outbox`).

One database holds the queues of many producers (rows keyed by producer id) beside other
stores and the application's own tables; the tables are prefixed ``durable_``. Same rows
and payload rules as `SqliteDurableQueue` (`durable_rows`).

One writer per producer id, and why it stays correct with a pool: the ``durable_producer``
row carries an ``epoch``, raised by every queue that opens the producer id, and every write
transaction first updates that row *where the epoch is still its own*: a queue whose
producer id was opened by another writer since can never write again (fencing), whatever
happened to its connections. A session advisory lock, held on the queue's connection for
its life, only makes a second opener wait (``lock_timeout``) while the first is alive; the
server releases it when its holder's connection dies (a SIGKILLed process), so a restarted
producer reopens its queue at once. Advisory locks belong to a session, so the queue keeps
one connection from the pool for its life, never returns it mid-way, and if it loses it
takes a new one and the lock again: the epoch check then tells whether it was replaced.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any, NoReturn

from pykka_delivery import _postgres
from pykka_delivery.delivery.stores import durable_postgres_sql as sql
from pykka_delivery.delivery.stores.durable_memory import check_batch
from pykka_delivery.delivery.stores.durable_postgres_sql import (
    LOCK_NAMESPACE,
    SCHEMA,
    SCHEMA_COMPONENT,
    SCHEMA_VERSION,
    PostgresQueueSettings,
)
from pykka_delivery.delivery.stores.durable_queue import (
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.delivery.stores.durable_rows import (
    COLUMNS,
    ConfirmBuffer,
    decode_row,
    encode_row,
)
from pykka_delivery.protocol.serialization import Serialization, default_serialization

__all__ = ["PostgresDurableQueue", "PostgresQueueSettings"]


class PostgresDurableQueue(ConfirmBuffer):
    """A `DurableProducerQueue` in a PostgreSQL database (tables created if missing).

    Args:
        source: a ``postgresql://`` URL (the queue opens a small pool of its own, closed
            with it), a `psycopg_pool.ConnectionPool` shared with the application, or a
            `psycopg.Connection` the queue then uses alone (neither is closed by `close`).
        producer_id: whose queue this is; other producer ids are left alone.
        settings: `PostgresQueueSettings` defaults when None.
        serialization: writes and reads the payloads; `default_serialization` when None
            (as `SqliteDurableQueue`).

    Raises:
        DurableQueueError: another queue holds ``producer_id``, the server cannot be
            reached, or the database holds a newer schema version; the message names the
            database and the fix.
        ValueError: an empty ``producer_id`` or a source that is none of the above.

    Thread-safe; meant for one caller (the producer controller) and the outbox relay.
    """

    def __init__(
        self,
        source: str | _postgres.ConnectionPool | _postgres.Connection,
        producer_id: str,
        settings: PostgresQueueSettings | None = None,
        *,
        serialization: Serialization | None = None,
    ) -> None:
        if not isinstance(producer_id, str) or not producer_id:
            msg = f"producer_id must be a non-empty str, got {producer_id!r}"
            raise ValueError(msg)
        self.settings: PostgresQueueSettings = (
            settings if settings is not None else PostgresQueueSettings()
        )
        self.producer_id = producer_id
        self._serialization = serialization or default_serialization
        self._lock = threading.Lock()
        self._current_seq_nr = 1
        self._epoch = 0
        self._confirmed: dict[str, tuple[int, int]] = {}
        self._pending: dict[str, tuple[int, int]] = {}
        self._pending_count = 0
        # Outbox rows handed to the producer and not stored yet: (payload, outbox id), in
        # order (durable_postgres_outbox.OutboxRelay).
        self.claims: list[tuple[Any, int]] = []
        self._closed = False
        opened = _postgres.open_source(
            source,
            what="PostgresDurableQueue source",
            max_size=self.settings.pool_max_size,
            connect_timeout=self.settings.connect_timeout,
            error=DurableQueueError,
        )
        self.where = f"durable queue {opened.name}"
        self._session = _postgres.LockedSession(
            opened,
            _postgres.advisory_key(LOCK_NAMESPACE, producer_id),
            lock_timeout=self.settings.lock_timeout,
            held=lambda _conn: self._already_open(),
            fail=self._fail,
            lock_name="the producer id's lock",
            synchronous_commit=self.settings.synchronous_commit,
        )
        try:
            self._open(self._session.connection())
        except BaseException:
            self._release()
            raise

    def __repr__(self) -> str:
        return f"PostgresDurableQueue({self._session.source.name!r}, {self.producer_id!r})"

    # --- the DurableProducerQueue protocol ----------------------------------------------------

    def payload_serialization(self) -> Serialization:
        """The serializers payloads are stored with (`EncodesPayloads`)."""
        return self._serialization

    def load_state(self) -> DurableProducerState:
        """The stored state, partially stored chunked messages removed; committed outbox
        rows are numbered first (after the stored messages, in outbox order) and so come
        back as unconfirmed messages to send. Buffered confirmations are written first.

        Raises:
            DurableQueueError: PostgreSQL failed, or a stored payload cannot be read.
        """
        with self._lock, self._write("load the state") as conn:
            self._cleanup_partial(conn)
            sql.take_outbox(conn, self.producer_id, self.where)
            self.claims.clear()
            current, highest = sql.producer_row(conn, self.producer_id, self.where)
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM durable_message_sent WHERE producer_id = %s"
                " ORDER BY seq_nr",
                (self.producer_id,),
            ).fetchall()
            unconfirmed = tuple(
                decode_row(self._serialization, row, self.where, self.producer_id) for row in rows
            )
            confirmed = sql.confirmed_rows(conn, self.producer_id)
        return self._loaded(current, highest, confirmed, unconfirmed)

    def store_message_sent(self, sent: MessageSent) -> None:
        """Store ``sent`` (with the buffered confirmations) in one transaction; storing again
        the seq_nr stored last changes nothing.

        Raises:
            DurableQueueError: the seq_nr is neither the next one nor the last one stored,
                its payload cannot be serialized, or PostgreSQL failed (nothing stored).
        """
        self.store_messages_sent((sent,))

    def store_messages_sent(self, sents: Sequence[MessageSent]) -> None:
        """Store consecutive messages (with the buffered confirmations) in one transaction,
        its rows written with one ``COPY``: all or none. The batch stored last, stored again,
        changes nothing.

        Raises:
            DurableQueueError: the seq_nrs do not follow the stored ones, a payload cannot be
                serialized, or PostgreSQL failed (nothing stored).
        """
        batch = tuple(sents)
        with self._lock:
            self._connection()
            if not check_batch(self._current_seq_nr, batch):
                return
            rows = [
                encode_row(self._serialization, self.producer_id, sent, self.where)
                for sent in batch
            ]
            taken = sql.claimed_ids(self.claims, batch, self.where) if self.claims else ()
            next_seq_nr = batch[-1].seq_nr + 1
            try:
                what = f"store seq_nr {batch[0].seq_nr}..{batch[-1].seq_nr}"
                with self._write(what, next_seq_nr) as conn:
                    with conn.cursor() as cursor, cursor.copy(sql.COPY_SENT) as copy:
                        copy.set_types(sql.COPY_SENT_TYPES)
                        for row in rows:
                            copy.write_row(row)
                    if taken:
                        conn.execute(
                            "DELETE FROM durable_outbox WHERE id = ANY(%s)", (list(taken),)
                        )
            except DurableQueueError:
                if taken and self._current_seq_nr == next_seq_nr:  # the commit did land
                    del self.claims[: len(taken)]
                raise
            self._after_commit()
            self._current_seq_nr = next_seq_nr
            if taken:
                del self.claims[: len(taken)]

    def close(self) -> None:
        """Write the buffered confirmations, release the producer id and the connection
        (and the pool, if the queue opened it). Calling it again does nothing.

        Raises:
            DurableQueueError: the confirmations could not be written (the queue is closed
                all the same; their messages will be sent again).
        """
        with self._lock:
            if self._closed:
                return
            try:
                self._flush_pending()
            finally:
                self._release()

    # --- beyond the protocol ------------------------------------------------------------------

    def cleanup(self, qualifiers: Sequence[str]) -> None:
        """Forget the confirmation records of ``qualifiers`` (workers gone)."""
        gone = list(qualifiers)
        with self._lock:
            self._connection()
            with self._write("clean up qualifiers") as conn:
                conn.execute(
                    "DELETE FROM durable_confirmed WHERE producer_id = %s AND qualifier = ANY(%s)",
                    (self.producer_id, gone),
                )
            self._after_commit()
            for q in gone:
                self._confirmed.pop(q, None)

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    @property
    def source(self) -> _postgres.ConnectionSource:
        """Where the queue takes its connections (the outbox relay reads with it)."""
        return self._session.source

    # --- opening ------------------------------------------------------------------------------

    def _already_open(self) -> DurableQueueError:
        """The error of an open that found the producer id's lock still held."""
        msg = (
            f"{self.where}: producer id {self.producer_id!r} is already open "
            f"(still held after lock_timeout {self.settings.lock_timeout} s). One "
            "producer id has one writer: close that queue or stop its process "
            "first, or give this producer another id."
        )
        return DurableQueueError(msg)

    def _open(self, conn: _postgres.Connection) -> None:
        """Create the tables, take the producer id (a new epoch) and read its row."""
        try:
            with conn.transaction():
                _postgres.create_versioned(
                    conn,
                    SCHEMA,
                    component=SCHEMA_COMPONENT,
                    version=SCHEMA_VERSION,
                    what=self.where,
                    refuse=DurableQueueError,
                )
                conn.execute(
                    "INSERT INTO durable_producer (producer_id, current_seq_nr,"
                    " highest_confirmed_seq_nr) VALUES (%s, 1, 0) ON CONFLICT DO NOTHING",
                    (self.producer_id,),
                )
                row = conn.execute(
                    "UPDATE durable_producer SET epoch = epoch + 1 WHERE producer_id = %s"
                    " RETURNING epoch",
                    (self.producer_id,),
                ).fetchone()
                assert row is not None  # inserted just above
                self._epoch = int(row[0])
                # As Akka's queue at start: drop partially stored chunked messages now.
                self._cleanup_partial(conn)
                self._current_seq_nr = sql.producer_row(conn, self.producer_id, self.where)[0]
                self._confirmed = sql.confirmed_rows(conn, self.producer_id)
        except _postgres.Error as error:
            self._fail(error, "open the queue")

    # --- writing ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _write(self, what: str, next_seq_nr: int | None = None) -> Iterator[_postgres.Connection]:
        """One write transaction, opened with the fence (setting the next seq_nr to
        ``next_seq_nr`` unless None) and the buffered confirmations, all in one round trip
        (a pipeline); committed on exit, rolled back on error. PostgreSQL errors become
        `DurableQueueError`; after one, the mirror is read again (a commit that reported an
        error may have landed)."""
        conn = self._connection()
        pending = self._pending
        try:
            try:
                with _postgres.pipelined(conn):
                    conn.execute("BEGIN")
                    fence = conn.execute(
                        sql.FENCE,
                        (next_seq_nr, sql.highest_of(pending), self.producer_id, self._epoch),
                    )
                    sql.write_confirmations(conn, self.producer_id, pending)
                if fence.rowcount != 1:
                    raise self._fenced() from ValueError("fenced")
                yield conn
            except BaseException:
                with contextlib.suppress(_postgres.Error):  # a broken connection ended it
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except _postgres.Error as error:
            self._resync()
            self._fail(error, what)

    def _fenced(self) -> DurableQueueError:
        """The error of a write the fence refused: another queue opened this producer id
        since this one (raise it from a ValueError: permanent)."""
        msg = (
            f"{self.where}: producer id {self.producer_id!r} was opened by another queue "
            "since this one (a newer epoch): this queue may not write any more. Close it; "
            "only one process may run this producer."
        )
        return DurableQueueError(msg)

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        with self._write("store confirmations"):
            pass  # the confirmations are written as every write opens
        self._after_commit()

    def claim_outbox(self, limit: int) -> list[Any]:
        """Up to ``limit`` committed outbox rows' payloads, oldest first, now the claims the
        next stores take (the previous claims are dropped: their rows are read again).

        Raises:
            DurableQueueError: PostgreSQL failed, or a staged payload cannot be read.
        """
        with self._lock:
            conn = self._connection()
            try:
                claims = sql.read_outbox(
                    conn, self.producer_id, limit, self._serialization, self.where
                )
            except _postgres.Error as error:
                self._fail(error, "read the outbox")
            self.claims[:] = claims
            return [payload for payload, _ in claims]

    def _cleanup_partial(self, conn: _postgres.Connection) -> None:
        current = sql.drop_partial_chunks(conn, self.producer_id, self.where)
        if current is not None:
            self._current_seq_nr = current

    # --- reading ------------------------------------------------------------------------------

    def _resync(self) -> None:
        # A lost connection is replaced (and the lock taken again) at the next call; if the
        # database cannot be read now, the next call reports it.
        with contextlib.suppress(Exception):
            conn = self._connection()
            self._current_seq_nr = sql.producer_row(conn, self.producer_id, self.where)[0]

    # --- connections, errors and release ------------------------------------------------------

    def _connection(self) -> _postgres.Connection:
        if self._closed:
            msg = f"{self!r} is closed; open the queue again with a new PostgresDurableQueue"
            raise DurableQueueError(msg)
        session = self._session
        conn = session.conn
        # LockedSession.lost, spelled out: this runs per batch, a live session costs no call.
        if conn is None or conn.closed or conn.broken:
            # The lost session took the advisory lock with it: take both again, and check
            # the epoch (another queue may have opened this producer id meanwhile).
            conn = session.connection()
            try:
                row = conn.execute(
                    "SELECT epoch FROM durable_producer WHERE producer_id = %s",
                    (self.producer_id,),
                ).fetchone()
                if row is None or int(row[0]) != self._epoch:
                    raise self._fenced() from ValueError("fenced")
                # A commit that failed with the connection may have landed.
                self._current_seq_nr = sql.producer_row(conn, self.producer_id, self.where)[0]
            except _postgres.Error as error:
                self._fail(error, "reconnect")
        return conn

    def _fail(self, error: BaseException, what: str) -> NoReturn:
        where = f"{self.where} (producer id {self.producer_id!r})"
        if _postgres.classify(error) == "transient":
            msg = (
                f"{where}: cannot {what}, PostgreSQL is unreachable or busy "
                f"({type(error).__name__}: {error}). It is retried; check that the server "
                "runs and accepts connections."
            )
            raise DurableQueueError(msg) from error
        msg = (
            f"{where}: cannot {what} ({type(error).__name__}: {error}). Check the database's "
            "permissions and that its durable_ tables were made by pykka-delivery."
        )
        raise DurableQueueError(msg) from error

    def _release(self) -> None:
        self._closed = True
        self._session.release()
