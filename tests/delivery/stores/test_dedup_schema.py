"""The deduplication stores' schema version 2 (the fencing epochs): a database written by
version 1 (its tables made here with version 1's statements) is upgraded in place when a
store opens it, its positions kept; a newer version than the code knows is still refused
(test_dedup.py, test_dedup_postgres.py, test_dedup_tx_postgres.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pykka_delivery.delivery.stores.dedup import SqliteDedupStore
from pykka_delivery.delivery.stores.dedup_postgres import PostgresDedupStore
from pykka_delivery.delivery.stores.dedup_tx import SqliteTxDedupStore
from pykka_delivery.delivery.stores.dedup_tx_postgres import PostgresTxDedupStore
from pykka_delivery.errors import ConsumerFenced

# Version 1, as it shipped.
_V1_SQLITE = """
CREATE TABLE {versions} (component TEXT PRIMARY KEY, version INTEGER NOT NULL);
CREATE TABLE {positions} (
    consumer_id TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    seq_nr INTEGER NOT NULL,
    PRIMARY KEY (consumer_id, producer_id)
) WITHOUT ROWID;
INSERT INTO {versions} VALUES ('{component}', 1);
INSERT INTO {positions} VALUES ('c-1', 'p-1', 7);
"""
_V1_POSTGRES = """
CREATE TABLE schema_versions (component TEXT PRIMARY KEY, version INTEGER NOT NULL);
CREATE TABLE {positions} (
    consumer_id TEXT NOT NULL,
    producer_id TEXT NOT NULL,
    seq_nr BIGINT NOT NULL,
    PRIMARY KEY (consumer_id, producer_id)
);
INSERT INTO schema_versions VALUES ('{component}', 1);
INSERT INTO {positions} VALUES ('c-1', 'p-1', 7)
"""


@dataclass
class Version1:
    """A database of version 1 of one store, and how to open it with this code."""

    open: Callable[[], Any]
    version: Callable[[], int]


def _sqlite(path: Path, versions: str, positions: str, component: str) -> Callable[[], int]:
    conn = sqlite3.connect(path)
    conn.executescript(
        _V1_SQLITE.format(versions=versions, positions=positions, component=component)
    )
    conn.close()

    def version() -> int:
        with sqlite3.connect(path) as check:
            row = check.execute(
                f"SELECT version FROM {versions} WHERE component = ?", (component,)
            ).fetchone()
        return int(row[0])

    return version


def _postgres(url: str, positions: str, component: str) -> Callable[[], int]:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in _V1_POSTGRES.format(positions=positions, component=component).split(";"):
            conn.execute(statement)

    def version() -> int:
        with psycopg.connect(url) as check:
            row = check.execute(
                "SELECT version FROM schema_versions WHERE component = %s", (component,)
            ).fetchone()
        assert row is not None
        return int(row[0])

    return version


@pytest.fixture(params=["sqlite", "sqlite-tx", "postgres", "postgres-tx"])
def version1(request: pytest.FixtureRequest, tmp_path: Path) -> Version1:
    kind = request.param
    if kind == "sqlite":
        path = tmp_path / "dedup.db"
        version = _sqlite(path, "schema_version", "dedup_position", "dedup_store")
        return Version1(lambda: SqliteDedupStore(path, "c-1"), version)
    if kind == "sqlite-tx":
        path = tmp_path / "app.db"
        version = _sqlite(
            path, "pykka_delivery_schema_version", "pykka_delivery_dedup_position", "dedup_tx"
        )
        return Version1(lambda: SqliteTxDedupStore(path, "c-1"), version)
    url: str = request.getfixturevalue("postgres_url")
    if kind == "postgres":
        version = _postgres(url, "dedup_position", "dedup_store")
        return Version1(lambda: PostgresDedupStore(url, "c-1"), version)
    version = _postgres(url, "pykka_delivery_dedup_position", "dedup_tx")
    return Version1(lambda: PostgresTxDedupStore(url, "c-1"), version)


def test_opening_a_version_1_database_keeps_its_positions_and_upgrades_it_to_2(
    version1: Version1,
) -> None:
    store = version1.open()

    assert store.load() == {"p-1": 7}
    assert version1.version() == 2
    store.close()


def test_upgraded_database_keeps_fencing_epochs(version1: Version1) -> None:
    store = version1.open()
    store.fence(2)
    store.record("p-1", 8)
    store.flush()
    store.close()

    store = version1.open()

    with pytest.raises(ConsumerFenced, match="fenced at epoch 2"):
        store.fence(1)
    assert store.load() == {"p-1": 8}
    store.close()
