"""`GroupMember` with a transactional deduplication store (`SqliteTxDedupStore`, one per
partition and activation): the handler applies its effect in ``delivery.transaction(conn)``,
so what was applied before is neither handled again nor applied twice. The coordinator,
producer node and member processes are those of tests/partitions/test_groups.py."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)
from pykka_delivery.delivery.stores.dedup_tx import SqliteTxDedupStore
from pykka_delivery.partitions import GroupDelivery
from pykka_delivery.partitions.catalog import producer_id
from tests.partitions.test_groups import STREAM, TIMEOUT, WAIT, World

GROUP = "billing"


@pytest.fixture
def world() -> Iterator[World]:
    settings = CoordinatorSettings(disconnected_timeout=TIMEOUT, recovery_min_delay=TIMEOUT)
    actor = CoordinatorActor.start(settings=settings)
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    made = World(server)
    try:
        yield made
    finally:
        made.close()
        server.stop()
        actor.stop()


class Ledger:
    """The application's database: one connection per partition thread (handlers of
    different partitions run at once), rows (partition, number)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = threading.local()
        self.conn().execute("CREATE TABLE ledger (partition INTEGER, number INTEGER)")

    def conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, isolation_level=None, timeout=WAIT)
            self._local.conn = conn
        return conn

    def rows(self, partition: int) -> list[int]:
        query = "SELECT number FROM ledger WHERE partition = ? ORDER BY rowid"
        return [n for (n,) in self.conn().execute(query, (partition,))]

    def store_of(self, partition: int) -> SqliteTxDedupStore:
        return SqliteTxDedupStore(self.path, producer_id(STREAM, partition, GROUP))


class At:
    def __init__(self, producer_id: str, seq_nr: int) -> None:
        self.producer_id, self.seq_nr = producer_id, seq_nr


def run(world: World, ledger: Ledger, handler: Callable[[GroupDelivery], None]) -> None:
    """20 unkeyed messages (even numbers on partition 0, odd on 1) through one member."""
    producer = world.producer(2, [GROUP], start=0)
    member = world.join(world.process("m1"), GROUP, 2, handler, dedup_store=ledger.store_of)
    for n in range(20):
        producer.send(n, timeout=WAIT)
    producer.wait_confirmed(timeout=WAIT)
    member.close()
    assert member.statistics().handler_failures == 0


def test_handler_applying_in_the_delivery_transaction_skips_what_was_applied_before(
    world: World, tmp_path: Path
) -> None:
    ledger = Ledger(tmp_path / "app.db")
    earlier = ledger.store_of(0)  # an earlier member applied partition 0 up to seq_nr 5
    with earlier.transaction(ledger.conn(), At(earlier.consumer_id, 5)):
        ledger.conn().execute("INSERT INTO ledger VALUES (0, 8)")
    earlier.close()

    def handle(delivery: GroupDelivery) -> None:
        conn = ledger.conn()
        with delivery.transaction(conn):
            conn.execute("INSERT INTO ledger VALUES (?, ?)", (delivery.partition, delivery.message))

    run(world, ledger, handle)

    assert ledger.rows(0) == [8, 10, 12, 14, 16, 18]
    assert ledger.rows(1) == list(range(1, 20, 2))
    positions = {p: ledger.store_of(p).load() for p in (0, 1)}
    assert positions == {p: {producer_id(STREAM, p, GROUP): 10} for p in (0, 1)}


def test_handler_whose_record_in_finds_the_message_applied_counts_it_as_handled(
    world: World, tmp_path: Path
) -> None:
    """A consumer replaced mid-delivery committed seq_nr 3 of partition 0 after this one
    started: this handler's own transaction finds it applied (`AlreadyApplied`, let out of
    the handler), and the member confirms it instead of calling the handler again."""
    ledger = Ledger(tmp_path / "app.db")
    late = ledger.store_of(0)

    def handle(delivery: GroupDelivery) -> None:
        conn = ledger.conn()
        if (delivery.partition, delivery.seq_nr) == (0, 3):  # the replaced one commits now
            with late.transaction(sqlite3.connect(ledger.path, isolation_level=None), delivery):
                pass
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO ledger VALUES (?, ?)", (delivery.partition, delivery.message))
            delivery.dedup_store.record_in(conn, delivery)

    run(world, ledger, handle)

    assert ledger.rows(0) == [0, 2, 6, 8, 10, 12, 14, 16, 18]  # 4 (seq_nr 3) rolled back
    late.close()
