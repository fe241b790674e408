"""Dead letters: where a message goes when its consumer gave up on it.

A consumer that cannot process a delivery rejects it (``delivery.reject(reason)``) instead
of confirming it. The consumer controller hands the same message again after a backoff,
up to ``ConsumerControllerSettings.max_attempts`` deliveries in all; after the last
rejection it writes a `DeadLetter` (the message, the last reason, how many attempts) to
its dead-letter destination and moves on as if the message were confirmed, so one poison
message never blocks the stream.

The write comes first: the stream moves on only once the destination has the letter, so
a rejected message is in one of two places, never in neither. A destination that fails
makes the controller stop with the error (the message stays unconfirmed at the producer
and is delivered again to the next consumer controller).

Destinations:

* `SqliteDeadLetters`: the default, a table in an SQLite file (WAL), listable and
  deletable, so an operator can inspect and replay what failed.
* ``PostgresDeadLetters`` (dead_letters_postgres.py, the ``[postgres]`` extra): the same
  in a PostgreSQL table, reachable from every host.
* `ProducerDeadLetters`: send each letter on through a `Producer` handle, as a
  ``DeadLetter`` protobuf message (``delivery.proto``) to another stream.
* `MemoryDeadLetters`: for tests, with failure injection.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pykka_delivery import _sqlite
from pykka_delivery.delivery.core.effects import WriteDeadLetter
from pykka_delivery.delivery.stores.backends import backend_of
from pykka_delivery.errors import DeliveryError
from pykka_delivery.protocol import delivery_pb2
from pykka_delivery.protocol.serialization import Serialization, default_serialization

__all__ = [
    "DeadLetter",
    "DeadLetterDestination",
    "DeadLetterError",
    "MemoryDeadLetters",
    "ProducerDeadLetters",
    "SqliteDeadLetters",
    "StoredDeadLetter",
    "StoredDeadLetters",
    "dead_letter_destination",
    "write_dead_letter",
]


class DeadLetterError(DeliveryError):
    """A dead letter could not be written; the message names the destination and why."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message its consumer gave up on.

    Attributes:
        producer_id: the stream the message came from.
        seq_nr: its seq_nr in that stream (the last piece's, for a chunked message).
        message: the message, as the consumer was given it.
        reason: why the last attempt failed (the consumer's words).
        attempts: how many times it was delivered.
        timestamp_millis: when it was given up on (milliseconds since the epoch).
    """

    producer_id: str
    seq_nr: int
    message: Any
    reason: str
    attempts: int
    timestamp_millis: int


@runtime_checkable
class DeadLetterDestination(Protocol):
    """Where dead letters go. `put` returns once the letter is kept (or raises
    `DeadLetterError`); it is called from the consumer's thread."""

    def put(self, letter: DeadLetter) -> None: ...


@runtime_checkable
class StoredDeadLetters(DeadLetterDestination, Protocol):
    """A destination that keeps its letters to be read back and removed (SQLite,
    PostgreSQL): what the ``dead-letters`` command lists, replays and purges."""

    def letters(self, producer_id: str | None = None, limit: int = 1000) -> list[StoredDeadLetter]:
        """The oldest ``limit`` letters (of ``producer_id``, if given), oldest first."""
        ...

    def count(self) -> int:
        """How many letters are kept."""
        ...

    def delete(self, ids: list[int]) -> None:
        """Remove the letters of ``ids`` (those that are there)."""
        ...

    def close(self) -> None: ...


class MemoryDeadLetters:
    """Dead letters in a list, for tests. ``fail_when(letter)`` True makes `put` fail."""

    def __init__(self, *, fail_when: Callable[[DeadLetter], bool] | None = None) -> None:
        self.letters: list[DeadLetter] = []
        self._fail_when = fail_when
        self._lock = threading.Lock()

    def put(self, letter: DeadLetter) -> None:
        if self._fail_when is not None and self._fail_when(letter):
            msg = f"MemoryDeadLetters: injected failure for seq_nr {letter.seq_nr}"
            raise DeadLetterError(msg)
        with self._lock:
            self.letters.append(letter)


@dataclass(frozen=True, slots=True)
class StoredDeadLetter:
    """A dead letter as `SqliteDeadLetters` lists it: its row id, and the message
    deserialized again."""

    id: int
    letter: DeadLetter


COLUMNS = "producer_id, seq_nr, serializer_id, manifest, data, reason, attempts, timestamp_millis"
"""A stored letter's columns (after its ``id``), in the order of `letter_row`."""


def letter_row(serialization: Serialization, letter: DeadLetter) -> tuple[Any, ...]:
    """``letter`` as the values of `COLUMNS`, its message serialized."""
    serializer_id, manifest, data = serialization.serialize(letter.message)
    return (
        letter.producer_id,
        letter.seq_nr,
        serializer_id,
        manifest,
        data,
        letter.reason,
        letter.attempts,
        letter.timestamp_millis,
    )


def letters_query(
    producer_id: str | None, limit: int, placeholder: str
) -> tuple[str, tuple[Any, ...]]:
    """The query and parameters of `StoredDeadLetters.letters` (``placeholder``: ``?``
    for SQLite, ``%s`` for PostgreSQL)."""
    query = f"SELECT id, {COLUMNS} FROM dead_letters"
    params: tuple[Any, ...] = ()
    if producer_id is not None:
        query += f" WHERE producer_id = {placeholder}"
        params = (producer_id,)
    return f"{query} ORDER BY id LIMIT {placeholder}", (*params, limit)


def stored_letters(serialization: Serialization, rows: list[Any]) -> list[StoredDeadLetter]:
    """The rows of `letters_query` as letters, their messages deserialized."""
    deserialize = serialization.deserialize
    return [
        StoredDeadLetter(
            row[0],
            DeadLetter(row[1], row[2], deserialize(row[3], row[4], bytes(row[5])), *row[6:]),
        )
        for row in rows
    ]


_SCHEMA_COMPONENT = "dead_letters"  # its row in the table ``schema_version``, shared
_SCHEMA_VERSION = 1  # with the other stores a file may hold (durable_sqlite.py)
_SYNCHRONOUS = ("OFF", "NORMAL", "FULL")


class SqliteDeadLetters:
    """Dead letters in the table ``dead_letters`` of an SQLite file.

    Args:
        path: the database file (created if missing). It may be shared with other stores
            and with other processes: each `put` is one short transaction.
        synchronous: SQLite's fsync policy for the file, ``"OFF"``, ``"NORMAL"`` (the
            default: a letter survives a crash of the process, the last ones may be lost
            with a power cut) or ``"FULL"`` (fsync on every letter).
        busy_timeout: seconds a write waits for another writer of the file; default 5.
        serialization: turns messages to bytes and back; default `default_serialization`.

    Raises:
        DeadLetterError: the file cannot be opened, is not a database, or was written by
            a newer version.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        synchronous: str = "NORMAL",
        busy_timeout: float = 5.0,
        serialization: Serialization | None = None,
    ) -> None:
        level = _sqlite.check_synchronous(synchronous, _SYNCHRONOUS)
        _sqlite.check_seconds("busy_timeout", busy_timeout)
        self.path = Path(path)
        self._serialization = serialization or default_serialization
        self._lock = threading.Lock()
        try:
            self._conn = _sqlite.connect(self.path, busy_timeout=busy_timeout)
        except sqlite3.Error as error:
            raise self._error("cannot open it", error) from error
        try:
            _sqlite.use_wal(self._conn, level, busy_timeout=busy_timeout)
            self._conn.executescript(
                """
                CREATE TABLE IF NOT EXISTS schema_version (
                    component TEXT PRIMARY KEY,
                    version INTEGER NOT NULL
                );
                CREATE TABLE IF NOT EXISTS dead_letters (
                    id INTEGER PRIMARY KEY AUTOINCREMENT,
                    producer_id TEXT NOT NULL,
                    seq_nr INTEGER NOT NULL,
                    serializer_id INTEGER NOT NULL,
                    manifest TEXT NOT NULL,
                    data BLOB NOT NULL,
                    reason TEXT NOT NULL,
                    attempts INTEGER NOT NULL,
                    timestamp_millis INTEGER NOT NULL
                );
                """
            )
            row = self._conn.execute(
                "SELECT version FROM schema_version WHERE component = ?", (_SCHEMA_COMPONENT,)
            ).fetchone()
            if row is None:
                self._conn.execute(
                    "INSERT INTO schema_version (component, version) VALUES (?, ?)",
                    (_SCHEMA_COMPONENT, _SCHEMA_VERSION),
                )
            elif row[0] > _SCHEMA_VERSION:
                msg = _sqlite.newer_schema_message(repr(self), row[0], _SCHEMA_VERSION)
                raise DeadLetterError(msg)
        except sqlite3.Error as error:
            self._conn.close()
            raise self._error("cannot set it up", error) from error
        except BaseException:
            self._conn.close()
            raise

    def __repr__(self) -> str:
        return f"SqliteDeadLetters({str(self.path)!r})"

    def put(self, letter: DeadLetter) -> None:
        row = letter_row(self._serialization, letter)
        with self._lock:
            try:
                self._conn.execute(
                    f"INSERT INTO dead_letters ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row
                )
            except sqlite3.Error as error:
                raise self._error(f"cannot write seq_nr {letter.seq_nr}", error) from error

    def letters(self, producer_id: str | None = None, limit: int = 1000) -> list[StoredDeadLetter]:
        """The oldest ``limit`` letters (of ``producer_id``, if given), oldest first."""
        query, params = letters_query(producer_id, limit, "?")
        with self._lock:
            rows = self._conn.execute(query, params).fetchall()
        return stored_letters(self._serialization, rows)

    def count(self) -> int:
        with self._lock:
            return int(self._conn.execute("SELECT COUNT(*) FROM dead_letters").fetchone()[0])

    def delete(self, ids: list[int]) -> None:
        """Remove the letters with these ids (once replayed or dealt with)."""
        with self._lock:
            self._conn.executemany("DELETE FROM dead_letters WHERE id = ?", [(i,) for i in ids])

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> SqliteDeadLetters:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _error(self, what: str, error: sqlite3.Error) -> DeadLetterError:
        kind = _sqlite.classify(error)
        fix = {
            "locked": "another process holds the file longer than busy_timeout",
            "unreadable": "it is not an SQLite database or is corrupt: move it away",
            "other": "check the disk and the file's permissions",
        }[kind]
        return DeadLetterError(f"{self!r}: {what}: {error} ({fix})")


class ProducerDeadLetters:
    """Sends each dead letter on through ``producer`` (a `Producer` handle, or anything
    with a blocking ``send``) as a ``delivery.v1.DeadLetter`` protobuf message.

    ``put`` returns once the producer accepted the letter (within its flow-control
    window); for a durable producer, once it is stored. ``timeout`` bounds the wait for
    demand (seconds; None waits as long as it takes).
    """

    def __init__(
        self,
        producer: Any,
        *,
        timeout: float | None = 30.0,
        serialization: Serialization | None = None,
    ) -> None:
        self._producer = producer
        self._timeout = timeout
        self._serialization = serialization or default_serialization

    def put(self, letter: DeadLetter) -> None:
        try:
            self._producer.send(self.to_message(letter), timeout=self._timeout)
        except DeliveryError as error:
            msg = f"ProducerDeadLetters: seq_nr {letter.seq_nr} not sent on: {error}"
            raise DeadLetterError(msg) from error

    def to_message(self, letter: DeadLetter) -> delivery_pb2.DeadLetter:
        serializer_id, manifest, data = self._serialization.serialize(letter.message)
        return delivery_pb2.DeadLetter(
            producer_id=letter.producer_id,
            seq_nr=letter.seq_nr,
            payload=delivery_pb2.Payload(serializer_id=serializer_id, manifest=manifest, data=data),
            reason=letter.reason,
            attempts=letter.attempts,
            timestamp_millis=letter.timestamp_millis,
        )


def dead_letter_destination(
    given: DeadLetterDestination | str | os.PathLike[str] | None,
) -> tuple[DeadLetterDestination | None, bool]:
    """What a consumer shell's ``dead_letters`` argument stands for, and whether the shell
    owns it (opened here and closed when the shell stops): a ``postgresql://`` URL is a
    ``PostgresDeadLetters``, any other path a `SqliteDeadLetters` (backends.py).

    Raises:
        TypeError: neither a destination, a path, a URL nor None.
        DeadLetterError: the SQLite file or the PostgreSQL database cannot be opened.
        ImportError: a URL without the ``[postgres]`` extra installed (names it).
    """
    if given is None:
        return None, False
    backend = backend_of(given)
    if backend == "postgres":
        from pykka_delivery.delivery.stores.dead_letters_postgres import (  # noqa: PLC0415
            PostgresDeadLetters,  # the [postgres] extra, for a URL only
        )

        return PostgresDeadLetters(given), True
    if backend == "sqlite":
        assert isinstance(given, str | os.PathLike)
        return SqliteDeadLetters(given), True
    if not isinstance(given, DeadLetterDestination):
        msg = (
            f"dead_letters must be a DeadLetterDestination (with put(letter)), the path "
            f"of an SQLite file, a postgresql:// URL, or None; got {type(given).__name__}"
        )
        raise TypeError(msg)
    return given, False


def write_dead_letter(destination: DeadLetterDestination | None, effect: WriteDeadLetter) -> None:
    """Carry out a core's `WriteDeadLetter`, stamped with the wall clock.

    Raises:
        DeadLetterError: the destination failed (or there is none: a shell lets a
            rejection through only with a destination).
    """
    if destination is None:
        msg = f"no dead-letter destination for seq_nr {effect.seq_nr} of {effect.producer_id!r}"
        raise DeadLetterError(msg)
    letter = DeadLetter(
        effect.producer_id,
        effect.seq_nr,
        effect.message,
        effect.reason,
        effect.attempts,
        int(time.time() * 1000),
    )
    try:
        destination.put(letter)
    except DeadLetterError:
        raise
    except Exception as error:  # a user's destination: report it as ours, naming it
        msg = f"{destination!r} failed to keep seq_nr {effect.seq_nr}: {error}"
        raise DeadLetterError(msg) from error
