"""`CoordinatedConsumer` with a transactional deduplication store made per activation
(`SqliteTxDedupStore`): each effect is applied in ``coordinated.transaction(conn,
delivery)``, and what an earlier activation applied is not delivered again."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pykka_delivery import Producer
from pykka_delivery.coordinator import (
    CoordinatedConsumer,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)
from pykka_delivery.delivery.stores.dedup_tx import SqliteTxDedupStore
from tests.coordinator.servers import FAST

WAIT = 10.0


class At:
    def __init__(self, producer_id: str, seq_nr: int) -> None:
        self.producer_id, self.seq_nr = producer_id, seq_nr


@pytest.fixture
def client() -> Iterator[CoordinatorClient]:
    actor = CoordinatorActor.start(settings=CoordinatorSettings(disconnected_timeout=5.0))
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    opened = CoordinatorClient(server.address, settings=FAST)
    yield opened
    opened.close()
    server.stop()
    actor.stop()


def test_each_effect_applied_in_the_activation_transaction_once(
    client: CoordinatorClient, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE ledger (number INTEGER)")
    earlier = SqliteTxDedupStore(db, "billing")  # an earlier activation applied 1 and 2
    with earlier.transaction(conn, At("orders", 2)):
        conn.execute("INSERT INTO ledger VALUES (1), (2)")
    earlier.close()
    producer = Producer("orders")
    coordinated = CoordinatedConsumer(
        client,
        "test",
        "orders",
        "billing",
        producer.ref,
        dedup_store=lambda: SqliteTxDedupStore(db, "billing"),
    )
    # From a thread: the demand comes once `receive` activates a consumer here.
    sender = threading.Thread(target=producer.send_many, args=(range(1, 6), WAIT))
    sender.start()

    for _ in range(3):
        delivery = coordinated.receive(timeout=WAIT)
        with coordinated.transaction(conn, delivery):
            conn.execute("INSERT INTO ledger VALUES (?)", (delivery.message,))
        delivery.confirm()
    sender.join(WAIT)

    assert [n for (n,) in conn.execute("SELECT number FROM ledger")] == [1, 2, 3, 4, 5]
    assert coordinated.active_dedup_store is not None
    # Each position went in with its effect, into the activation's own store: its
    # confirmations found them written (else it writes them itself, and warns).
    assert "without its position recorded" not in caplog.text
    coordinated.close(timeout=WAIT)  # its consumer tells the producer what is confirmed
    producer.wait_confirmed(timeout=WAIT)
    assert coordinated.active_dedup_store is None
    with pytest.raises(TypeError, match="dedup_store=SqliteTxDedupStore"):
        coordinated.transaction(conn, delivery)
    producer.close()
    conn.close()
