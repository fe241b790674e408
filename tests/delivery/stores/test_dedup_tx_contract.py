"""What every transactional deduplication store does, on SQLite (`SqliteTxDedupStore`) and
on PostgreSQL (`PostgresTxDedupStore`, the throwaway server of tests/postgres.py): the
effect and the position commit together on the application's connection, a failed body
rolls both back, and a message applied before is rolled back while the block ends
normally. Each backend's own cases: test_dedup_tx.py, test_dedup_tx_postgres.py."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.delivery.stores.dedup_tx import SqliteTxDedupStore, TxDedupStore
from tests.delivery.stores.test_dedup_tx import PID, At


@dataclass
class App:
    """The application's database as a test sees it: its connection, a store opener, and
    its one table of effects (``ledger``)."""

    conn: Any
    open_store: Callable[[str], TxDedupStore]
    placeholder: str  # the driver's parameter marker
    in_transaction: Callable[[], bool]

    def insert(self, number: int) -> None:
        self.conn.execute(f"INSERT INTO ledger (number) VALUES ({self.placeholder})", (number,))

    def ledger(self) -> list[int]:
        return [n for (n,) in self.conn.execute("SELECT number FROM ledger ORDER BY number")]

    def apply(self, store: TxDedupStore, seq_nr: int) -> None:
        with store.transaction(self.conn, At(seq_nr)):
            self.insert(seq_nr)


@pytest.fixture(params=["sqlite", "postgres"])
def app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    if request.param == "postgres":
        import psycopg  # noqa: PLC0415 (the [postgres] extra)

        from pykka_delivery.delivery.stores.dedup_tx_postgres import (  # noqa: PLC0415
            PostgresTxDedupStore,
        )

        url: str = request.getfixturevalue("postgres_url")
        pg = psycopg.connect(url, autocommit=True)
        pg.execute("CREATE TABLE ledger (number BIGINT NOT NULL)")
        yield App(
            pg,
            lambda consumer_id: PostgresTxDedupStore(url, consumer_id),
            "%s",
            lambda: pg.info.transaction_status != psycopg.pq.TransactionStatus.IDLE,
        )
        pg.close()
        return
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE ledger (number INTEGER NOT NULL)")
    yield App(
        conn,
        lambda consumer_id: SqliteTxDedupStore(db, consumer_id),
        "?",
        lambda: conn.in_transaction,
    )
    conn.close()


def test_transaction_commits_the_effect_and_the_position_together(app: App) -> None:
    store = app.open_store("c-1")

    app.apply(store, 1)
    app.apply(store, 2)

    assert app.ledger() == [1, 2]
    reopened = app.open_store("c-1")
    assert reopened.load() == {PID: 2}
    store.close()
    reopened.close()


def test_transaction_whose_body_raises_rolls_back_the_effect_and_the_position(app: App) -> None:
    store = app.open_store("c-1")
    app.apply(store, 1)

    with pytest.raises(RuntimeError, match="effect failed"), store.transaction(app.conn, At(2)):
        app.insert(2)
        raise RuntimeError("effect failed")

    assert app.ledger() == [1]
    assert store.load() == {PID: 1}
    assert not app.in_transaction()
    store.close()


def test_message_applied_before_is_rolled_back_and_the_block_ends_normally(app: App) -> None:
    first = app.open_store("c-1")
    app.apply(first, 1)
    app.apply(first, 2)
    # A consumer that replaced the first one while it still handled 2 (a hand-over).
    second = app.open_store("c-1")

    app.apply(second, 2)

    assert app.ledger() == [1, 2]
    assert second.already_applied == 1
    assert second.load() == {PID: 2}
    first.close()
    second.close()
