"""`PostgresDedupStore` on the throwaway server of tests/postgres.py (a fresh database per
test): what only PostgreSQL does. The contract it shares with the memory and SQLite stores,
and with the SQLite store alone (consumers sharing a database, a writer killed with
SIGKILL): test_dedup.py (section 2); the SQLite twins of these tests: test_dedup.py (section 3)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from pykka_delivery.delivery.stores.dedup import DedupStoreError
from pykka_delivery.delivery.stores.dedup_postgres import (
    PostgresDedupSettings,
    PostgresDedupStore,
)


def positions(url: str) -> list[tuple[str, str, int]]:
    """What is committed, read on a connection of the test's own."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT consumer_id, producer_id, seq_nr FROM dedup_position")
        return sorted(rows.fetchall())


def test_records_are_written_only_when_flushed_all_in_one_go(postgres_url: str) -> None:
    store = PostgresDedupStore(postgres_url, "c-1")
    store.record("a", 1)
    store.record("b", 2)
    store.record("a", 3)

    before = positions(postgres_url)
    store.flush()

    assert before == []
    assert positions(postgres_url) == [("c-1", "a", 3), ("c-1", "b", 2)]
    store.close()


def test_flush_every_one_writes_each_record_through(postgres_url: str) -> None:
    store = PostgresDedupStore(postgres_url, "c-1", PostgresDedupSettings(flush_every=1))

    store.record("p", 4)

    assert positions(postgres_url) == [("c-1", "p", 4)]
    store.close()


def test_second_writer_of_a_consumer_id_is_refused_until_the_first_closes(
    postgres_url: str,
) -> None:
    first = PostgresDedupStore(postgres_url, "c-1")
    quick = PostgresDedupSettings(lock_timeout=0.0)

    with pytest.raises(DedupStoreError, match=r"consumer id 'c-1' is in use by another store"):
        PostgresDedupStore(postgres_url, "c-1", quick)
    first.close()
    second = PostgresDedupStore(postgres_url, "c-1", quick)

    assert second.load() == {}
    second.close()


def test_a_database_of_a_newer_schema_is_refused(postgres_url: str) -> None:
    PostgresDedupStore(postgres_url, "c-1").close()
    with psycopg.connect(postgres_url) as conn:
        conn.execute("UPDATE schema_versions SET version = 99 WHERE component = 'dedup_store'")

    with pytest.raises(DedupStoreError, match="schema version 99, this version of pykka"):
        PostgresDedupStore(postgres_url, "c-1")


def test_a_store_given_a_connection_uses_it_and_leaves_it_open(postgres_url: str) -> None:
    conn: psycopg.Connection[Any] = psycopg.connect(postgres_url)
    try:
        store = PostgresDedupStore(conn, "c-1")
        store.record("p", 2)
        store.close()

        assert not conn.closed
        assert not conn.autocommit  # given back as it came
        assert positions(postgres_url) == [("c-1", "p", 2)]
    finally:
        conn.close()


def test_a_server_that_cannot_be_reached_fails_naming_it(tmp_path: Path) -> None:
    url = f"postgresql://nobody@/none?host={tmp_path}"

    with pytest.raises(DedupStoreError, match=r"cannot connect to .* within 0\.5 s"):
        PostgresDedupStore(url, "c-1", PostgresDedupSettings(connect_timeout=0.5))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"flush_every": -1}, "flush_every must be 0"),
        ({"synchronous_commit": "sometimes"}, "synchronous_commit must be one of on, off"),
        ({"connect_timeout": -1.0}, "connect_timeout must be finite seconds >= 0"),
        ({"lock_timeout": float("inf")}, "lock_timeout must be finite seconds >= 0"),
    ],
)
def test_settings_are_validated_naming_the_setting(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PostgresDedupSettings(**kwargs)
