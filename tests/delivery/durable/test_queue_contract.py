"""The `DurableProducerQueue` contract (module docstring of durable_queue.py), held against
every implementation: `MemoryDurableQueue`, `SqliteDurableQueue` and `PostgresDurableQueue`
(on the throwaway server of tests/postgres.py, a fresh database per test).

Each test gets a `Stores` that opens a queue and "restarts" it: the memory queue is built
again from the previous one's state (as Akka's tests keep TestDurableProducerQueue's state
in an AtomicReference), the SQLite and PostgreSQL queues are closed and their database opened again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_postgres import PostgresDurableQueue
from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableProducerQueue,
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.delivery.stores.durable_sqlite import SqliteDurableQueue
from pykka_delivery.protocol.messages import ChunkedMessage


class Stores:
    """Opens queues of one kind, and restarts them."""

    def __init__(self, kind: str, tmp_path: Path, url: str = "") -> None:
        self.kind = kind
        self.path = tmp_path / "queues.db"
        self.url = url
        self._opened: list[Any] = []

    def open(self, producer_id: str = "producer-1") -> Any:
        queue: Any
        if self.kind == "memory":
            queue = MemoryDurableQueue()
        elif self.kind == "postgres":
            queue = PostgresDurableQueue(self.url, producer_id)
        else:
            queue = SqliteDurableQueue(self.path, producer_id)
        self._opened.append(queue)
        return queue

    def restart(self, queue: Any) -> Any:
        """The same queue after its process stopped and started again (closed first)."""
        queue.close()
        again: Any
        if self.kind == "memory":
            again = MemoryDurableQueue(queue.state)
        elif self.kind == "postgres":
            again = PostgresDurableQueue(self.url, queue.producer_id)
        else:
            again = SqliteDurableQueue(self.path, queue.producer_id)
        self._opened.append(again)
        return again

    def close_all(self) -> None:
        for queue in self._opened:
            queue.close()


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stores]:
    url = request.getfixturevalue("postgres_url") if request.param == "postgres" else ""
    made = Stores(request.param, tmp_path, url)
    try:
        yield made
    finally:
        made.close_all()


def sent(seq_nr: int, message: Any = None, qualifier: str = NO_QUALIFIER, **kw: Any) -> MessageSent:
    payload = f"m{seq_nr}" if message is None else message
    return MessageSent(
        seq_nr, payload, kw.get("ack", False), qualifier, kw.get("ts", 1000 + seq_nr)
    )


def chunk(seq_nr: int, data: bytes, *, first: bool, last: bool) -> MessageSent:
    return MessageSent(seq_nr, ChunkedMessage(data, first, last, 2, ""), False, NO_QUALIFIER, 7)


def seq_nrs(state: DurableProducerState) -> list[int]:
    return [m.seq_nr for m in state.unconfirmed]


def test_each_store_is_a_durable_producer_queue(stores: Stores) -> None:
    assert isinstance(stores.open(), DurableProducerQueue)


def test_an_empty_queue_loads_the_empty_state(stores: Stores) -> None:
    assert stores.open().load_state() == DurableProducerState()


def test_stored_messages_are_loaded_after_a_restart(stores: Stores) -> None:
    """Every field of a stored message comes back, and the numbering continues."""
    queue = stores.open()
    messages = [
        sent(1, "text", ack=True, ts=11),
        sent(2, b"bytes", qualifier="worker-a", ts=12),
        sent(3, {"k": [1, 2.5, None, True]}, ts=13),
    ]
    for m in messages:
        queue.store_message_sent(m)
    assert queue.load_state().unconfirmed == tuple(messages)

    state = stores.restart(queue).load_state()
    assert state.unconfirmed == tuple(messages)
    assert state.current_seq_nr == 4
    assert state.highest_confirmed_seq_nr == 0


def test_storing_the_last_seq_nr_again_changes_nothing(stores: Stores) -> None:
    """Contract: idempotent for the seq_nr stored last (a retry whose write did land)."""
    queue = stores.open()
    queue.store_message_sent(sent(1))
    queue.store_message_sent(sent(2))
    queue.store_message_sent(sent(2))
    queue.store_messages_sent([sent(2)])
    state = stores.restart(queue).load_state()
    assert seq_nrs(state) == [1, 2]
    assert state.current_seq_nr == 3


def test_storing_the_last_batch_again_changes_nothing(stores: Stores) -> None:
    queue = stores.open()
    queue.store_messages_sent([sent(1), sent(2), sent(3)])
    queue.store_messages_sent([sent(1), sent(2), sent(3)])
    assert seq_nrs(stores.restart(queue).load_state()) == [1, 2, 3]


@pytest.mark.parametrize("bad", [0, 1, 4, 7])
def test_a_seq_nr_out_of_order_is_refused_and_changes_nothing(stores: Stores, bad: int) -> None:
    """Contract: any other seq_nr than the next one (3) or the last one stored (2) raises."""
    queue = stores.open()
    queue.store_messages_sent([sent(1), sent(2)])
    with pytest.raises(DurableQueueError, match="seq_nr"):
        queue.store_message_sent(sent(bad))
    queue.store_message_sent(sent(3))
    assert seq_nrs(stores.restart(queue).load_state()) == [1, 2, 3]


def test_a_batch_is_stored_all_or_none(stores: Stores) -> None:
    """A batch whose seq_nrs are not consecutive from the next one stores nothing."""
    queue = stores.open()
    queue.store_message_sent(sent(1))
    with pytest.raises(DurableQueueError, match="consecutive"):
        queue.store_messages_sent([sent(2), sent(3), sent(5)])
    with pytest.raises(DurableQueueError, match="next seq_nr is 2"):
        queue.store_messages_sent([sent(3), sent(4)])
    queue.store_messages_sent([sent(2), sent(3)])
    state = stores.restart(queue).load_state()
    assert seq_nrs(state) == [1, 2, 3]
    assert state.current_seq_nr == 4


def test_a_confirmation_removes_its_qualifiers_messages_only(stores: Stores) -> None:
    """Contract and reference 3.3: cumulative per qualifier; other qualifiers untouched."""
    queue = stores.open()
    qualifiers = ["a", "b", "a", "b", "a"]
    queue.store_messages_sent([sent(i + 1, qualifier=q) for i, q in enumerate(qualifiers)])
    queue.store_message_confirmed(3, "a", 500)
    queue.flush()
    state = stores.restart(queue).load_state()
    assert seq_nrs(state) == [2, 4, 5]
    assert state.confirmed_seq_nr == {"a": (3, 500)}
    assert state.highest_confirmed_seq_nr == 3
    assert state.current_seq_nr == 6


def test_each_confirmation_removes_its_qualifiers_messages_since_its_previous_one(
    stores: Stores,
) -> None:
    """Confirmations of two qualifiers in turn, over a restart: each removes every message
    of its qualifier up to it, however far below the other qualifier's confirmation."""
    queue = stores.open()
    queue.store_messages_sent([sent(i, qualifier="ab"[i % 2]) for i in range(1, 9)])
    queue.store_message_confirmed(6, "a", 1)
    queue.flush()
    queue = stores.restart(queue)
    assert seq_nrs(queue.load_state()) == [1, 3, 5, 7, 8]
    queue.store_message_confirmed(5, "b", 2)
    queue.flush()
    assert seq_nrs(stores.restart(queue).load_state()) == [7, 8]


def test_a_batch_of_many_messages_comes_back_whole_and_in_order(stores: Stores) -> None:
    """More messages than one statement writes (a batch is written in parts)."""
    queue = stores.open()
    batch = [sent(i, [i] * (i % 3), qualifier=f"q{i % 2}", ack=i % 5 == 0) for i in range(1, 72)]
    queue.store_messages_sent(batch)
    state = stores.restart(queue).load_state()
    assert state.unconfirmed == tuple(batch)
    assert state.current_seq_nr == 72


def test_a_confirmation_not_above_the_stored_one_is_ignored(stores: Stores) -> None:
    """Contract: idempotent; a lower or equal seq_nr moves neither the seq_nr nor the time."""
    queue = stores.open()
    queue.store_messages_sent([sent(1), sent(2), sent(3)])
    queue.store_message_confirmed(2, NO_QUALIFIER, 100)
    queue.store_message_confirmed(2, NO_QUALIFIER, 200)
    queue.store_message_confirmed(1, NO_QUALIFIER, 300)
    state = stores.restart(queue).load_state()
    assert state.confirmed_seq_nr == {NO_QUALIFIER: (2, 100)}
    assert seq_nrs(state) == [3]


def test_every_message_confirmed_keeps_the_numbering(stores: Stores) -> None:
    queue = stores.open()
    queue.store_messages_sent([sent(1), sent(2)])
    queue.store_message_confirmed(2, NO_QUALIFIER, 9)
    queue = stores.restart(queue)
    state = queue.load_state()
    assert state.unconfirmed == ()
    assert state.current_seq_nr == 3
    queue.store_message_sent(sent(3))
    with pytest.raises(DurableQueueError):
        queue.store_message_sent(sent(1))


def test_partial_chunks_are_dropped_on_load_and_their_seq_nrs_reused(stores: Stores) -> None:
    """Reference 3.5: pieces of a chunked message not stored whole are discarded at load,
    and the next message takes their seq_nrs."""
    queue = stores.open()
    queue.store_message_sent(chunk(1, b"a", first=True, last=True))
    queue.store_message_sent(chunk(2, b"b1", first=True, last=False))
    queue.store_message_sent(chunk(3, b"b2", first=False, last=False))
    queue = stores.restart(queue)  # the crash before the last piece

    state = queue.load_state()
    assert [m.message.data for m in state.unconfirmed] == [b"a"]
    assert state.current_seq_nr == 2
    queue.store_message_sent(chunk(2, b"c1", first=True, last=False))
    queue.store_message_sent(chunk(3, b"c2", first=False, last=True))

    state = stores.restart(queue).load_state()
    assert [m.message for m in state.unconfirmed] == [
        ChunkedMessage(b"a", True, True, 2, ""),
        ChunkedMessage(b"c1", True, False, 2, ""),
        ChunkedMessage(b"c2", False, True, 2, ""),
    ]
    assert state.current_seq_nr == 4


def test_cleanup_forgets_the_qualifiers_given(stores: Stores) -> None:
    queue = stores.open()
    queue.store_messages_sent([sent(1, qualifier="a"), sent(2, qualifier="b")])
    queue.store_message_confirmed(1, "a", 5)
    queue.store_message_confirmed(2, "b", 6)
    queue.cleanup(["a"])
    state = stores.restart(queue).load_state()
    assert state.confirmed_seq_nr == {"b": (2, 6)}
    assert state.current_seq_nr == 3
    assert state.highest_confirmed_seq_nr == 2


def test_a_closed_queue_refuses_calls(stores: Stores) -> None:
    queue = stores.open()
    queue.store_message_sent(sent(1))
    queue.close()
    queue.close()  # again: nothing
    with pytest.raises(DurableQueueError, match="closed"):
        queue.store_message_sent(sent(2))


def test_many_producer_ids_in_one_file_stay_apart(tmp_path: Path) -> None:
    """SQLite only: one file per node holds the queues of several producers."""
    path = tmp_path / "node.db"
    one = SqliteDurableQueue(path, "one")
    two = SqliteDurableQueue(path, "two")
    try:
        one.store_messages_sent([sent(1, "one-1"), sent(2, "one-2")])
        two.store_message_sent(sent(1, "two-1"))
        one.store_message_confirmed(1, NO_QUALIFIER, 5)
        two.store_message_confirmed(1, NO_QUALIFIER, 6)
        one.flush()
        two.flush()
        two.store_message_sent(sent(2, "two-2"))
    finally:
        one.close()
        two.close()
    one = SqliteDurableQueue(path, "one")
    two = SqliteDurableQueue(path, "two")
    try:
        state_one, state_two = one.load_state(), two.load_state()
    finally:
        one.close()
        two.close()
    assert [m.message for m in state_one.unconfirmed] == ["one-2"]
    assert state_one.confirmed_seq_nr == {NO_QUALIFIER: (1, 5)}
    assert state_one.current_seq_nr == 3
    assert [m.message for m in state_two.unconfirmed] == ["two-2"]
    assert state_two.confirmed_seq_nr == {NO_QUALIFIER: (1, 6)}
    assert state_two.current_seq_nr == 3


def test_a_confirmation_of_zero_records_nothing(stores: Stores) -> None:
    """As Akka's EventSourcedProducerQueue: a qualifier never confirmed counts as 0."""
    queue = stores.open()
    queue.store_message_sent(sent(1))
    queue.store_message_confirmed(0, NO_QUALIFIER, 5)
    state = stores.restart(queue).load_state()
    assert state.confirmed_seq_nr == {}
    assert seq_nrs(state) == [1]


@pytest.mark.parametrize(
    ("seq_nr", "qualifier", "timestamp"), [("1", "", 5), (-1, "", 5), (1, None, 5), (1, "", 1.5)]
)
def test_a_confirmation_with_a_bad_argument_is_refused(
    stores: Stores, seq_nr: Any, qualifier: Any, timestamp: Any
) -> None:
    queue = stores.open()
    queue.store_message_sent(sent(1))
    with pytest.raises(DurableQueueError, match="store_message_confirmed"):
        queue.store_message_confirmed(seq_nr, qualifier, timestamp)
    assert seq_nrs(stores.restart(queue).load_state()) == [1]
