"""The SQL of `PostgresDurableQueue`: its settings, its tables, and the statements it runs
inside its transactions (stateless functions of a connection and a producer id; the queue
keeps the state, the lock and the fencing)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pykka_delivery import _postgres
from pykka_delivery._fields import check_field_types
from pykka_delivery._sqlite import check_seconds
from pykka_delivery.delivery.stores.durable_queue import DurableQueueError, MessageSent
from pykka_delivery.delivery.stores.durable_rows import partial_chunk_drops
from pykka_delivery.protocol.messages import ChunkedMessage
from pykka_delivery.protocol.serialization import Serialization, SerializationError

__all__ = [
    "COPY_SENT",
    "COPY_SENT_TYPES",
    "FENCE",
    "LOCK_NAMESPACE",
    "SCHEMA",
    "SCHEMA_COMPONENT",
    "SCHEMA_VERSION",
    "PostgresQueueSettings",
    "claimed_ids",
    "confirmed_rows",
    "drop_partial_chunks",
    "highest_of",
    "producer_row",
    "read_outbox",
    "take_outbox",
    "write_confirmations",
]

SCHEMA_COMPONENT = "durable_producer_queue"
SCHEMA_VERSION = 1
LOCK_NAMESPACE = "pykka_delivery.durable_producer_queue"

_SYNCHRONOUS_COMMIT = ("on", "off", "local", "remote_write", "remote_apply")

SCHEMA = """
CREATE TABLE IF NOT EXISTS durable_producer (
    producer_id TEXT PRIMARY KEY,
    current_seq_nr BIGINT NOT NULL,
    highest_confirmed_seq_nr BIGINT NOT NULL,
    epoch BIGINT NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS durable_message_sent (
    producer_id TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    qualifier TEXT NOT NULL,
    ack SMALLINT NOT NULL,
    timestamp_millis BIGINT NOT NULL,
    chunked SMALLINT NOT NULL,
    first_chunk SMALLINT NOT NULL,
    last_chunk SMALLINT NOT NULL,
    serializer_id INTEGER NOT NULL,
    manifest TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (producer_id, seq_nr)
);
CREATE TABLE IF NOT EXISTS durable_confirmed (
    producer_id TEXT NOT NULL,
    qualifier TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    timestamp_millis BIGINT NOT NULL,
    PRIMARY KEY (producer_id, qualifier)
);
CREATE TABLE IF NOT EXISTS durable_outbox (
    id BIGSERIAL PRIMARY KEY,
    producer_id TEXT NOT NULL,
    timestamp_millis BIGINT NOT NULL,
    serializer_id INTEGER NOT NULL,
    manifest TEXT NOT NULL,
    data BYTEA NOT NULL
);
CREATE INDEX IF NOT EXISTS durable_outbox_by_producer ON durable_outbox (producer_id, id)
"""

# COPY, not INSERTs: a batch is one stream of rows, several times faster than even
# pipelined inserts; binary, as the server parses it faster and the client formats it in
# half the time of text.
COPY_SENT = (
    "COPY durable_message_sent (producer_id, seq_nr, qualifier, ack, timestamp_millis,"
    " chunked, first_chunk, last_chunk, serializer_id, manifest, data) FROM STDIN"
    " (FORMAT BINARY)"
)
COPY_SENT_TYPES = (
    "text",
    "int8",
    "text",
    "int2",
    "int8",
    "int2",
    "int2",
    "int2",
    "int4",
    "text",
    "bytea",
)
"""The types of `COPY_SENT`'s columns, in order (a binary COPY sends each as its type)."""


@dataclass(frozen=True, slots=True)
class PostgresQueueSettings:
    """Settings of `PostgresDurableQueue`.

    Attributes:
        synchronous_commit: PostgreSQL's ``synchronous_commit`` for the queue's
            transactions. ``"on"`` (default): a store returns once the server flushed it
            to its WAL (and to synchronous standbys): it survives a crash of the server
            or its host. ``"off"``: the server acknowledges before the flush; a server
            crash may lose the last commits (never a torn one). Also ``"local"``,
            ``"remote_write"``, ``"remote_apply"`` (standbys).
        lock_timeout: seconds to wait for this producer id while another queue holds it
            (a process shutting down). Default 5.0; finite, >= 0. Past it, opening fails
            with `DurableQueueError`.
        connect_timeout: seconds to wait for a connection (opening the pool, or one from a
            busy pool). Default 10.0; finite, >= 0.
        confirm_flush_every: confirmations buffered before they are written (write-behind,
            as `SqliteQueueSettings.confirm_flush_every`). Default 64; 1 to 1,000,000.
        pool_max_size: connections of the pool the queue opens for a URL (one is held by
            the queue; the outbox relay and reconnections take the others). Default 2;
            1 to 1,000. Unused when a pool or a connection is given.
    """

    synchronous_commit: str = "on"
    lock_timeout: float = 5.0
    connect_timeout: float = 10.0
    confirm_flush_every: int = 64
    pool_max_size: int = 2

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.synchronous_commit not in _SYNCHRONOUS_COMMIT:
            msg = (
                "PostgresQueueSettings.synchronous_commit must be one of "
                f"{', '.join(_SYNCHRONOUS_COMMIT)}, got {self.synchronous_commit!r}"
            )
            raise ValueError(msg)
        check_seconds("PostgresQueueSettings.lock_timeout", self.lock_timeout)
        check_seconds("PostgresQueueSettings.connect_timeout", self.connect_timeout)
        for name, value, high in (
            ("confirm_flush_every", self.confirm_flush_every, 1_000_000),
            ("pool_max_size", self.pool_max_size, 1_000),
        ):
            if not 1 <= value <= high:
                msg = (
                    f"PostgresQueueSettings.{name} must be an int from 1 to {high:,}, got {value!r}"
                )
                raise ValueError(msg)


def producer_row(conn: _postgres.Connection, producer_id: str, where: str) -> tuple[int, int]:
    """``(current_seq_nr, highest_confirmed_seq_nr)`` of ``producer_id``.

    Raises:
        DurableQueueError: the row is gone (the database was changed behind the queue).
    """
    row = conn.execute(
        "SELECT current_seq_nr, highest_confirmed_seq_nr FROM durable_producer"
        " WHERE producer_id = %s",
        (producer_id,),
    ).fetchone()
    if row is None:
        msg = (
            f"{where}: the row of producer id {producer_id!r} is gone (the database was "
            "changed behind this queue); reopen the queue"
        )
        raise DurableQueueError(msg)
    return int(row[0]), int(row[1])


def confirmed_rows(conn: _postgres.Connection, producer_id: str) -> dict[str, tuple[int, int]]:
    """Per qualifier, the confirmed seq_nr and its timestamp."""
    rows = conn.execute(
        "SELECT qualifier, seq_nr, timestamp_millis FROM durable_confirmed WHERE producer_id = %s",
        (producer_id,),
    ).fetchall()
    return {q: (int(s), int(t)) for q, s, t in rows}


FENCE = (
    "UPDATE durable_producer SET current_seq_nr = COALESCE(%s, current_seq_nr),"
    " highest_confirmed_seq_nr = GREATEST(highest_confirmed_seq_nr, %s)"
    " WHERE producer_id = %s AND epoch = %s"
)
"""Every write's first statement: lock the producer id's row if the epoch is still the
queue's, setting its next seq_nr (NULL: unchanged) and highest confirmed seq_nr; it
updates no row if another queue opened the producer id since."""

# Deletes from just above the qualifier's confirmed seq_nr (read in the same snapshot,
# before the upsert): the rows below are gone already, and a range from the start would
# walk every dead row earlier confirmations left in the index until vacuum.
_CONFIRM = (
    "WITH earlier AS (SELECT seq_nr FROM durable_confirmed WHERE producer_id = %(p)s"
    " AND qualifier = %(q)s), deleted AS (DELETE FROM durable_message_sent"
    " WHERE producer_id = %(p)s AND qualifier = %(q)s AND seq_nr <= %(s)s"
    " AND seq_nr > COALESCE((SELECT seq_nr FROM earlier), 0))"
    " INSERT INTO durable_confirmed (producer_id, qualifier, seq_nr, timestamp_millis)"
    " VALUES (%(p)s, %(q)s, %(s)s, %(t)s) ON CONFLICT (producer_id, qualifier) DO UPDATE"
    " SET seq_nr = excluded.seq_nr, timestamp_millis = excluded.timestamp_millis"
    " WHERE excluded.seq_nr > durable_confirmed.seq_nr"
)


def write_confirmations(
    conn: _postgres.Connection, producer_id: str, pending: Mapping[str, tuple[int, int]]
) -> None:
    """Write the confirmations ``pending`` (qualifier -> (seq_nr, timestamp)) and delete
    the rows they confirm, one statement per qualifier (inside the caller's transaction;
    the producer row's ``highest_confirmed_seq_nr`` is the caller's, see `highest_of`)."""
    for qualifier, (seq_nr, timestamp_millis) in pending.items():
        conn.execute(
            _CONFIRM, {"p": producer_id, "q": qualifier, "s": seq_nr, "t": timestamp_millis}
        )


def highest_of(pending: Mapping[str, tuple[int, int]]) -> int:
    """The highest seq_nr of the confirmations ``pending``; 0 if none."""
    return max((seq_nr for seq_nr, _ in pending.values()), default=0)


def drop_partial_chunks(conn: _postgres.Connection, producer_id: str, where: str) -> int | None:
    """Delete the rows of partially stored chunked messages and move the next seq_nr back
    (`durable_rows.partial_chunk_drops`); returns the new next seq_nr, None if none."""
    partial = conn.execute(
        "SELECT 1 FROM durable_message_sent WHERE producer_id = %s AND chunked = 1"
        " AND NOT (first_chunk = 1 AND last_chunk = 1) LIMIT 1",
        (producer_id,),
    ).fetchone()
    if partial is None:
        return None
    current, highest = producer_row(conn, producer_id, where)
    flags = conn.execute(
        "SELECT seq_nr, chunked, first_chunk, last_chunk FROM durable_message_sent"
        " WHERE producer_id = %s ORDER BY seq_nr",
        (producer_id,),
    ).fetchall()
    dropped, current = partial_chunk_drops(current, highest, flags)
    conn.execute(
        "DELETE FROM durable_message_sent WHERE producer_id = %s AND seq_nr = ANY(%s)",
        (producer_id, dropped),
    )
    conn.execute(
        "UPDATE durable_producer SET current_seq_nr = %s WHERE producer_id = %s",
        (current, producer_id),
    )
    return current


def take_outbox(conn: _postgres.Connection, producer_id: str, where: str) -> None:
    """Number the committed outbox rows after the stored messages and move them into the
    queue, in the caller's transaction (the producer owns the numbering: see
    `durable_postgres_outbox`)."""
    current = producer_row(conn, producer_id, where)[0]
    moved = conn.execute(
        "WITH taken AS (DELETE FROM durable_outbox WHERE producer_id = %s"
        " RETURNING id, timestamp_millis, serializer_id, manifest, data)"
        " INSERT INTO durable_message_sent (producer_id, seq_nr, qualifier, ack,"
        " timestamp_millis, chunked, first_chunk, last_chunk, serializer_id, manifest,"
        " data) SELECT %s, %s + row_number() OVER (ORDER BY id) - 1, '', 0,"
        " timestamp_millis, 0, 1, 1, serializer_id, manifest, data FROM taken",
        (producer_id, producer_id, current),
    ).rowcount
    if moved > 0:
        conn.execute(
            "UPDATE durable_producer SET current_seq_nr = %s WHERE producer_id = %s",
            (current + moved, producer_id),
        )


def read_outbox(
    conn: _postgres.Connection,
    producer_id: str,
    limit: int,
    serialization: Serialization,
    where: str,
) -> list[tuple[Any, int]]:
    """Up to ``limit`` committed outbox rows of ``producer_id``, oldest first, as
    ``(payload, outbox id)``.

    Raises:
        DurableQueueError: a payload cannot be read with ``serialization``.
    """
    rows = conn.execute(
        "SELECT id, serializer_id, manifest, data FROM durable_outbox"
        " WHERE producer_id = %s ORDER BY id LIMIT %s",
        (producer_id, limit),
    ).fetchall()
    claims: list[tuple[Any, int]] = []
    for outbox_id, serializer_id, manifest, data in rows:
        try:
            payload = serialization.deserialize(serializer_id, manifest, bytes(data))
        except SerializationError as error:
            msg = (
                f"{where}: outbox row {outbox_id} of producer id {producer_id!r}: cannot "
                f"read its payload ({error}); give this queue the Serialization stage() "
                "wrote it with"
            )
            raise DurableQueueError(msg) from error
        claims.append((payload, int(outbox_id)))
    return claims


def claimed_ids(
    claims: list[tuple[Any, int]], batch: tuple[MessageSent, ...], where: str
) -> tuple[int, ...]:
    """The outbox ids of the ``claims`` (handed to the producer, in order) that ``batch``
    stores: the relay is the producer's only sender, so its messages are the claims in
    order (a chunked one's when its last chunk is stored).

    Raises:
        DurableQueueError: a message that is not the next claim (another sender).
    """
    taken: list[int] = []
    for sent in batch:
        if len(taken) == len(claims):
            break
        message = sent.message
        if isinstance(message, ChunkedMessage):
            if message.last_chunk:
                taken.append(claims[len(taken)][1])
        elif message is claims[len(taken)][0]:
            taken.append(claims[len(taken)][1])
        else:
            msg = (
                f"{where}: seq_nr {sent.seq_nr} is not the outbox row the relay handed out "
                "next: a producer fed by an OutboxRelay must have no other sender (stage() "
                "the application's messages instead)"
            )
            raise DurableQueueError(msg) from ValueError("another sender")
    return tuple(taken)
