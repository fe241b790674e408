"""The deduplication store inside the application's transaction (`SqliteTxDedupStore`):
the effect and the position commit together, a message applied before is rolled back
(the fence at the sink), and the mistakes a user can make are refused by name. The store
contract it shares with the others: test_dedup.py; the recipe with consumers SIGKILLed
mid-flow: tests/delivery/durable/test_exactly_once_sqlite.py."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.stores.dedup import DedupStoreError, MemoryDedupStore
from pykka_delivery.delivery.stores.dedup_tx import (
    AlreadyApplied,
    SqliteTxDedupSettings,
    SqliteTxDedupStore,
)
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.partitions.records import GroupDelivery
from pykka_delivery.protocol.messages import SequencedMessage

PID = "p-1"
WAIT = 10.0
SETTINGS = ConsumerControllerSettings(
    flow_control_window=20, resend_interval_min=60.0, resend_interval_max=60.0
)


class At:
    """A delivery's position, as `transaction` reads it."""

    def __init__(self, seq_nr: int, producer_id: str = PID) -> None:
        self.producer_id, self.seq_nr = producer_id, seq_nr


class Recording:
    def __init__(self) -> None:
        self.messages: list[Any] = []

    def tell(self, message: Any) -> None:
        self.messages.append(message)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "app.db"


@pytest.fixture
def conn(db: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(db, isolation_level=None)
    connection.execute("CREATE TABLE IF NOT EXISTS ledger (number INTEGER NOT NULL)")
    yield connection
    connection.close()


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-dedup-tx-timers")
    yield service
    service.shutdown()


def ledger(conn: sqlite3.Connection) -> list[int]:
    return [n for (n,) in conn.execute("SELECT number FROM ledger ORDER BY rowid")]


def apply(store: SqliteTxDedupStore, conn: sqlite3.Connection, seq_nr: int) -> None:
    with store.transaction(conn, At(seq_nr)):
        conn.execute("INSERT INTO ledger (number) VALUES (?)", (seq_nr,))


def seq(n: int, pc: Any, first: bool = False) -> SequencedMessage:
    return SequencedMessage(PID, n, n, first, False, pc)


# --- the transaction ---------------------------------------------------------------------


def test_record_in_raises_already_applied_at_or_below_the_stored_position(
    db: Path, conn: sqlite3.Connection
) -> None:
    store = SqliteTxDedupStore(db, "c-1")
    apply(store, conn, 5)

    conn.execute("BEGIN")
    with pytest.raises(AlreadyApplied, match="seq_nr 4 of producer 'p-1' was applied before"):
        store.record_in(conn, At(4))
    conn.rollback()
    store.close()


def test_consumers_sharing_a_database_keep_their_own_positions(
    db: Path, conn: sqlite3.Connection
) -> None:
    a, b = SqliteTxDedupStore(db, "a"), SqliteTxDedupStore(db, "b")

    apply(a, conn, 3)
    apply(b, conn, 1)

    assert (a.load(), b.load()) == ({PID: 3}, {PID: 1})
    a.close()
    b.close()


# --- mistakes, refused by name --------------------------------------------------------------


def test_confirming_inside_the_transaction_is_refused_naming_the_fix(
    db: Path, conn: sqlite3.Connection
) -> None:
    store = SqliteTxDedupStore(db, "c-1")

    with (
        pytest.raises(DedupStoreError, match="confirm after the with block"),
        store.transaction(conn, At(1)),
    ):
        store.record(PID, 1)  # what delivery.confirm() does

    assert ledger(conn) == []
    store.close()


def test_confirmation_not_recorded_in_a_transaction_is_written_through_with_a_warning(
    db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SqliteTxDedupStore(db, "c-1")

    with caplog.at_level(logging.WARNING, logger="pykka_delivery.consumer"):
        store.record(PID, 1)
        store.record(PID, 2)

    assert SqliteTxDedupStore(db, "c-1").load() == {PID: 2}
    warnings = [r for r in caplog.records if "at least once, not exactly once" in r.message]
    assert len(warnings) == 1
    store.close()


def test_transaction_on_a_connection_in_a_transaction_is_refused(
    db: Path, conn: sqlite3.Connection
) -> None:
    store = SqliteTxDedupStore(db, "c-1")
    conn.execute("BEGIN")

    with (
        pytest.raises(ValueError, match=r"in a transaction already.*record_in"),
        store.transaction(conn, At(1)),
    ):
        pass
    conn.rollback()
    store.close()


def test_transaction_on_a_connection_to_another_database_is_refused_naming_the_fix(
    db: Path, tmp_path: Path
) -> None:
    store = SqliteTxDedupStore(db, "c-1")
    other = sqlite3.connect(tmp_path / "other.db", isolation_level=None)

    with (
        pytest.raises(DedupStoreError, match="the connection is not to"),
        store.transaction(other, At(1)),
    ):
        pass

    assert not other.in_transaction
    other.close()
    store.close()


def test_memory_database_is_refused() -> None:
    with pytest.raises(ValueError, match="needs the application's database file"):
        SqliteTxDedupStore(":memory:", "c-1")


def test_database_of_a_newer_schema_is_refused(db: Path) -> None:
    SqliteTxDedupStore(db, "c-1").close()
    with sqlite3.connect(db) as raw:
        raw.execute(
            "UPDATE pykka_delivery_schema_version SET version = 99 WHERE component = 'dedup_tx'"
        )
    raw.close()

    with pytest.raises(DedupStoreError, match="schema version 99"):
        SqliteTxDedupStore(db, "c-1")


def test_settings_are_validated_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="busy_timeout"):
        SqliteTxDedupSettings(busy_timeout=-1)


# --- the handles ----------------------------------------------------------------------------


def test_consumer_started_after_a_crash_skips_what_was_committed_but_not_confirmed(
    db: Path, conn: sqlite3.Connection, timers: TimerService
) -> None:
    first_store = SqliteTxDedupStore(db, "c")
    crashed = Consumer(SETTINGS, timer_service=timers, dedup_store=first_store)
    pc = Recording()
    crashed.ref.tell(seq(1, pc, first=True))
    crashed.ref.tell(seq(2, pc))
    for n in (1, 2):
        delivery = crashed.receive(timeout=WAIT)
        with crashed.transaction(conn, delivery):
            conn.execute("INSERT INTO ledger (number) VALUES (?)", (delivery.message,))
        if n == 1:
            delivery.confirm()  # 2 is committed, then the process "dies" before confirming
    # The producer resends from 2 (it saw 1 confirmed at most) to the next consumer.
    store = SqliteTxDedupStore(db, "c")
    restarted = Consumer(SETTINGS, timer_service=timers, dedup_store=store)
    resender = Recording()
    restarted.ref.tell(seq(2, resender, first=True))
    restarted.ref.tell(seq(3, resender))

    delivery = restarted.receive(timeout=WAIT)
    with restarted.transaction(conn, delivery):
        conn.execute("INSERT INTO ledger (number) VALUES (?)", (delivery.message,))
    delivery.confirm()

    assert delivery.seq_nr == 3
    assert ledger(conn) == [1, 2, 3]
    assert restarted.statistics().dedup_duplicates == 1
    restarted.close()
    crashed.close()
    store.close()
    first_store.close()


def test_consumer_transaction_without_a_transactional_store_is_refused(
    timers: TimerService, conn: sqlite3.Connection
) -> None:
    consumer = Consumer(SETTINGS, timer_service=timers, dedup_store=MemoryDedupStore())

    with pytest.raises(TypeError, match=r"dedup_store=SqliteTxDedupStore"):
        consumer.transaction(conn, At(1))  # type: ignore[arg-type]
    consumer.close()


def test_group_delivery_transaction_records_the_partitions_position(
    db: Path, conn: sqlite3.Connection
) -> None:
    store = SqliteTxDedupStore(db, "orders-0-billing")
    delivery = GroupDelivery("orders", 0, "billing", None, 7, "orders-0-billing", 1, store)

    with delivery.transaction(conn):
        conn.execute("INSERT INTO ledger (number) VALUES (?)", (delivery.message,))

    assert ledger(conn) == [7]
    assert store.load() == {"orders-0-billing": 1}
    store.close()
