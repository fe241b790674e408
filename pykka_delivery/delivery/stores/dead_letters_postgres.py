"""`PostgresDeadLetters`: dead letters in a PostgreSQL table (the ``[postgres]`` extra),
the twin of `SqliteDeadLetters` (dead_letters.py): listable and deletable from any host
that reaches the database, so an operator can inspect and replay what failed.

Each `put` is one short transaction on a connection taken from the store's pool (or the
one connection it was given): a lost connection is replaced by the pool at the next call.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from pykka_delivery import _postgres
from pykka_delivery._sqlite import check_seconds
from pykka_delivery.delivery.stores.dead_letters import (
    COLUMNS,
    DeadLetter,
    DeadLetterError,
    StoredDeadLetter,
    letter_row,
    letters_query,
    stored_letters,
)
from pykka_delivery.protocol.serialization import Serialization, default_serialization

__all__ = ["PostgresDeadLetters"]

SCHEMA_COMPONENT = "dead_letters"
SCHEMA_VERSION = 1

SCHEMA = """
CREATE TABLE IF NOT EXISTS dead_letters (
    id BIGSERIAL PRIMARY KEY,
    producer_id TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    serializer_id INTEGER NOT NULL,
    manifest TEXT NOT NULL,
    data BYTEA NOT NULL,
    reason TEXT NOT NULL,
    attempts INTEGER NOT NULL,
    timestamp_millis BIGINT NOT NULL
)
"""


class PostgresDeadLetters:
    """Dead letters in the table ``dead_letters`` of a PostgreSQL database (created if
    missing).

    Args:
        source: a ``postgresql://`` URL (the store opens a small pool of its own, closed
            with it), a `psycopg_pool.ConnectionPool` shared with the application, or a
            `psycopg.Connection` the store then uses alone (neither is closed by `close`).
        connect_timeout: seconds to wait for a connection. Default 10; finite, >= 0.
        serialization: turns messages to bytes and back; default `default_serialization`.

    Raises:
        DeadLetterError: the server cannot be reached, or the database holds a newer
            schema version.
        ValueError: a source that is none of the above, or a bad ``connect_timeout``.
    """

    def __init__(
        self,
        source: Any,
        *,
        connect_timeout: float = 10.0,
        serialization: Serialization | None = None,
    ) -> None:
        check_seconds("connect_timeout", connect_timeout)
        self._serialization = serialization or default_serialization
        self._lock = threading.Lock()  # one connection when given one: one call at a time
        self._closed = False
        self._source = _postgres.open_source(
            source,
            what="PostgresDeadLetters",
            max_size=1,
            connect_timeout=connect_timeout,
            error=DeadLetterError,
        )
        self.name = self._source.name
        try:
            with self._transaction("cannot set it up") as conn:
                _postgres.create_versioned(
                    conn,
                    SCHEMA,
                    component=SCHEMA_COMPONENT,
                    version=SCHEMA_VERSION,
                    what=repr(self),
                    refuse=DeadLetterError,
                )
        except BaseException:
            self._closed = True
            self._source.close()
            raise

    def __repr__(self) -> str:
        return f"PostgresDeadLetters({self.name!r})"

    def put(self, letter: DeadLetter) -> None:
        row = letter_row(self._serialization, letter)
        with self._transaction(f"cannot write seq_nr {letter.seq_nr}") as conn:
            conn.execute(
                f"INSERT INTO dead_letters ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                row,
            )

    def letters(self, producer_id: str | None = None, limit: int = 1000) -> list[StoredDeadLetter]:
        """The oldest ``limit`` letters (of ``producer_id``, if given), oldest first."""
        query, params = letters_query(producer_id, limit, "%s")
        with self._transaction("cannot list letters") as conn:
            rows = conn.execute(query, params).fetchall()
        return stored_letters(self._serialization, rows)

    def count(self) -> int:
        with self._transaction("cannot count letters") as conn:
            row = conn.execute("SELECT COUNT(*) FROM dead_letters").fetchone()
        return int(row[0]) if row is not None else 0

    def delete(self, ids: list[int]) -> None:
        """Remove the letters with these ids (once replayed or dealt with)."""
        with self._transaction("cannot delete letters") as conn:
            conn.execute("DELETE FROM dead_letters WHERE id = ANY(%s)", (list(ids),))

    def close(self) -> None:
        """Release the pool if the store opened it; a second close does nothing."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._source.close()

    def __enter__(self) -> PostgresDeadLetters:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _transaction(self, doing: str) -> Iterator[_postgres.Connection]:
        """A connection in one transaction, committed on exit; PostgreSQL errors become
        `DeadLetterError` naming what failed."""
        with self._lock:
            if self._closed:
                msg = f"{self!r} was closed; open the store again with a new PostgresDeadLetters"
                raise DeadLetterError(msg)
            try:
                conn = self._source.getconn()
            except Exception as error:
                raise self._error(doing, error) from error
            try:
                with conn.transaction():
                    yield conn
            except _postgres.Error as error:
                raise self._error(doing, error) from error
            finally:
                self._source.putconn(conn)

    def _error(self, doing: str, error: BaseException) -> DeadLetterError:
        if _postgres.classify(error) == "transient":
            fix = "PostgreSQL was unreachable or busy: check that the server runs, then retry"
        else:
            fix = "check the database's permissions and that its dead_letters table is ours"
        return DeadLetterError(f"{self!r}: {doing}: {error} ({fix})")
