"""The blocking producer handles' waiting (`Producer`, `WorkPullingProducer`): a lock and a
condition around a producer session, with no thread of their own.

What other threads tell the handle is queued in the session's inbox and processed
(`_drain`) by whichever thread holds ``_lock``, with no thread hop when nobody holds it:

* A sender that must wait (`_wait_for`) announces it (``_sleeping``), looks at the inbox
  once more, then waits on ``_changed``; a message queued after that look finds
  ``_sleeping`` set and takes the lock to process it and wake the sender.
* A message queued while another thread holds the lock is left to that thread
  (`_after_release`).
* ``_caller`` is the thread telling others under the lock (draining, or sending the
  general way): a ref that answers at once, on that thread, finds it set and leaves its
  answer in the inbox for that thread, instead of waiting for a lock its own thread holds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Generic, Self, TypeVar

from pykka_delivery.delivery.core.effects import Effect
from pykka_delivery.delivery.session.producer import ProducerSession, ReplySlot
from pykka_delivery.delivery.session.work_pulling import WorkPullingSession
from pykka_delivery.errors import DeliveryTimeout, WouldBlock

__all__ = ["BlockingProducer"]

S = TypeVar("S", ProducerSession, WorkPullingSession)
T = TypeVar("T")


class BlockingProducer(Generic[S]):
    """The waiting and the calls `Producer` and `WorkPullingProducer` share. A subclass
    calls `_open` with its session, then writes its own `send` (the hot path)."""

    _session: S
    _inbox: deque[Any]

    def _open(self, session: S) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._sleeping = False  # the lock holder is about to wait for a change
        self._caller = 0  # the thread telling others under the lock
        self._session = session
        self._inbox = session.inbox
        session.runner = self._run

    # --- the calls ---------------------------------------------------------------------

    def send_many(self, messages: Iterable[Any], timeout: float | None = None) -> list[int]:
        """Send ``messages`` in order, each once there is demand for it; returns their
        seq_nrs. It takes as many at a time as the demand allows (a `Producer`: its
        consumer's window), which saves a call per message. With a durable queue a
        `Producer` stores each batch with one write (one commit), which is what makes
        durable sending fast, and stores up to ``durable_store_ahead`` more messages of the
        call in that write (`ProducerControllerSettings`): those are in the stream once
        stored and go out as the consumer asks for them, so the call may return before
        they are sent. What the other side answers meanwhile is processed between batches.

        All or nothing for payloads: once the first can go out, every one is checked for
        where they go (``SerializationError``, nothing sent, if one cannot be encoded).

        Raises:
            DeliveryTimeout: not all were sent within ``timeout`` seconds; the error says
                how many were (those are in the stream; the rest were not sent).
            SerializationError: one cannot be encoded for the consumer side (a worker, for
                a work-pulling producer) or the durable queue; none was sent.
            ClosedError: the producer was closed.
            DurableQueueError: storing failed every attempt (the producer is closed).
        """
        pending = list(messages)
        seq_nrs: list[int] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        iterator = iter(pending)
        session = self._session
        checked = None
        with self._lock:
            session.check_open()
            while len(seq_nrs) < len(pending):
                remaining = None if deadline is None else deadline - time.monotonic()
                try:
                    self._wait_for(self._has_demand, remaining, session.DEMAND_TO_SEND)
                except DeliveryTimeout:
                    msg = session.partly_sent_message(timeout, len(seq_nrs), len(pending))
                    raise DeliveryTimeout(msg) from None
                if not seq_nrs:  # the consumer side is known now: check them all
                    checked = session.check_payloads(pending)
                seq_nrs += self._as_caller(session.send_batch, iterator, checked)
        self._after_release()
        return seq_nrs

    def send_nowait(self, message: Any) -> int:
        """Send ``message`` if there is demand now; returns its seq_nr.

        Raises:
            WouldBlock: no demand at the moment (nothing was sent).
            ClosedError: the producer was closed.
            SerializationError: its payload cannot be encoded for where it goes (nothing
                was sent).
            DurableQueueError: storing it failed every attempt (the producer is closed).
        """
        session = self._session
        with self._lock:
            session.check_open()
            self._drain()
            seq_nr = self._as_caller(session.try_send, message)
            if seq_nr is None:
                raise WouldBlock(session.no_demand_message())
        self._after_release()
        return seq_nr

    def send_and_confirm(self, message: Any, timeout: float | None = None) -> int:
        """Send ``message`` and wait until the other side confirmed it (with a durable
        queue, as in Akka, until it is stored); returns its seq_nr.

        Raises:
            DeliveryTimeout: not sent, or not confirmed, within ``timeout`` seconds (if it
                was sent, it stays in the stream and will still be delivered).
            SerializationError: its payload cannot be encoded for where it goes (nothing
                was sent).
            ClosedError: the producer was closed.
            DurableQueueError: storing it failed every attempt (the producer is closed).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        slot = ReplySlot()
        session = self._session
        with self._lock:
            self._wait_for(self._has_demand, timeout, session.DEMAND_TO_SEND)
            seq_nr = session.send(message, slot)
            self._wait_for(
                lambda: slot.seq_nr is not None,
                None if deadline is None else deadline - time.monotonic(),
                f"confirmation of seq_nr {seq_nr}",
            )
        self._after_release()
        return seq_nr

    def wait_confirmed(self, timeout: float | None = None) -> None:
        """Block until every message sent so far is confirmed.

        Raises:
            DeliveryTimeout: some are still unconfirmed after ``timeout`` seconds.
            ClosedError: the producer was closed.
        """
        with self._lock:
            self._wait_for(self._all_confirmed, timeout, "confirmation of every message")
        self._after_release()

    def close(self) -> None:
        """Stop the timers, refuse further sends and ignore the other side from now on:
        unconfirmed messages are not sent again (close after `wait_confirmed` to be sure
        nothing is lost, or use a durable queue). The durable queue, if any, is flushed,
        not closed: its owner closes it."""
        with self._lock:
            self._session.close()
            self._changed.notify_all()
        self._session.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- waiting (with the lock held unless said otherwise) ------------------------------

    def _has_demand(self) -> bool:
        return self._session.has_demand

    def _all_confirmed(self) -> bool:
        return self._session.all_confirmed

    def _wait_for(self, ready: Callable[[], bool], timeout: float | None, what: str) -> None:
        """Wait until ``ready()``, processing what arrives.

        Raises:
            DeliveryTimeout: not ready within ``timeout`` seconds.
            ClosedError, DurableQueueError: the session is closed (`check_open`).
        """
        session = self._session
        session.check_open()
        self._drain()
        if ready():
            return
        deadline = None if timeout is None else time.monotonic() + timeout
        while not ready():
            # Announce the wait, then look at the inbox once more: a message queued after
            # our last drain either shows up here, or its sender sees `_sleeping` and
            # waits for the lock to wake us (see `_process_inbound`).
            self._sleeping = True
            try:
                if self._inbox:
                    self._drain()
                    continue
                if deadline is None:
                    self._changed.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise DeliveryTimeout(session.timeout_message(what, timeout))
                    self._changed.wait(remaining)
            finally:
                self._sleeping = False
            session.check_open()
            self._drain()

    def _drain(self) -> None:
        """Process the inbox, then wake whoever waits for a change."""
        if not self._inbox:
            return
        if self._as_caller(self._session.process_inbox):
            self._changed.notify_all()

    def _run(self, effects: list[Effect]) -> None:
        """The session's runner: its effects carried out with this thread as the caller."""
        self._as_caller(self._session.run, effects)

    def _as_caller(self, call: Callable[..., T], *args: Any) -> T:
        caller = self._caller
        self._caller = threading.get_ident()
        try:
            return call(*args)
        finally:
            self._caller = caller

    def _on_failure(self) -> None:
        self._changed.notify_all()  # the waiters raise the failure

    # --- arrivals (any thread) -----------------------------------------------------------

    def _inbound(self, message: Any) -> None:
        """Queue first, then process if nobody holds the lock."""
        self._inbox.append(message)
        self._process_inbound()

    def _inbound_many(self, messages: list[Any]) -> None:
        self._inbox.extend(messages)
        self._process_inbound()

    def _process_inbound(self) -> None:
        if self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()
            self._after_release()
        elif self._sleeping and self._caller != threading.get_ident():
            # The holder is between its last look at the inbox and its wait: it releases
            # the lock in a moment, and must be woken. (Unless this thread holds the lock
            # itself and is telling a ref that answered at once, on this thread: then the
            # running drain takes the answer.)
            with self._lock:
                self._drain()

    def _after_release(self) -> None:
        # A message queued while we held the lock found it taken and left it to us.
        while self._inbox and self._lock.acquire(blocking=False):
            try:
                self._drain()
            finally:
                self._lock.release()
