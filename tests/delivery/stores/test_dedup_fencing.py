"""Fencing at the sink: every deduplication store refuses the writes of an older
activation of its consumer id once a newer one was fenced (`fence(epoch)`, dedup.py).

1. The contract, on every store (`MemoryDedupStore`, `SqliteDedupStore`,
   `PostgresDedupStore`, `SqliteTxDedupStore`, `PostgresTxDedupStore`: the `stores`
   fixture of test_dedup.py).
2. The transactional stores: the application's effect rolls back with the refused
   position (SQLite and PostgreSQL, the `app` fixture of test_dedup_tx_contract.py).
3. PostgreSQL: a newer fence waits for an older store's transaction in flight, up to
   ``fence_timeout``.
4. The `Consumer` handle (which fences its store with its epoch): a consumer paused past
   its turn cannot apply its message once a newer one took over.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.stores.dedup import (
    DedupStore,
    DedupStoreError,
    MemoryDedupStore,
    SqliteDedupStore,
)
from pykka_delivery.delivery.stores.dedup_postgres import PostgresDedupStore
from pykka_delivery.delivery.stores.dedup_tx import SqliteTxDedupStore
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import ClosedError, ConsumerFenced
from pykka_delivery.protocol.messages import SequencedMessage
from tests.delivery.stores.test_dedup import Stores, buffered, stores
from tests.delivery.stores.test_dedup_tx import PID, SETTINGS, At, Recording
from tests.delivery.stores.test_dedup_tx_contract import App, app

__all__ = ["app", "buffered", "stores"]  # the fixtures, shared with the modules they come from

WAIT = 10.0


def fence_through_another(stores: Stores, store: DedupStore, epoch: int) -> None:
    """Fence ``epoch`` as the store of a newer activation of ``store``'s consumer id does,
    through a store object of its own (closed afterwards)."""
    if isinstance(store, MemoryDedupStore):
        store.epoch = epoch  # no other object shares its state: what that one's fence stores
        return
    if isinstance(store, SqliteDedupStore):
        # A store never fenced keeps the consumer id's OS lock, and a second writer out,
        # while its process lives; the newer one's fence must hold without it all the same.
        store._file_lock.release()  # type: ignore[union-attr]
    if isinstance(store, PostgresDedupStore):
        # The store loses its session (a server that dropped a paused process's
        # connection), with the lock if it still held one: it connects again to write.
        store._session.conn.close()  # type: ignore[union-attr]
    other = stores.open()
    other.fence(epoch)
    other.close()


def write(store: DedupStore, producer_id: str, seq_nr: int) -> None:
    store.record(producer_id, seq_nr)
    store.flush()


# --- 1. the contract, every store -----------------------------------------------------------


def test_fenced_store_writes_positions_that_are_kept_across_reopening(stores: Stores) -> None:
    store = stores.open()
    store.fence(1)  # type: ignore[attr-defined]
    write(store, "a", 3)

    store = stores.reopen(store)

    assert store.load() == {"a": 3}
    store.close()


def test_store_fenced_out_by_a_newer_activation_raises_and_writes_nothing(
    stores: Stores,
) -> None:
    store = stores.open()
    store.fence(1)  # type: ignore[attr-defined]
    write(store, "a", 3)
    fence_through_another(stores, store, 2)

    with pytest.raises(ConsumerFenced) as raised:
        write(store, "a", 4)

    assert (raised.value.epoch, raised.value.newer_epoch) == (1, 2)
    assert "consumer" in str(raised.value)
    assert "epoch 2" in str(raised.value)
    assert "epoch 1" in str(raised.value)
    with contextlib.suppress(ConsumerFenced):  # a buffered store drops what it kept
        store.close()
    with pytest.raises(ClosedError):
        store.load()
    store = stores.reopen(store)
    assert store.load() == {"a": 3}
    store.close()


def test_store_refuses_a_fence_below_the_stored_epoch_even_after_reopening(
    stores: Stores,
) -> None:
    store = stores.open()
    store.fence(3)  # type: ignore[attr-defined]
    store = stores.reopen(store)

    with pytest.raises(ConsumerFenced, match="fenced at epoch 3") as raised:
        store.fence(2)  # type: ignore[attr-defined]

    assert (raised.value.epoch, raised.value.newer_epoch) == (2, 3)
    store.close()


def test_store_accepts_a_fence_at_or_above_the_stored_epoch(stores: Stores) -> None:
    store = stores.open()
    store.fence(3)  # type: ignore[attr-defined]
    store = stores.reopen(store)

    store.fence(3)  # type: ignore[attr-defined]
    store.fence(5)  # type: ignore[attr-defined]
    write(store, "a", 1)

    assert store.load() == {"a": 1}
    store.close()


def test_store_never_fenced_writes_whatever_epoch_is_stored(stores: Stores) -> None:
    store = stores.open()
    fence_through_another(stores, store, 7)

    write(store, "a", 2)

    store = stores.reopen(store)
    assert store.load() == {"a": 2}
    store.close()


def test_store_fenced_at_zero_does_not_block_a_newer_activation(stores: Stores) -> None:
    store = stores.open()
    store.fence(0)  # type: ignore[attr-defined]
    write(store, "a", 1)

    fence_through_another(stores, store, 1)

    with pytest.raises(ConsumerFenced):
        write(store, "a", 2)
    with contextlib.suppress(ConsumerFenced):
        store.close()


def test_fenced_buffered_store_lets_go_of_the_consumer_id_so_a_newer_one_opens_at_once(
    buffered: Stores,
) -> None:
    old = buffered.open()
    old.fence(1)  # type: ignore[attr-defined]
    old.record("a", 1)

    new = buffered.open()  # waits lock_timeout (5 s), then fails, if the lock is still held
    new.fence(2)  # type: ignore[attr-defined]
    write(new, "a", 2)

    with pytest.raises(ConsumerFenced):
        old.flush()
    with contextlib.suppress(ConsumerFenced):
        old.close()
    assert new.load() == {"a": 2}
    new.close()


@pytest.mark.parametrize("epoch", [-1, 1.0, "1", True, None])
def test_store_refuses_an_epoch_that_is_no_int_of_zero_or_more(
    stores: Stores, epoch: object
) -> None:
    store = stores.open()
    with pytest.raises(ValueError, match=r"epoch must be an int >= 0 \(the fencing epoch"):
        store.fence(epoch)  # type: ignore[attr-defined]
    write(store, "a", 1)  # nothing was fenced
    store.close()


# --- 2. the transactional stores: the effect rolls back with the position ----------------


def test_transaction_of_a_fenced_out_store_rolls_back_the_effect_and_raises(app: App) -> None:
    old, new = app.open_store("c-1"), app.open_store("c-1")
    old.fence(1)
    app.apply(old, 1)
    new.fence(2)

    with pytest.raises(ConsumerFenced) as raised:
        app.apply(old, 2)

    assert (raised.value.epoch, raised.value.newer_epoch) == (1, 2)
    assert app.ledger() == [1]
    assert not app.in_transaction()
    assert new.load() == {PID: 1}
    app.apply(new, 2)
    assert app.ledger() == [1, 2]
    old.close()
    new.close()


def test_record_in_of_a_fenced_out_store_raises_inside_the_applications_transaction(
    app: App,
) -> None:
    old, new = app.open_store("c-1"), app.open_store("c-1")
    old.fence(1)
    new.fence(2)
    app.conn.execute("BEGIN")
    app.insert(1)

    with pytest.raises(ConsumerFenced):
        old.record_in(app.conn, At(1))

    app.conn.rollback()
    assert app.ledger() == []
    assert new.load() == {}
    old.close()
    new.close()


def test_message_applied_before_by_a_store_of_the_same_epoch_is_still_already_applied(
    app: App,
) -> None:
    first, second = app.open_store("c-1"), app.open_store("c-1")
    first.fence(4)
    second.fence(4)
    app.apply(first, 1)

    app.apply(second, 1)

    assert second.already_applied == 1
    assert app.ledger() == [1]
    first.close()
    second.close()


# --- 3. PostgreSQL: a newer fence waits for an older transaction in flight ----------------


def _waiting_on_a_lock(admin: psycopg.Connection[Any], pid: int) -> bool:
    row = admin.execute(
        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return row is not None and row[0] == "Lock"


def test_postgres_fence_waits_for_an_older_transaction_then_its_next_one_is_refused(
    postgres_url: str,
) -> None:
    from pykka_delivery.delivery.stores.dedup_tx_postgres import (  # noqa: PLC0415
        PostgresTxDedupStore,
    )

    conn = psycopg.connect(postgres_url, autocommit=True)
    admin = psycopg.connect(postgres_url, autocommit=True)
    conn.execute("CREATE TABLE ledger (number BIGINT NOT NULL)")
    old = PostgresTxDedupStore(postgres_url, "c-1")
    new = PostgresTxDedupStore(postgres_url, "c-1")
    old.fence(1)
    fenced = threading.Event()
    fencer = threading.Thread(target=lambda: (new.fence(2), fenced.set()), daemon=True)
    try:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO ledger (number) VALUES (1)")
        old.record_in(conn, At(1))  # reads the epoch FOR SHARE
        fencer.start()
        pause = threading.Event()  # never set: a bounded poll
        for _ in range(int(WAIT / 0.01)):
            if _waiting_on_a_lock(admin, new._conn.info.backend_pid):
                break
            pause.wait(0.01)
        assert _waiting_on_a_lock(admin, new._conn.info.backend_pid)
        assert not fenced.is_set()
        conn.commit()
        assert fenced.wait(WAIT)  # the commit let the fence through

        with pytest.raises(ConsumerFenced), old.transaction(conn, At(2)):
            conn.execute("INSERT INTO ledger (number) VALUES (2)")

        assert [n for (n,) in conn.execute("SELECT number FROM ledger")] == [1]
    finally:
        fencer.join(WAIT)
        old.close()
        new.close()
        conn.close()
        admin.close()


def test_postgres_fence_gives_up_after_fence_timeout_on_a_transaction_left_open(
    postgres_url: str,
) -> None:
    from pykka_delivery.delivery.stores.dedup_tx_postgres import (  # noqa: PLC0415
        PostgresTxDedupSettings,
        PostgresTxDedupStore,
    )

    conn = psycopg.connect(postgres_url, autocommit=True)
    conn.execute("CREATE TABLE ledger (number BIGINT NOT NULL)")
    old = PostgresTxDedupStore(postgres_url, "c-1")
    new = PostgresTxDedupStore(postgres_url, "c-1", PostgresTxDedupSettings(fence_timeout=0.05))
    try:
        old.fence(1)
        conn.execute("BEGIN")  # a paused process's transaction, left open
        old.record_in(conn, At(1))

        with pytest.raises(DedupStoreError, match=r"still open after fence_timeout \(0.05 s\)"):
            new.fence(2)

        conn.rollback()
        new.fence(2)  # once it ended
        with pytest.raises(ConsumerFenced):
            old.fence(1)
    finally:
        old.close()
        new.close()
        conn.close()


@pytest.mark.parametrize("fence_timeout", [0.0, -1.0, float("inf")])
def test_postgres_tx_settings_refuse_a_fence_timeout_not_above_zero_and_finite(
    fence_timeout: float,
) -> None:
    from pykka_delivery.delivery.stores.dedup_tx_postgres import (  # noqa: PLC0415
        PostgresTxDedupSettings,
    )

    with pytest.raises(ValueError, match="fence_timeout"):
        PostgresTxDedupSettings(fence_timeout=fence_timeout)


# --- 4. a Consumer handle paused past its turn -------------------------------------------


def test_paused_consumer_of_an_older_epoch_cannot_apply_its_message_after_a_newer_took_over(
    tmp_path: Path,
) -> None:
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("CREATE TABLE ledger (number INTEGER NOT NULL)")
    timers = TimerService(name="test-dedup-fencing-timers")
    old_store, new_store = SqliteTxDedupStore(db, "c"), SqliteTxDedupStore(db, "c")
    old = Consumer(SETTINGS, timer_service=timers, dedup_store=old_store, epoch=1)
    new: Consumer | None = None
    try:
        old.ref.tell(SequencedMessage(PID, 1, 1, True, False, Recording()))
        paused = old.receive(timeout=WAIT)  # then the process pauses before applying it
        # The coordinator activates another consumer with epoch 2; the producer resends 1.
        new = Consumer(SETTINGS, timer_service=timers, dedup_store=new_store, epoch=2)
        new.ref.tell(SequencedMessage(PID, 1, 1, True, False, Recording()))
        delivery = new.receive(timeout=WAIT)
        with new.transaction(conn, delivery):
            conn.execute("INSERT INTO ledger (number) VALUES (?)", (delivery.message,))
        delivery.confirm()

        with pytest.raises(ConsumerFenced), old.transaction(conn, paused):
            conn.execute("INSERT INTO ledger (number) VALUES (?)", (paused.message,))

        assert [n for (n,) in conn.execute("SELECT number FROM ledger")] == [1]
    finally:
        old.close()
        if new is not None:
            new.close()
        old_store.close()
        new_store.close()
        timers.shutdown()
        conn.close()
