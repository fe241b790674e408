"""``pykka-delivery dead-letters list|show|replay|purge``, run through the installed
console script on a `SqliteDeadLetters` file, and on a PostgreSQL database given by its
URL, that a `Consumer` filled by rejecting messages (``max_attempts=1``: the first
rejection writes the letter).

``replay`` delivers to a `Consumer` exposed on a transport `Node` in this process, which
confirms what it receives."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery import Consumer, ConsumerControllerSettings, Producer
from pykka_delivery.delivery.stores.dead_letters import StoredDeadLetters, dead_letter_destination
from pykka_delivery.transport import Node
from tests.cli.commands import WAIT, assert_one_clear_line, free_port, run, run_json

POISON = {2: "no such customer", 4: "amount is negative"}
MESSAGES = [{"order": n} for n in range(1, 6)]


def fill(path: str) -> None:
    """Send `MESSAGES` through a producer to a consumer that rejects those in `POISON`."""
    # A window of 2: a Request per confirmation, so the producer hears of each at once.
    settings = ConsumerControllerSettings(flow_control_window=2, max_attempts=1)
    producer = Producer("orders")
    consumer = Consumer(settings, dead_letters=path)
    consumer.register_to(producer.ref)
    for message in MESSAGES:
        producer.send(message, timeout=WAIT)  # the consumer's thread is this one: in turn
        delivery = consumer.receive(timeout=WAIT)
        reason = POISON.get(delivery.message["order"])
        if reason is None:
            delivery.confirm()
        else:
            delivery.reject(reason)
    producer.wait_confirmed(timeout=WAIT)
    consumer.close()
    producer.close()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The store's path or URL, filled."""
    if request.param == "postgres":
        where: str = request.getfixturevalue("postgres_url")
    else:
        where = str(tmp_path / "dead.sqlite")
    fill(where)
    return where


def opened(db: str) -> StoredDeadLetters:
    store = dead_letter_destination(db)[0]
    assert isinstance(store, StoredDeadLetters)
    return store


def stored(db: str) -> list[Any]:
    store = opened(db)
    try:
        return [s.letter.message for s in store.letters()]
    finally:
        store.close()


def ids(db: str) -> list[int]:
    store = opened(db)
    try:
        return [s.id for s in store.letters()]
    finally:
        store.close()


# --- list and show ---------------------------------------------------------------------


def test_list_shows_each_letter_with_its_reason_and_message(db: str) -> None:
    document = run_json("dead-letters", "list", "--db", str(db))

    assert document["count"] == 2
    listed = [(d["producer_id"], d["reason"], d["message"]) for d in document["letters"]]
    assert listed == [
        ("orders", "no such customer", {"order": 2}),
        ("orders", "amount is negative", {"order": 4}),
    ]


def test_list_as_a_table_names_the_reasons(db: str) -> None:
    done = run("dead-letters", "list", "--db", str(db))

    assert done.returncode == 0, done.stderr
    assert "no such customer" in done.stdout
    assert "amount is negative" in done.stdout


def test_show_gives_one_letter_in_full(db: str) -> None:
    first = ids(db)[0]

    document = run_json("dead-letters", "show", str(first), "--db", str(db))

    assert (document["id"], document["seq_nr"], document["attempts"]) == (first, 2, 1)
    assert document["message"] == {"order": 2}


def test_show_of_an_unknown_id_is_one_clear_line(db: str) -> None:
    done = run("dead-letters", "show", "999", "--db", str(db))

    assert_one_clear_line(done, "no dead letter with id 999")


def test_a_missing_file_is_one_clear_line_and_is_not_created(tmp_path: Path) -> None:
    missing = tmp_path / "nothing.sqlite"

    done = run("dead-letters", "list", "--db", str(missing))

    assert_one_clear_line(done, "no dead-letter file", str(missing))
    assert not missing.exists()


# --- purge -----------------------------------------------------------------------------


def test_purge_with_yes_deletes_every_letter(db: str) -> None:
    document = run_json("dead-letters", "purge", "--db", str(db), "--yes")

    assert len(document["deleted"]) == 2
    assert stored(db) == []


def test_purge_asks_first_and_a_no_deletes_nothing(db: str) -> None:
    done = run("dead-letters", "purge", "--db", str(db), input="n\n")

    assert done.returncode == 1
    assert "Delete 2 dead letter(s)" in done.stderr
    assert len(stored(db)) == 2


def test_purge_of_one_id_after_a_yes_deletes_only_it(db: str) -> None:
    first, second = ids(db)

    done = run("dead-letters", "purge", "--db", str(db), "--id", str(first), input="y\n")

    assert done.returncode == 0, done.stderr
    assert ids(db) == [second]


# --- replay ----------------------------------------------------------------------------


@pytest.fixture
def consumer_node() -> Iterator[tuple[str, list[Any]]]:
    """A consumer exposed as ``replayed`` on a node: its address, and what it confirmed."""
    received: list[Any] = []
    with Node() as node:
        # A window of 2: a Request per confirmation, so the replay hears of each at once.
        settings = ConsumerControllerSettings(flow_control_window=2)
        consumer = Consumer(settings, self_ref_factory=node.expose("replayed"))
        stop = threading.Event()

        def consume() -> None:
            while not stop.is_set():
                try:
                    delivery = consumer.receive(timeout=0.2)
                except TimeoutError:
                    continue
                received.append(delivery.message)
                delivery.confirm()

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        try:
            yield f"{node.address}/replayed", received
        finally:
            stop.set()
            thread.join(WAIT)
            consumer.close()


def test_replay_delivers_every_letter_and_removes_it_once_confirmed(
    db: str, consumer_node: tuple[str, list[Any]]
) -> None:
    address, received = consumer_node

    document = run_json("dead-letters", "replay", "--db", str(db), "--to", address)

    assert received == [{"order": 2}, {"order": 4}]
    assert len(document["replayed"]) == 2
    assert stored(db) == []


def test_replay_of_one_id_leaves_the_others(db: str, consumer_node: tuple[str, list[Any]]) -> None:
    address, received = consumer_node
    first, second = ids(db)

    run_json("dead-letters", "replay", "--db", str(db), "--to", address, "--id", str(second))

    assert received == [{"order": 4}]
    assert ids(db) == [first]


def test_replay_to_nobody_keeps_every_letter_and_says_so(db: str) -> None:
    address = f"127.0.0.1:{free_port()}/replayed"

    done = run("dead-letters", "replay", "--db", str(db), "--to", address, "--timeout", "1")

    assert_one_clear_line(done, "replayed 0 of 2", "stay in")
    assert len(stored(db)) == 2
