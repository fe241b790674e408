"""Dead-letter destinations: the SQLite and PostgreSQL tables (one contract, both
backends), sending on through a producer, memory; and which destination a consumer's
``dead_letters`` argument stands for."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pykka_delivery.delivery.stores.dead_letters import (
    DeadLetter,
    DeadLetterDestination,
    DeadLetterError,
    MemoryDeadLetters,
    ProducerDeadLetters,
    SqliteDeadLetters,
    dead_letter_destination,
)
from pykka_delivery.delivery.stores.dead_letters_postgres import PostgresDeadLetters
from pykka_delivery.delivery.stores.durable_queue import NO_QUALIFIER, MessageSent
from pykka_delivery.delivery.stores.durable_sqlite import SqliteDurableQueue
from pykka_delivery.errors import DeliveryTimeout
from pykka_delivery.protocol import delivery_pb2


def letter(seq_nr: int, message: Any = b"payload", producer_id: str = "orders") -> DeadLetter:
    return DeadLetter(producer_id, seq_nr, message, f"failed {seq_nr}", 3, 1_700_000_000_000)


class Tables:
    """Opens the dead-letter table of one backend, again and again on the same data."""

    def __init__(self, kind: str, tmp_path: Path, url: str) -> None:
        self.kind = kind
        self.path = tmp_path / "dl.db"
        self.url = url

    def open(self) -> SqliteDeadLetters | PostgresDeadLetters:
        if self.kind == "postgres":
            return PostgresDeadLetters(self.url)
        return SqliteDeadLetters(self.path)

    def set_schema_version(self, version: int) -> None:
        if self.kind == "postgres":
            with psycopg.connect(self.url) as pg:
                pg.execute(
                    "UPDATE schema_versions SET version = %s WHERE component = 'dead_letters'",
                    (version,),
                )
            return
        with sqlite3.connect(self.path) as conn:
            conn.execute(
                "UPDATE schema_version SET version = ? WHERE component = 'dead_letters'",
                (version,),
            )
        conn.close()


@pytest.fixture(params=["sqlite", "postgres"])
def tables(request: pytest.FixtureRequest, tmp_path: Path) -> Tables:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else ""
    return Tables(request.param, tmp_path, url)


def test_every_destination_is_a_dead_letter_destination(tables: Tables) -> None:
    with tables.open() as stored_letters:
        for destination in (MemoryDeadLetters(), stored_letters, ProducerDeadLetters(object())):
            assert isinstance(destination, DeadLetterDestination)


def test_tables_keep_letters_across_reopening_with_their_messages(tables: Tables) -> None:
    with tables.open() as letters:
        letters.put(letter(1, b"\x00raw"))
        letters.put(letter(2, {"order": 7, "items": ["a"]}))
        letters.put(letter(9, "text", producer_id="other"))

    with tables.open() as letters:
        assert letters.count() == 3
        stored = letters.letters()
        assert [s.letter for s in stored] == [
            letter(1, b"\x00raw"),
            letter(2, {"order": 7, "items": ["a"]}),
            letter(9, "text", producer_id="other"),
        ]
        assert [s.letter.seq_nr for s in letters.letters("orders")] == [1, 2]
        assert [s.letter.seq_nr for s in letters.letters(limit=1)] == [1]
        letters.delete([stored[0].id, stored[2].id])
        assert [s.letter.seq_nr for s in letters.letters()] == [2]


def test_tables_refuse_a_newer_schema(tables: Tables) -> None:
    tables.open().close()
    tables.set_schema_version(99)

    with pytest.raises(DeadLetterError, match="schema version 99"):
        tables.open()


def test_sqlite_refuses_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "dl.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DeadLetterError, match="not an SQLite database or is corrupt"):
        SqliteDeadLetters(path)


def test_sqlite_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="synchronous must be one of OFF, NORMAL, FULL"):
        SqliteDeadLetters(tmp_path / "dl.db", synchronous="sometimes")
    with pytest.raises(ValueError, match="busy_timeout"):
        SqliteDeadLetters(tmp_path / "dl.db", busy_timeout=-1)


def test_memory_letters_and_injected_failures() -> None:
    letters = MemoryDeadLetters(fail_when=lambda dl: dl.seq_nr == 2)
    letters.put(letter(1))
    with pytest.raises(DeadLetterError, match="seq_nr 2"):
        letters.put(letter(2))
    assert letters.letters == [letter(1)]


class FakeProducer:
    def __init__(self, error: Exception | None = None) -> None:
        self.sent: list[tuple[Any, float | None]] = []
        self.error = error

    def send(self, message: Any, timeout: float | None = None) -> int:
        if self.error is not None:
            raise self.error
        self.sent.append((message, timeout))
        return len(self.sent)


def test_producer_destination_sends_a_dead_letter_protobuf() -> None:
    producer = FakeProducer()
    ProducerDeadLetters(producer, timeout=2.0).put(letter(5, {"k": 1}))

    [(message, timeout)] = producer.sent
    assert timeout == 2.0
    assert isinstance(message, delivery_pb2.DeadLetter)
    assert (message.producer_id, message.seq_nr, message.reason, message.attempts) == (
        "orders",
        5,
        "failed 5",
        3,
    )
    assert message.timestamp_millis == 1_700_000_000_000
    assert message.payload.data == b'{"k":1}'


def test_producer_destination_failure_is_a_dead_letter_error() -> None:
    destination = ProducerDeadLetters(FakeProducer(DeliveryTimeout("no demand within 2 s")))
    with pytest.raises(DeadLetterError, match="seq_nr 5 not sent on: no demand"):
        destination.put(letter(5))


def test_dead_letters_share_a_file_with_a_durable_producer_queue(tmp_path: Path) -> None:
    path = tmp_path / "node.db"
    queue = SqliteDurableQueue(path, "orders")
    try:
        with SqliteDeadLetters(path) as letters:
            queue.store_message_sent(MessageSent(1, b"m", False, NO_QUALIFIER, 0))
            letters.put(letter(1))
            assert letters.count() == 1
        assert [m.seq_nr for m in queue.load_state().unconfirmed] == [1]
    finally:
        queue.close()


def test_postgres_table_that_cannot_be_reached_fails_naming_it(tmp_path: Path) -> None:
    url = f"postgresql://nobody@/none?host={tmp_path}"

    with pytest.raises(DeadLetterError, match=r"cannot connect to .* within 0\.5 s"):
        PostgresDeadLetters(url, connect_timeout=0.5)


def test_postgres_table_refuses_use_after_close(postgres_url: str) -> None:
    letters = PostgresDeadLetters(postgres_url)
    letters.close()
    letters.close()  # a second close is harmless

    with pytest.raises(DeadLetterError, match="was closed"):
        letters.put(letter(1))


def test_a_postgresql_url_stands_for_a_postgres_table_the_consumer_owns(
    postgres_url: str,
) -> None:
    destination, owned = dead_letter_destination(postgres_url)

    assert isinstance(destination, PostgresDeadLetters)
    assert owned
    destination.put(letter(1))
    assert destination.count() == 1
    destination.close()


def test_a_path_stands_for_an_sqlite_table_the_consumer_owns(tmp_path: Path) -> None:
    destination, owned = dead_letter_destination(tmp_path / "dl.db")

    assert isinstance(destination, SqliteDeadLetters)
    assert owned
    destination.close()


def test_an_existing_file_named_like_a_url_stays_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "postgresql:").mkdir()
    name = "postgresql://dl.db"  # a relative path: directory "postgresql:", then "dl.db"
    SqliteDeadLetters(name).close()

    destination, owned = dead_letter_destination(name)

    assert isinstance(destination, SqliteDeadLetters)
    assert owned
    destination.close()


def test_a_destination_object_is_used_as_it_is_and_not_owned() -> None:
    given = MemoryDeadLetters()

    assert dead_letter_destination(given) == (given, False)


def test_anything_else_is_refused_naming_what_is_accepted() -> None:
    with pytest.raises(TypeError, match="a postgresql:// URL, or None; got int"):
        dead_letter_destination(42)  # type: ignore[arg-type]
