"""DurableProducerQueueSpec (reference section 7.4), ported to `DurableProducerState`, plus
the state rules our stores rely on, and `MemoryDurableQueue` (Akka's
TestDurableProducerQueue) with its failure injection.

Original test (DurableProducerQueueSpec) -> test here:

1. addMessageSent -> test_add_message_sent
2. confirm -> test_confirm
3. filter partially stored chunked messages -> test_filter_partially_stored_chunked_messages
"""

from __future__ import annotations

import pytest

from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableProducerQueue,
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.protocol.messages import ChunkedMessage


def sent(seq_nr: int, message: object, qualifier: str = NO_QUALIFIER) -> MessageSent:
    return MessageSent(seq_nr, message, False, qualifier, 0)


def chunk(seq_nr: int, data: str, *, first: bool, last: bool) -> MessageSent:
    return sent(seq_nr, ChunkedMessage(data.encode(), first, last, 20, ""))


def data_of(state: DurableProducerState) -> list[bytes]:
    return [m.message.data for m in state.unconfirmed]


# -- DurableProducerQueueSpec ---------------------------------------------------------------


def test_add_message_sent() -> None:
    """DurableProducerQueueSpec: addMessageSent."""
    state1 = DurableProducerState().add_message_sent(sent(1, "a"))
    assert [m.message for m in state1.unconfirmed] == ["a"]
    assert state1.current_seq_nr == 2

    state2 = state1.add_message_sent(sent(2, "b"))
    assert [m.message for m in state2.unconfirmed] == ["a", "b"]
    assert state2.current_seq_nr == 3


def test_confirm() -> None:
    """DurableProducerQueueSpec: confirm."""
    state1 = DurableProducerState().add_message_sent(sent(1, "a")).add_message_sent(sent(2, "b"))
    state2 = state1.confirmed(1, NO_QUALIFIER, 0)
    assert [m.message for m in state2.unconfirmed] == ["b"]
    assert state2.current_seq_nr == 3
    assert state2.highest_confirmed_seq_nr == 1
    assert state2.confirmed_seq_nr == {NO_QUALIFIER: (1, 0)}


def test_filter_partially_stored_chunked_messages() -> None:
    """DurableProducerQueueSpec: filter partially stored chunked messages."""
    state1 = (
        DurableProducerState()
        .add_message_sent(chunk(1, "a", first=True, last=True))
        .add_message_sent(chunk(2, "b", first=True, last=False))
        .add_message_sent(chunk(3, "c", first=False, last=False))
    )  # the last chunk was never stored
    state2 = state1.cleanup_partial_chunked_messages()
    assert data_of(state2) == [b"a"]
    assert state2.current_seq_nr == 2

    state3 = state1.add_message_sent(chunk(2, "d", first=True, last=False)).add_message_sent(
        chunk(3, "e", first=False, last=True)
    )
    state4 = state3.cleanup_partial_chunked_messages()
    assert data_of(state4) == [b"a", b"d", b"e"]
    assert state4.current_seq_nr == 4

    state5 = (
        state3.add_message_sent(chunk(4, "f", first=True, last=False))
        .add_message_sent(chunk(5, "g", first=False, last=False))
        .add_message_sent(chunk(4, "h", first=True, last=True))
        .add_message_sent(chunk(5, "i", first=True, last=False))
        .add_message_sent(chunk(6, "j", first=False, last=False))
    )
    state6 = state5.cleanup_partial_chunked_messages()
    assert data_of(state6) == [b"a", b"d", b"e", b"h"]
    assert state6.current_seq_nr == 5


# -- state rules beyond the spec --------------------------------------------------------------


def test_confirm_is_per_qualifier_and_cumulative() -> None:
    """Reference 3.3: confirming 4 for q2 removes q2's 3 and 4, and leaves q1's alone."""
    state = DurableProducerState()
    for seq_nr, qualifier in [(1, "q1"), (2, "q2"), (3, "q2"), (4, "q2"), (5, "q1")]:
        state = state.add_message_sent(sent(seq_nr, seq_nr, qualifier))
    state = state.confirmed(4, "q2", 7)
    assert [m.seq_nr for m in state.unconfirmed] == [1, 5]
    assert state.confirmed_seq_nr == {"q2": (4, 7)}
    assert state.highest_confirmed_seq_nr == 4
    state = state.confirmed(1, "q1", 8)
    assert [m.seq_nr for m in state.unconfirmed] == [5]
    assert state.highest_confirmed_seq_nr == 4  # the highest of any qualifier
    assert state.confirmed_seq_nr == {"q2": (4, 7), "q1": (1, 8)}


def test_cleanup_removes_only_the_given_qualifiers() -> None:
    """Akka's State.cleanup(qualifiers): the confirmation records of workers gone are
    forgotten; unconfirmed messages and the seq_nrs are kept."""
    state = (
        DurableProducerState()
        .add_message_sent(sent(1, "a", "q1"))
        .add_message_sent(sent(2, "b", "q2"))
        .add_message_sent(sent(3, "c", "q3"))
        .confirmed(1, "q1", 1)
        .confirmed(2, "q2", 2)
    )
    cleaned = state.cleanup(["q1", "unknown"])
    assert cleaned.confirmed_seq_nr == {"q2": (2, 2)}
    assert [m.seq_nr for m in cleaned.unconfirmed] == [3]
    assert cleaned.current_seq_nr == 4
    assert cleaned.highest_confirmed_seq_nr == 2


def test_cleanup_of_whole_messages_returns_the_same_state() -> None:
    """Without chunks nothing is partial: the state is returned unchanged (as Akka)."""
    state = DurableProducerState().add_message_sent(sent(1, "a")).add_message_sent(sent(2, "b"))
    assert state.cleanup_partial_chunked_messages() is state


def test_cleanup_keeps_a_last_chunk_whose_first_chunk_was_confirmed() -> None:
    """As Akka's cleanupPartialChunkedMessages: a middle/last piece without its first piece
    among the unconfirmed still closes a group; a stored tail is never dropped."""
    state = DurableProducerState(
        current_seq_nr=4,
        highest_confirmed_seq_nr=1,
        unconfirmed=(chunk(2, "m", first=False, last=False), chunk(3, "z", first=False, last=True)),
    )
    cleaned = state.cleanup_partial_chunked_messages()
    assert data_of(cleaned) == [b"m", b"z"]
    assert cleaned.current_seq_nr == 4


def test_cleanup_of_only_partial_chunks_restarts_after_the_highest_confirmed() -> None:
    """Reference 3.3: the scan starts at highestConfirmedSeqNr + 1, so when every unconfirmed
    piece is partial the next message reuses the first dropped seq_nr."""
    state = DurableProducerState(
        current_seq_nr=8,
        highest_confirmed_seq_nr=5,
        unconfirmed=(chunk(6, "x", first=True, last=False), chunk(7, "y", first=False, last=False)),
    )
    cleaned = state.cleanup_partial_chunked_messages()
    assert cleaned.unconfirmed == ()
    assert cleaned.current_seq_nr == 6


# -- MemoryDurableQueue (TestDurableProducerQueue) --------------------------------------------


def test_memory_queue_is_a_durable_producer_queue() -> None:
    assert isinstance(MemoryDurableQueue(), DurableProducerQueue)


def test_memory_queue_store_is_idempotent_for_the_last_seq_nr_only() -> None:
    """TestDurableProducerQueue: the seq_nr stored last is acknowledged again without a
    change (a retry after a timeout); any other unexpected seq_nr is refused (Akka leaves
    it unanswered so the ask times out; a direct call raises instead)."""
    queue = MemoryDurableQueue()
    queue.store_message_sent(sent(1, "a"))
    queue.store_message_sent(sent(2, "b"))
    before = queue.state
    queue.store_message_sent(sent(2, "b"))
    assert queue.state == before
    with pytest.raises(DurableQueueError, match="next seq_nr is 3"):
        queue.store_message_sent(sent(1, "a"))
    with pytest.raises(DurableQueueError, match="next seq_nr is 3"):
        queue.store_message_sent(sent(4, "d"))
    assert queue.state == before


def test_memory_queue_confirm_not_above_the_stored_one_is_ignored() -> None:
    """EventSourcedProducerQueue: a Confirmed is persisted only above the qualifier's
    confirmed seq_nr, so its timestamp is not moved back either."""
    queue = MemoryDurableQueue()
    queue.store_messages_sent([sent(1, "a"), sent(2, "b"), sent(3, "c")])
    queue.store_message_confirmed(2, NO_QUALIFIER, 100)
    queue.store_message_confirmed(1, NO_QUALIFIER, 200)
    queue.store_message_confirmed(2, NO_QUALIFIER, 300)
    assert queue.state.confirmed_seq_nr == {NO_QUALIFIER: (2, 100)}
    assert [m.seq_nr for m in queue.state.unconfirmed] == [3]


def test_memory_queue_injected_failure_changes_nothing_and_is_counted() -> None:
    """TestDurableProducerQueue's failWhen: the failing call raises and the state stays;
    the same call passes once fail_when says so."""
    failing = {"on": True}

    def fail_when(op: str, arg: object) -> bool:
        return failing["on"] and op == "store_message_sent" and getattr(arg, "seq_nr", 0) == 2

    queue = MemoryDurableQueue(fail_when=fail_when)
    queue.store_message_sent(sent(1, "a"))
    before = queue.state
    with pytest.raises(DurableQueueError, match="injected failure"):
        queue.store_message_sent(sent(2, "b"))
    assert queue.state == before
    failing["on"] = False
    queue.store_message_sent(sent(2, "b"))
    assert queue.state.current_seq_nr == 3
    assert queue.calls["store_message_sent"] == 3
    assert queue.failures == {"store_message_sent": 1}


@pytest.mark.parametrize(
    ("op", "call"),
    [
        ("load_state", lambda q: q.load_state()),
        ("store_message_sent", lambda q: q.store_message_sent(sent(2, "b"))),
        ("store_messages_sent", lambda q: q.store_messages_sent([sent(2, "b")])),
        ("store_message_confirmed", lambda q: q.store_message_confirmed(1, NO_QUALIFIER, 5)),
    ],
)
def test_memory_queue_fail_when_is_asked_for_each_operation(op: str, call: object) -> None:
    """Each operation asks fail_when with its own name and argument."""
    seen: list[tuple[str, object]] = []
    start = DurableProducerState().add_message_sent(sent(1, "a"))

    def fail_when(name: str, arg: object) -> bool:
        seen.append((name, arg))
        return True

    queue = MemoryDurableQueue(start, fail_when=fail_when)
    with pytest.raises(DurableQueueError):
        call(queue)  # type: ignore[operator]
    assert [name for name, _ in seen] == [op]
    assert queue.state is start
    assert queue.failures == {op: 1}


def test_memory_queue_restarted_from_state_drops_partial_chunks() -> None:
    """A second queue given the first one's state stands for a restart: its load_state
    cleans partially stored chunks, and the next store reuses their seq_nrs."""
    first = MemoryDurableQueue()
    first.store_message_sent(chunk(1, "a", first=True, last=True))
    first.store_message_sent(chunk(2, "b", first=True, last=False))
    restarted = MemoryDurableQueue(first.state)
    loaded = restarted.load_state()
    assert data_of(loaded) == [b"a"]
    assert loaded.current_seq_nr == 2
    restarted.store_message_sent(chunk(2, "c", first=True, last=True))
    assert data_of(restarted.state) == [b"a", b"c"]


def test_memory_queue_refuses_calls_after_close() -> None:
    queue = MemoryDurableQueue()
    queue.store_message_sent(sent(1, "a"))
    queue.close()
    with pytest.raises(DurableQueueError, match="closed"):
        queue.store_message_sent(sent(2, "b"))
    assert queue.state.current_seq_nr == 2
