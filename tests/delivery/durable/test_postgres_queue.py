"""`PostgresDurableQueue` beyond the shared contract (test_queue_contract.py runs that on
PostgreSQL too): one writer per producer id (advisory lock, epoch fencing), a killed
holder, the schema version, and where connections come from."""

from __future__ import annotations

import contextlib
import signal
from typing import Any

import psycopg
import psycopg_pool
import pytest

from pykka_delivery.delivery.stores.durable_postgres import (
    PostgresDurableQueue,
    PostgresQueueSettings,
)
from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableQueueError,
    MessageSent,
    is_permanent,
)
from tests.delivery.durable.test_sqlite_queue import child, read_line, stop

QUICK = PostgresQueueSettings(lock_timeout=0.3)


def sent(seq_nr: int, message: Any = None) -> MessageSent:
    return MessageSent(seq_nr, f"m{seq_nr}" if message is None else message, False, "", 1)


def test_a_second_queue_on_the_same_producer_id_is_refused(postgres_url: str) -> None:
    first = PostgresDurableQueue(postgres_url, "p")
    try:
        with pytest.raises(DurableQueueError, match="'p' is already open"):
            PostgresDurableQueue(postgres_url, "p", QUICK)
    finally:
        first.close()


def test_a_closed_queue_releases_its_producer_id_at_once(postgres_url: str) -> None:
    PostgresDurableQueue(postgres_url, "p").close()
    again = PostgresDurableQueue(postgres_url, "p", QUICK)
    again.close()


def test_a_queue_replaced_by_another_opener_can_never_write_again(postgres_url: str) -> None:
    """Fencing: its session died (and the lock with it), another queue opened the producer
    id since; the old one's next write is refused, permanently, and changes nothing."""
    old = PostgresDurableQueue(postgres_url, "p", QUICK)
    old.store_message_sent(sent(1))
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks"
            " WHERE locktype = 'advisory' AND pid <> pg_backend_pid()"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
    new = PostgresDurableQueue(postgres_url, "p", QUICK)
    new.close()
    try:
        with pytest.raises(DurableQueueError) as refused:
            for _ in range(3):  # the first attempt finds the connection lost
                try:
                    old.store_message_sent(sent(2))
                except DurableQueueError as error:
                    if is_permanent(error):
                        raise
        assert "opened by another queue" in str(refused.value)
    finally:
        old.close()
    state = PostgresDurableQueue(postgres_url, "p").load_state()
    assert [m.seq_nr for m in state.unconfirmed] == [1]


def test_a_write_whose_fence_fails_writes_nothing_of_its_own_nor_its_confirmations(
    postgres_url: str,
) -> None:
    """The fence and the buffered confirmations go out together: when the epoch moved
    under a live queue, its next store is refused, permanently, and the confirmations
    sent with it are rolled back with it."""
    queue = PostgresDurableQueue(postgres_url, "p", PostgresQueueSettings(confirm_flush_every=9))
    try:
        queue.store_messages_sent([sent(1), sent(2)])
        queue.store_message_confirmed(1, NO_QUALIFIER, 5)
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("UPDATE durable_producer SET epoch = epoch + 1")
            with pytest.raises(DurableQueueError, match="opened by another queue") as refused:
                queue.store_message_sent(sent(3))
            assert is_permanent(refused.value)
            stored = admin.execute("SELECT seq_nr FROM durable_message_sent ORDER BY 1")
            assert stored.fetchall() == [(1,), (2,)]
            assert admin.execute("SELECT * FROM durable_confirmed").fetchall() == []
    finally:
        with contextlib.suppress(DurableQueueError):  # its confirmation is refused too
            queue.close()


def test_a_queue_that_lost_its_connection_continues_on_a_new_one(postgres_url: str) -> None:
    queue = PostgresDurableQueue(postgres_url, "p", QUICK)
    try:
        queue.store_message_sent(sent(1))
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks"
                " WHERE locktype = 'advisory' AND pid <> pg_backend_pid()"
                " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            )
        with pytest.raises(DurableQueueError, match="unreachable or busy"):
            queue.store_message_sent(sent(2))
        queue.store_message_sent(sent(2))
        assert [m.seq_nr for m in queue.load_state().unconfirmed] == [1, 2]
    finally:
        queue.close()


def test_a_killed_holder_releases_its_producer_id_at_once(postgres_url: str) -> None:
    """SIGKILL: the server ends the session, so the advisory lock goes with it."""
    proc = child(
        """
        import sys
        from pykka_delivery.delivery.stores.durable_postgres import PostgresDurableQueue
        from pykka_delivery.delivery.stores.durable_queue import MessageSent
        queue = PostgresDurableQueue(sys.argv[1], "p")
        queue.store_messages_sent(
            [MessageSent(1, "a", False, "", 1), MessageSent(2, "b", False, "", 1)]
        )
        print("stored", flush=True)
        sys.stdin.read()
        """,
        postgres_url,
    )
    try:
        assert read_line(proc) == "stored"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        queue = PostgresDurableQueue(postgres_url, "p")  # within the default lock_timeout
        try:
            state = queue.load_state()
        finally:
            queue.close()
    finally:
        stop(proc)
    assert [m.message for m in state.unconfirmed] == ["a", "b"]
    assert state.current_seq_nr == 3


def test_a_database_of_a_newer_schema_is_refused(postgres_url: str) -> None:
    PostgresDurableQueue(postgres_url, "p").close()
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            "UPDATE schema_versions SET version = 99 WHERE component = 'durable_producer_queue'"
        )
    with pytest.raises(DurableQueueError, match=r"schema version 99, .* reads up to 1"):
        PostgresDurableQueue(postgres_url, "p")


def test_a_source_that_is_not_a_postgres_url_is_refused() -> None:
    with pytest.raises(ValueError, match=r"postgresql:// URL"):
        PostgresDurableQueue("sqlite:///tmp/x.db", "p")


def test_a_shared_pool_serves_the_queue_and_stays_open(postgres_url: str) -> None:
    with psycopg_pool.ConnectionPool(postgres_url, min_size=1, max_size=3) as pool:
        queue = PostgresDurableQueue(pool, "p")
        queue.store_message_sent(sent(1))
        queue.store_message_confirmed(1, NO_QUALIFIER, 5)
        queue.close()
        with pool.connection() as conn:
            row = conn.execute("SELECT highest_confirmed_seq_nr FROM durable_producer").fetchone()
    assert row == (1,)


def test_a_given_connection_is_used_and_left_open(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        queue = PostgresDurableQueue(conn, "p")
        queue.store_message_sent(sent(1))
        queue.close()
        assert not conn.closed
        assert conn.autocommit is False  # its mode is given back
        assert conn.execute("SELECT count(*) FROM durable_message_sent").fetchone() == (1,)


def test_many_producer_ids_in_one_database_stay_apart(postgres_url: str) -> None:
    one = PostgresDurableQueue(postgres_url, "one")
    two = PostgresDurableQueue(postgres_url, "two")
    try:
        one.store_messages_sent([sent(1, "one-1"), sent(2, "one-2")])
        two.store_message_sent(sent(1, "two-1"))
        one.store_message_confirmed(1, NO_QUALIFIER, 5)
        one.flush()
        assert [m.message for m in one.load_state().unconfirmed] == ["one-2"]
        assert [m.message for m in two.load_state().unconfirmed] == ["two-1"]
    finally:
        one.close()
        two.close()
