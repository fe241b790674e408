"""``pykka-delivery queue inspect PATH``, run through the installed console script on a
`SqliteDurableQueue` file a real `Producer` filled: four messages sent, the first two
confirmed by the `Consumer`, two left unconfirmed."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from pykka_delivery import Consumer, ConsumerControllerSettings, Producer, SqliteDurableQueue
from pykka_delivery.delivery.stores.durable_sqlite_inspect import inspect_sqlite_queue
from tests.cli.commands import WAIT, assert_one_clear_line, run, run_json


def fill(path: Path) -> float:
    """Fill the queue of producer id ``orders`` in ``path``; the wall clock before the
    first send."""
    queue = SqliteDurableQueue(path, "orders")
    producer = Producer("orders", durable_queue=queue)
    # A small window: receiving 3 sends a Request that carries the confirmation of 2.
    consumer = Consumer(ConsumerControllerSettings(flow_control_window=4))
    consumer.register_to(producer.ref)
    started = time.time()
    for n in range(1, 5):
        producer.send(n, timeout=WAIT)  # the consumer's thread is this one: in turn
        if n <= 2:
            consumer.receive(timeout=WAIT).confirm()
        elif n == 3:
            consumer.receive(timeout=WAIT)  # never confirmed
    deadline = time.monotonic() + WAIT
    while producer.snapshot().confirmed_seq_nr < 2:
        assert time.monotonic() < deadline, "the confirmations never reached the producer"
        time.sleep(0.01)
    consumer.close()
    producer.close()  # flushes the confirmations written behind
    queue.close()
    return started


def test_inspect_counts_the_unconfirmed_messages_and_names_the_oldest(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite"
    started = fill(path)

    document = run_json("queue", "inspect", str(path))

    [producer] = document["producers"]
    assert producer["producer_id"] == "orders"
    assert (producer["next_seq_nr"], producer["confirmed_seq_nr"]) == (5, 2)
    assert (producer["unconfirmed"], producer["oldest_seq_nr"]) == (2, 3)
    assert 0 <= producer["oldest_age"] <= time.time() - started + 1


def test_inspect_as_a_table_names_the_producer(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite"
    fill(path)

    done = run("queue", "inspect", str(path))

    assert done.returncode == 0, done.stderr
    [row] = [line for line in done.stdout.splitlines() if "orders" in line]
    assert "seq_nr 3" in row


def test_inspect_opens_the_file_read_only(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite"
    fill(path)
    path.chmod(0o444)
    before = path.read_bytes()

    document = run_json("queue", "inspect", str(path))

    assert [p["unconfirmed"] for p in document["producers"]] == [2]
    assert path.read_bytes() == before


def test_inspect_reads_a_queue_a_running_producer_holds(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite"
    fill(path)

    queue = SqliteDurableQueue(path, "orders")  # holds the producer id's lock
    try:
        document = run_json("queue", "inspect", str(path))
    finally:
        queue.close()

    assert [p["producer_id"] for p in document["producers"]] == ["orders"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (None, "no such file"),
        (b"not a database at all, just text" * 40, "not an SQLite database"),
        ("sqlite", "without a durable producer queue"),
    ],
)
def test_inspect_of_a_file_that_is_no_queue_is_one_clear_line(
    tmp_path: Path, content: bytes | str | None, words: str
) -> None:
    path = tmp_path / "other.sqlite"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "sqlite":
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE notes (text TEXT)")
        conn.close()

    done = run("queue", "inspect", str(path))

    assert_one_clear_line(done, str(path), words)


def test_inspect_of_a_queue_of_a_newer_schema_is_refused_by_name(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite"
    fill(path)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE schema_version SET version = version + 1 WHERE component = ?",
            ("durable_producer_queue",),
        )
    conn.close()

    done = run("queue", "inspect", str(path))

    assert_one_clear_line(done, str(path), "schema version 2", "newer version")


def test_the_oldest_stamp_is_the_oldest_unconfirmed_messages_own(tmp_path: Path) -> None:
    path = tmp_path / "queue.sqlite"
    fill(path)
    with sqlite3.connect(path) as conn:  # stamps far apart, the oldest not the first row read
        conn.execute("UPDATE message_sent SET timestamp_millis = 1000 * (10 - seq_nr)")
        conn.execute("UPDATE message_sent SET timestamp_millis = 5000 WHERE seq_nr = 3")
    conn.close()

    [producer] = inspect_sqlite_queue(path)

    assert (producer.oldest_seq_nr, producer.oldest_timestamp_millis) == (3, 5000)
