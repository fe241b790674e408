"""`PostgresTxDedupStore` on the throwaway server of tests/postgres.py (a fresh database
per test): the effect and the position commit together on the application's psycopg
connection, a message applied before is rolled back, and the fence holds between two
transactions at once (read committed). The contract shared with the other stores:
test_dedup.py; the SQLite twin: test_dedup_tx.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.stores.dedup import DedupStoreError
from pykka_delivery.delivery.stores.dedup_tx import AlreadyApplied
from pykka_delivery.delivery.stores.dedup_tx_postgres import (
    PostgresTxDedupSettings,
    PostgresTxDedupStore,
)
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import SequencedMessage
from tests.delivery.stores.test_dedup_tx import PID, SETTINGS, WAIT, At, Recording


@pytest.fixture
def conn(postgres_url: str) -> Iterator[psycopg.Connection[Any]]:
    connection = psycopg.connect(postgres_url, autocommit=True)
    connection.execute("CREATE TABLE ledger (id BIGSERIAL PRIMARY KEY, number BIGINT NOT NULL)")
    yield connection
    connection.close()


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-dedup-tx-postgres-timers")
    yield service
    service.shutdown()


def ledger(conn: psycopg.Connection[Any]) -> list[int]:
    return [n for (n,) in conn.execute("SELECT number FROM ledger ORDER BY id")]


def apply(store: PostgresTxDedupStore, conn: psycopg.Connection[Any], seq_nr: int) -> None:
    with store.transaction(conn, At(seq_nr)):
        conn.execute("INSERT INTO ledger (number) VALUES (%s)", (seq_nr,))


def test_transaction_works_on_a_connection_that_is_not_in_autocommit(
    postgres_url: str, conn: psycopg.Connection[Any]
) -> None:
    store = PostgresTxDedupStore(postgres_url, "c-1")
    with psycopg.connect(postgres_url) as implicit:  # psycopg's default: implicit BEGIN
        apply(store, implicit, 1)

    assert ledger(conn) == [1]
    assert store.load() == {PID: 1}
    store.close()


def test_two_transactions_of_one_message_at_once_apply_it_once(
    postgres_url: str, conn: psycopg.Connection[Any]
) -> None:
    """The fence under read committed: a consumer replaced mid-delivery (``old``) holds
    the position row uncommitted; its successor's transaction of the same message waits
    on that row, then finds it taken when ``old`` commits, and rolls back."""
    old, new = PostgresTxDedupStore(postgres_url, "c-1"), PostgresTxDedupStore(postgres_url, "c-1")
    other = psycopg.connect(postgres_url, autocommit=True)
    watch = psycopg.connect(postgres_url, autocommit=True)
    errors: list[BaseException] = []

    def successor() -> None:
        try:
            apply(new, other, 1)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    thread = threading.Thread(target=successor)
    with conn.transaction():
        conn.execute("INSERT INTO ledger (number) VALUES (1)")
        old.record_in(conn, At(1))
        thread.start()
        deadline = time.monotonic() + WAIT
        while not watch.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the successor never waited on the row"
            time.sleep(0.01)
    thread.join(WAIT)

    assert errors == []
    assert ledger(conn) == [1]
    assert new.already_applied == 1
    for closing in (other, watch, old, new):
        closing.close()


def test_record_in_raises_already_applied_at_or_below_the_stored_position(
    postgres_url: str, conn: psycopg.Connection[Any]
) -> None:
    store = PostgresTxDedupStore(postgres_url, "c-1")
    apply(store, conn, 5)

    with pytest.raises(AlreadyApplied, match="seq_nr 5 of producer 'p-1'"), conn.transaction():
        store.record_in(conn, At(5))
    store.close()


def test_transaction_on_a_connection_to_another_database_is_refused_naming_the_fix(
    postgres_url: str, postgres: Any
) -> None:
    store = PostgresTxDedupStore(postgres_url, "c-1")
    with psycopg.connect(postgres.create_database(), autocommit=True) as other:
        with (
            pytest.raises(DedupStoreError, match="the connection is not to"),
            store.transaction(other, At(1)),
        ):
            pass
        assert other.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    store.close()


def test_transaction_on_a_connection_in_a_transaction_is_refused(
    postgres_url: str, conn: psycopg.Connection[Any]
) -> None:
    store = PostgresTxDedupStore(postgres_url, "c-1")
    conn.execute("BEGIN")

    with (
        pytest.raises(ValueError, match="in a transaction already"),
        store.transaction(conn, At(1)),
    ):
        pass
    conn.execute("ROLLBACK")
    store.close()


def test_database_of_a_newer_schema_is_refused(postgres_url: str) -> None:
    PostgresTxDedupStore(postgres_url, "c-1").close()
    with psycopg.connect(postgres_url, autocommit=True) as raw:
        raw.execute("UPDATE schema_versions SET version = 99 WHERE component = 'dedup_tx'")

    with pytest.raises(DedupStoreError, match="schema version 99"):
        PostgresTxDedupStore(postgres_url, "c-1")


def test_unreachable_server_is_refused_naming_it() -> None:
    url = "postgresql://nobody@/none?host=/nonexistent-socket-dir"
    with pytest.raises(DedupStoreError, match="cannot connect"):
        PostgresTxDedupStore(url, "c-1", PostgresTxDedupSettings(connect_timeout=0.5))


def test_consumer_started_after_a_crash_skips_what_was_committed_but_not_confirmed(
    postgres_url: str, conn: psycopg.Connection[Any], timers: TimerService
) -> None:
    first_store = PostgresTxDedupStore(postgres_url, "c")
    crashed = Consumer(SETTINGS, timer_service=timers, dedup_store=first_store)
    pc = Recording()
    crashed.ref.tell(SequencedMessage(PID, 1, 1, True, False, pc))
    crashed.ref.tell(SequencedMessage(PID, 2, 2, False, False, pc))
    for n in (1, 2):
        delivery = crashed.receive(timeout=WAIT)
        with crashed.transaction(conn, delivery):
            conn.execute("INSERT INTO ledger (number) VALUES (%s)", (delivery.message,))
        if n == 1:
            delivery.confirm()  # 2 is committed, then the process "dies" before confirming
    store = PostgresTxDedupStore(postgres_url, "c")
    restarted = Consumer(SETTINGS, timer_service=timers, dedup_store=store)
    resender = Recording()
    restarted.ref.tell(SequencedMessage(PID, 2, 2, True, False, resender))
    restarted.ref.tell(SequencedMessage(PID, 3, 3, False, False, resender))

    delivery = restarted.receive(timeout=WAIT)
    with restarted.transaction(conn, delivery):
        conn.execute("INSERT INTO ledger (number) VALUES (%s)", (delivery.message,))
    delivery.confirm()

    assert delivery.seq_nr == 3
    assert ledger(conn) == [1, 2, 3]
    restarted.close()
    crashed.close()
    store.close()
    first_store.close()
