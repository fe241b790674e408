"""The transactional outbox on PostgreSQL: messages staged in the application's transaction
are sent once it commits, exactly once, never if it rolls back, across crashes."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.stores.durable_postgres import PostgresDurableQueue
from pykka_delivery.delivery.stores.durable_postgres_outbox import OutboxRelay, stage
from pykka_delivery.delivery.stores.durable_queue import DurableQueueError, MessageSent
from tests.delivery.durable.test_sqlite_queue import child, read_line, stop

WAIT = 10.0


@pytest.fixture
def db(postgres_url: str) -> Iterator[str]:
    """A database with the queue's tables and a business table ``orders``."""
    PostgresDurableQueue(postgres_url, "setup").close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    yield postgres_url


def place_order(url: str, order: int, messages: list[Any], *, commit: bool) -> None:
    """The application's transaction: a business row and its messages, together."""
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO orders (id) VALUES (%s)", (order,))
        stage(conn, "p", messages)
        if commit:
            conn.commit()
        else:
            conn.rollback()


def unconfirmed(url: str) -> list[tuple[int, Any]]:
    queue = PostgresDurableQueue(url, "p")
    try:
        return [(m.seq_nr, m.message) for m in queue.load_state().unconfirmed]
    finally:
        queue.close()


def receive_all(consumer: Consumer, count: int) -> list[Any]:
    got = []
    for _ in range(count):
        delivery = consumer.receive(timeout=WAIT)
        got.append(delivery.message)
        delivery.confirm()
    return got


def test_a_transaction_that_rolls_back_stages_nothing(db: str) -> None:
    place_order(db, 1, ["order 1 placed"], commit=False)

    assert unconfirmed(db) == []


def test_committed_messages_are_numbered_after_the_stored_ones_when_the_producer_starts(
    db: str,
) -> None:
    queue = PostgresDurableQueue(db, "p")
    queue.store_message_sent(MessageSent(1, "direct", False, "", 1))
    queue.close()
    place_order(db, 1, ["a", "b"], commit=True)

    assert unconfirmed(db) == [(1, "direct"), (2, "a"), (3, "b")]
    assert unconfirmed(db) == [(1, "direct"), (2, "a"), (3, "b")]  # taken once


def test_a_crash_before_the_commit_leaves_neither_the_business_row_nor_the_message(
    db: str,
) -> None:
    proc = child(
        """
        import sys, psycopg
        from pykka_delivery.delivery.stores.durable_postgres_outbox import stage
        conn = psycopg.connect(sys.argv[1])
        conn.execute("INSERT INTO orders (id) VALUES (1)")
        stage(conn, "p", ["order 1 placed"])
        print("staged", flush=True)
        sys.stdin.read()
        """,
        db,
    )
    try:
        assert read_line(proc) == "staged"
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT)
    finally:
        stop(proc)

    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM orders").fetchone() == (0,)
    assert unconfirmed(db) == []


def test_staging_outside_a_transaction_is_refused(db: str) -> None:
    with (
        psycopg.connect(db, autocommit=True) as conn,
        pytest.raises(ValueError, match="open transaction"),
    ):
        stage(conn, "p", ["x"])


def test_staging_before_the_tables_exist_names_the_fix(postgres_url: str) -> None:
    with (
        psycopg.connect(postgres_url) as conn,
        pytest.raises(DurableQueueError, match="open a PostgresDurableQueue on it once"),
    ):
        stage(conn, "p", ["x"])


def test_a_running_producer_sends_each_committed_message_exactly_once(db: str) -> None:
    queue = PostgresDurableQueue(db, "p")
    producer = Producer("p", durable_queue=queue)
    consumer = Consumer()
    relay = OutboxRelay(queue, producer, poll_interval=0.2)
    try:
        producer.register_consumer(consumer.ref)
        relay.start()
        place_order(db, 1, ["1a", "1b"], commit=True)
        place_order(db, 2, ["2a"], commit=False)
        place_order(db, 3, ["3a"], commit=True)

        got = receive_all(consumer, 3)
        assert relay.error is None
    finally:
        relay.stop()
        producer.close()
        consumer.close()
        queue.close()

    assert got == ["1a", "1b", "3a"]
    with psycopg.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM durable_outbox").fetchone() == (0,)


def test_a_producer_killed_between_the_commit_and_the_send_sends_after_its_restart(
    db: str,
) -> None:
    """The producer's process dies (SIGKILL) holding its queue, with committed messages not
    yet taken; the next producer on the queue sends them, once."""
    proc = child(
        """
        import sys
        from pykka_delivery.delivery.stores.durable_postgres import PostgresDurableQueue
        queue = PostgresDurableQueue(sys.argv[1], "p")
        queue.load_state()
        print("running", flush=True)
        sys.stdin.read()
        """,
        db,
    )
    try:
        assert read_line(proc) == "running"
        place_order(db, 1, ["1a", "1b"], commit=True)
        proc.send_signal(signal.SIGKILL)
        proc.wait(WAIT)
    finally:
        stop(proc)

    queue = PostgresDurableQueue(db, "p")
    producer = Producer("p", durable_queue=queue)
    consumer = Consumer()
    try:
        producer.register_consumer(consumer.ref)
        got = receive_all(consumer, 2)
    finally:
        producer.close()
        consumer.close()
        queue.close()
    assert got == ["1a", "1b"]


def test_another_sender_on_a_relayed_producer_is_refused(db: str) -> None:
    queue = PostgresDurableQueue(db, "p")
    try:
        place_order(db, 1, ["staged"], commit=True)
        queue.load_state()
        place_order(db, 2, ["next"], commit=True)
        queue.claim_outbox(10)
        with pytest.raises(DurableQueueError, match="no other sender"):
            queue.store_message_sent(MessageSent(2, "not from the outbox", False, "", 1))
    finally:
        queue.close()


def test_the_relay_wakes_on_the_commit_notification(db: str) -> None:
    """With a poll interval far longer than the test, a commit alone wakes the relay."""
    queue = PostgresDurableQueue(db, "p")
    producer = Producer("p", durable_queue=queue)
    consumer = Consumer()
    relay = OutboxRelay(queue, producer, poll_interval=600)
    try:
        producer.register_consumer(consumer.ref)
        relay.start()  # returns once it listens
        place_order(db, 1, ["woken"], commit=True)
        assert receive_all(consumer, 1) == ["woken"]
    finally:
        relay.stop()
        producer.close()
        consumer.close()
        queue.close()


def test_the_relay_carries_on_after_the_server_dropped_its_connections(db: str) -> None:
    queue = PostgresDurableQueue(db, "p")
    producer = Producer("p", durable_queue=queue)
    consumer = Consumer()
    relay = OutboxRelay(queue, producer, poll_interval=0.1)
    try:
        producer.register_consumer(consumer.ref)
        relay.start()
        place_order(db, 1, ["before"], commit=True)
        assert receive_all(consumer, 1) == ["before"]
        with psycopg.connect(db, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        place_order(db, 2, ["after"], commit=True)

        assert receive_all(consumer, 1) == ["after"]
        assert relay.error is None
    finally:
        relay.stop()
        producer.close()
        consumer.close()
        queue.close()
