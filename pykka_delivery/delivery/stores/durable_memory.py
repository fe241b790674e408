"""An in-memory durable producer queue, for tests (a port of Akka's
``TestDurableProducerQueue``).

It keeps the `DurableProducerState` in an attribute, so a test can read it, and a second
`MemoryDurableQueue` built from the first one's ``state`` stands for the same queue after a
restart. Nothing survives the process: use `SqliteDurableQueue` for real durability.

Failure injection (Akka's ``failWhen``): ``fail_when(op, arg)`` is asked before every call,
with ``op`` one of ``"load_state"``, ``"store_message_sent"``, ``"store_messages_sent"``,
``"store_message_confirmed"``, ``"cleanup"`` and ``arg``:

* ``load_state``: None;
* ``store_message_sent``: the `MessageSent`;
* ``store_messages_sent``: the tuple of `MessageSent`;
* ``store_message_confirmed``: the tuple ``(seq_nr, qualifier, timestamp_millis)``;
* ``cleanup``: the tuple of qualifiers.

When it answers True the call raises `DurableQueueError` and changes nothing, as a store
whose disk write failed. Unlike Akka's test queue, the timestamps the caller passes are
kept (Akka's replaces them by a constant to simplify its assertions).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from pykka_delivery.delivery.stores.durable_queue import (
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)

__all__ = ["MemoryDurableQueue"]

LOAD_STATE = "load_state"
STORE_MESSAGE_SENT = "store_message_sent"
STORE_MESSAGES_SENT = "store_messages_sent"
STORE_MESSAGE_CONFIRMED = "store_message_confirmed"


class MemoryDurableQueue:
    """A `DurableProducerQueue` kept in memory, with failure injection.

    Args:
        state: the state to start from (another queue's ``state`` to simulate a restart);
            an empty queue when None.
        fail_when: asked ``fail_when(op, arg)`` before each operation (see the module
            docstring); True makes that call raise `DurableQueueError` without any change.

    Attributes:
        calls: how many times each operation was called (failed calls included).
        failures: how many calls of each operation ``fail_when`` made fail.

    Thread-safe: a controller calls it from its actor's thread while a test reads it.
    """

    def __init__(
        self,
        state: DurableProducerState | None = None,
        *,
        fail_when: Callable[[str, object], bool] | None = None,
    ) -> None:
        if state is not None and not isinstance(state, DurableProducerState):
            msg = (
                f"state must be a DurableProducerState or None, got {type(state).__name__}; "
                "pass another queue's .state to simulate a restart"
            )
            raise TypeError(msg)
        self._state = state if state is not None else DurableProducerState()
        self._fail_when = fail_when
        self._lock = threading.Lock()
        self._closed = False
        self.calls: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()

    @property
    def state(self) -> DurableProducerState:
        """The current state: what a restarted queue would start from."""
        with self._lock:
            return self._state

    @property
    def closed(self) -> bool:
        """True once `close` was called."""
        return self._closed

    def load_state(self) -> DurableProducerState:
        """Return the state without partially stored chunked messages (and keep it so:
        the next store reuses the dropped pieces' seq_nrs)."""
        with self._lock:
            self._check(LOAD_STATE, None)
            self._state = self._state.cleanup_partial_chunked_messages()
            return self._state

    def store_message_sent(self, sent: MessageSent) -> None:
        """Store ``sent``; storing again the last stored seq_nr changes nothing.

        Raises:
            DurableQueueError: injected failure, or ``sent.seq_nr`` is neither the next
                seq_nr nor the last one stored.
        """
        with self._lock:
            self._check(STORE_MESSAGE_SENT, sent)
            self._state = _stored(self._state, (sent,))

    def store_messages_sent(self, sents: Sequence[MessageSent]) -> None:
        """Store consecutive messages, all or none; the batch stored last again changes
        nothing.

        Raises:
            DurableQueueError: injected failure, or the seq_nrs are not consecutive from
                the next seq_nr.
        """
        batch = tuple(sents)
        with self._lock:
            self._check(STORE_MESSAGES_SENT, batch)
            self._state = _stored(self._state, batch)

    def store_message_confirmed(self, seq_nr: int, qualifier: str, timestamp_millis: int) -> None:
        """Confirm up to ``seq_nr`` for ``qualifier``; not above the qualifier's confirmed
        seq_nr changes nothing."""
        with self._lock:
            self._check(STORE_MESSAGE_CONFIRMED, (seq_nr, qualifier, timestamp_millis))
            self._state = _confirmed(self._state, seq_nr, qualifier, timestamp_millis)

    def cleanup(self, qualifiers: Sequence[str]) -> None:
        """Forget the confirmation records of ``qualifiers`` (workers gone); not part of
        the `DurableProducerQueue` protocol (Akka's queue does it on a timer)."""
        with self._lock:
            self._check("cleanup", tuple(qualifiers))
            self._state = self._state.cleanup(qualifiers)

    def flush(self) -> None:
        """Nothing is buffered: every call is applied at once."""

    def close(self) -> None:
        """Refuse further calls; ``state`` stays readable (to start another queue)."""
        with self._lock:
            self._closed = True

    def _check(self, op: str, arg: object) -> None:
        # Counted and refused before anything changes, so a failed call leaves no trace.
        self.calls[op] += 1
        if self._closed:
            msg = f"MemoryDurableQueue.{op}: the queue is closed; build a new one from its .state"
            raise DurableQueueError(msg)
        if self._fail_when is not None and self._fail_when(op, arg):
            self.failures[op] += 1
            msg = f"MemoryDurableQueue.{op}: injected failure (fail_when) at {arg!r}"
            raise DurableQueueError(msg)


def check_batch(current_seq_nr: int, batch: tuple[MessageSent, ...]) -> bool:
    """Whether ``batch`` is to be stored (True) or is the last stored batch again (False).

    The rules every queue shares: the seq_nrs are consecutive and start at the next seq_nr
    (``current_seq_nr``), or end at the last one stored (a retry after an error whose
    write did land; it changes nothing).

    Raises:
        DurableQueueError: any other seq_nrs, or an element that is not a `MessageSent`.
    """
    for sent in batch:
        if not isinstance(sent, MessageSent):
            msg = f"expected MessageSent, got {type(sent).__name__}; wrap the message in one"
            raise DurableQueueError(msg)
        seq_nr = sent.seq_nr
        if not isinstance(seq_nr, int) or isinstance(seq_nr, bool) or seq_nr < 1:
            msg = f"seq_nr must be an int of 1 or more, got {seq_nr!r}"
            raise DurableQueueError(msg)
    if not batch:
        return False
    first = batch[0].seq_nr
    for offset, sent in enumerate(batch):
        if sent.seq_nr != first + offset:
            msg = (
                f"seq_nrs must be consecutive, got {[s.seq_nr for s in batch]}; "
                "store messages in seq_nr order"
            )
            raise DurableQueueError(msg)
    last = batch[-1].seq_nr
    if first == current_seq_nr:
        return True
    if last == current_seq_nr - 1:
        return False
    msg = (
        f"unexpected seq_nr {first}"
        + (f"..{last}" if last != first else "")
        + f": the next seq_nr is {current_seq_nr}; load the state again and "
        "continue from its current_seq_nr"
    )
    raise DurableQueueError(msg)


def _stored(state: DurableProducerState, batch: tuple[MessageSent, ...]) -> DurableProducerState:
    if not check_batch(state.current_seq_nr, batch):
        return state
    for sent in batch:
        state = state.add_message_sent(sent)
    return state


def confirm_applies(
    confirmed: Mapping[str, tuple[int, int]], seq_nr: int, qualifier: str, timestamp_millis: int
) -> bool:
    """Whether confirming ``seq_nr`` for ``qualifier`` changes anything, given the
    ``confirmed`` seq_nrs per qualifier: only a seq_nr above the one already confirmed for
    that qualifier (0 when none) does, as in Akka's EventSourcedProducerQueue.

    Raises:
        DurableQueueError: ``seq_nr`` or ``timestamp_millis`` is not an int >= 0, or
            ``qualifier`` is not a str.
    """
    for name, value in (("seq_nr", seq_nr), ("timestamp_millis", timestamp_millis)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            msg = f"store_message_confirmed: {name} must be an int >= 0, got {value!r}"
            raise DurableQueueError(msg)
    if not isinstance(qualifier, str):
        msg = f"store_message_confirmed: qualifier must be a str, got {qualifier!r}"
        raise DurableQueueError(msg)
    previous = confirmed.get(qualifier)
    return seq_nr > (previous[0] if previous is not None else 0)


def _confirmed(
    state: DurableProducerState, seq_nr: int, qualifier: str, timestamp_millis: int
) -> DurableProducerState:
    if not confirm_applies(state.confirmed_seq_nr, seq_nr, qualifier, timestamp_millis):
        return state
    return state.confirmed(seq_nr, qualifier, timestamp_millis)
