"""Pieces the blocking and the asyncio handles share (how they wait differs; this not)."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pykka_delivery.delivery.core.consumer import ConsumerCore
from pykka_delivery.delivery.core.effects import CancelTimer, Effect, Send, StartTimer
from pykka_delivery.delivery.core.producer import ProducerCore
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.stores.calls import STORE_EFFECTS, DurableQueueCalls
from pykka_delivery.delivery.stores.dead_letters import DeadLetterError
from pykka_delivery.delivery.stores.dedup import DedupWriter
from pykka_delivery.delivery.stores.durable_queue import (
    DurableProducerQueue,
    DurableProducerState,
    DurableQueueError,
)
from pykka_delivery.delivery.timers import TimerFired, Timers
from pykka_delivery.errors import ClosedError, DeliveryTimeout, LocalProtocolError
from pykka_delivery.protocol.messages import PeerLinkChanged, Ref, SequencedMessage, SequencedRun

__all__ = [
    "DeliveryFeed",
    "Ignore",
    "InboxLock",
    "ProducerEffects",
    "ReadyDeliveries",
    "ReplySlot",
    "failed_error",
    "open_durable",
    "send_batch_through",
    "send_through",
]

logger = logging.getLogger("pykka_delivery.consumer")


def send_through(core: ProducerCore, message: Any, run: Callable[[list[Effect]], None]) -> int:
    """A producer handle's send, once it has demand: the core's steady-state path (the
    numbered message goes straight to the consumer side) or, failing that, `on_msg` with
    its effects carried out by ``run``. Returns the message's (last chunk's) seq_nr."""
    seq_msg = core.next_message(message)
    if seq_msg is not None:
        core.consumer.tell(seq_msg)  # type: ignore[union-attr] # set while active
        return seq_msg.seq_nr
    run(core.on_msg(message))
    return core.last_seq_nr


def send_batch_through(
    core: ProducerCore, messages: Iterator[Any], run: Callable[[list[Effect]], None]
) -> list[int]:
    """A producer handle's ``send_many`` step, once it has demand: as many messages from
    ``messages`` as the window allows (`ProducerCore.on_msg_batch`), their effects carried
    out by ``run`` (in durable mode one store for all). Returns their seq_nrs (each one's
    last chunk's); empty when ``messages`` is exhausted."""
    before = core.last_seq_nr
    run(core.on_msg_batch(messages))
    last = core.last_seq_nr
    if last == before:
        return []
    if core.settings.chunk_large_messages:
        return [last]  # one message per batch when chunking
    return list(range(before + 1, last + 1))


def open_durable(
    queue: DurableProducerQueue | None, settings: ProducerControllerSettings | None, owner: str
) -> tuple[DurableQueueCalls | None, DurableProducerState | None]:
    """A producer handle's durable queue wrapped for retried calls, and its loaded state
    (both None without a queue).

    Raises:
        DurableQueueError: loading failed every attempt.
    """
    if queue is None:
        return None, None
    calls = DurableQueueCalls(queue, settings or ProducerControllerSettings(), owner)
    return calls, calls.load()


def failed_error(producer_id: str) -> DurableQueueError:
    """What every call on a producer handle raises once its durable queue failed (raise
    it from that failure)."""
    msg = (
        f"Producer {producer_id!r} is closed: its durable queue failed (see the cause); "
        "create a new producer with the same producer id on the same queue: it reloads "
        "what was stored and resends what is unconfirmed"
    )
    return DurableQueueError(msg)


class ReplySlot:
    """``reply_to`` of a ``send_and_confirm``: the seq_nr lands here."""

    __slots__ = ("seq_nr",)

    def __init__(self) -> None:
        self.seq_nr: int | None = None

    def tell(self, message: Any) -> None:
        self.seq_nr = message


class Ignore:
    """A producer handle's core's "producer": demand is read from the core instead."""

    __slots__ = ()

    def tell(self, message: Any) -> None:
        pass


class ReadyDeliveries:
    """A consumer handle's core's "consumer": deliveries wait here to be received."""

    __slots__ = ("deliveries",)

    def __init__(self) -> None:
        self.deliveries: deque[Delivery] = deque()

    def tell(self, message: Any) -> None:
        self.deliveries.append(message)


class DeliveryFeed:
    """Feeding a consumer handle's inbox to its core, one message at a time, only until
    the core hands out a delivery (so the core's stash stays empty)."""

    _ready: ReadyDeliveries
    _inbox: deque[Any]
    _core: ConsumerCore
    _timers: Timers
    _outstanding: Delivery | None
    _closed: bool
    _run: Callable[[list[Effect]], None]  # each handle carries out effects its own way
    _dead_letter_error: DeadLetterError | None  # closed because a dead letter failed
    _dedup: DedupWriter | None

    def _check_open(self) -> None:
        if not self._closed:
            return
        if self._dead_letter_error is not None:
            error: Exception = self._dead_letter_error
            msg = f"Consumer was closed because a dead letter could not be written: {error}"
            raise ClosedError(msg) from error
        broken = None if self._dedup is None else self._dedup.broken
        if broken is not None:
            msg = f"Consumer was closed because its deduplication store failed: {broken}"
            raise ClosedError(msg) from broken
        msg = "Consumer is closed"
        raise ClosedError(msg)

    def _check_can_receive(self) -> None:
        self._check_open()
        if self._outstanding is not None:
            msg = (
                f"Consumer: delivery seq_nr {self._outstanding.seq_nr} is not confirmed yet: "
                "call delivery.confirm() before receiving the next"
            )
            raise LocalProtocolError(msg)

    def _feed(self, message: Any) -> None:
        if type(message) is SequencedMessage:
            self._run(self._core.on_sequenced(message))
        elif type(message) is TimerFired:
            if self._timers.accept(message):
                self._run(self._core.on_timer(message.key))
        elif type(message) is PeerLinkChanged:
            self._run(self._core.on_peer_link_changed(message))
        elif type(message) is SequencedRun:
            for sequenced in message.expand():
                self._run(self._core.on_sequenced(sequenced))
        else:
            logger.error("Consumer cannot handle %s: dropped", type(message).__name__)

    def _next_ready(self) -> Delivery | None:
        """Feed the inbox to the core until it hands out a delivery (or the inbox is empty)."""
        ready = self._ready.deliveries
        inbox = self._inbox
        core = self._core
        while not ready and inbox:
            message = inbox[0]
            if type(message) is SequencedRun:
                delivery = core.next_run_delivery(message)  # the steady state
                if delivery is not None:
                    if message.seq_nr == message.last_seq_nr:
                        inbox.popleft()
                    self._outstanding = delivery
                    return delivery
                # Not the steady state: the rest of the run one message at a time.
                inbox.popleft()
                inbox.extendleft(reversed(message.expand()))
                continue
            inbox.popleft()
            if type(message) is SequencedMessage:
                delivery = core.next_delivery(message)  # the steady state: no effects to run
                if delivery is not None:
                    self._outstanding = delivery
                    return delivery
            self._feed(message)
        if not ready:
            return None
        delivery = ready.popleft()
        self._outstanding = delivery
        return delivery


class InboxLock:
    """How a blocking producer handle (`Producer`, `WorkPullingProducer`) takes what other
    threads tell it: queued in ``_inbox``, processed (``_drain``) by whichever thread holds
    ``_lock``, with no thread hop when nobody holds it.

    * A sender that must wait (`_wait_for`) announces it (``_sleeping``), looks at the
      inbox once more, then waits on ``_changed``; a message queued after that look finds
      ``_sleeping`` set and takes the lock to process it and wake the sender.
    * A message queued while another thread holds the lock is left to that thread
      (`_after_release`).
    * ``_caller`` is the thread telling others under the lock (in ``_drain``): a ref that
      answers at once, on that thread, finds it set and leaves its answer in the inbox for
      the running drain, instead of waiting for a lock its own thread holds.
    """

    _lock: threading.Lock
    _changed: threading.Condition
    _inbox: deque[Any]
    _sleeping: bool
    _caller: int
    _closed: bool
    # What each handle provides: the effects of one message from the inbox (None: it is
    # dropped, already logged), carrying effects out, raising if closed, and the wording
    # of a `DeliveryTimeout`.
    _effects_of: Callable[[Any], list[Effect] | None]
    _run: Callable[[list[Effect]], None]
    _check_open: Callable[[], None]
    _timeout_message: Callable[[str, float | None], str]

    def _drain(self) -> None:
        """With the lock held: process the inbox, then wake whoever waits for a change."""
        inbox = self._inbox
        if not inbox:
            return
        if self._closed:
            inbox.clear()  # closed: what the other side says is ignored
            return
        while inbox:
            effects = self._effects_of(inbox.popleft())
            if effects is None:
                continue
            try:
                self._run(effects)
            except DurableQueueError:
                return  # _fail closed the handle; the application's next call raises
        self._changed.notify_all()

    def _wait_for(self, ready: Callable[[], bool], timeout: float | None, what: str) -> None:
        """With the lock held: wait until ``ready()``, processing what arrives.

        Raises:
            DeliveryTimeout: not ready within ``timeout`` seconds.
        """
        self._check_open()
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
                        raise DeliveryTimeout(self._timeout_message(what, timeout))
                    self._changed.wait(remaining)
            finally:
                self._sleeping = False
            self._check_open()
            self._drain()

    def _inbound(self, message: Any) -> None:
        """Called on any thread. Queue first, then process if nobody holds the lock."""
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


class ProducerEffects:
    """How the producer handles (`Producer`, `AsyncProducer`, `WorkPullingProducer`) carry
    out their core's effects, and close when the durable queue fails every attempt."""

    _closed: bool
    _timers: Timers
    _inbox: deque[Any]
    _durable: DurableQueueCalls | None
    _failure: DurableQueueError | None
    # What each handle provides: carry out a `Send` (it knows what it may skip or drop),
    # and wake whoever waits for a change (a condition, or futures on a loop).
    _tell: Callable[[Ref, Any], None]
    _wake_waiters: Callable[[], None]

    def _carry_out(self, effects: list[Effect]) -> None:
        """Carry out ``effects`` in order.

        Raises:
            DurableQueueError: a store failed every attempt; the handle is closed
                (`_fail`) and the effects after it are not carried out.
        """
        for effect in effects:
            if type(effect) is Send:
                self._tell(effect.to, effect.message)
            elif type(effect) is StartTimer:
                if not self._closed:
                    self._timers.start(effect.key, effect.interval)
            elif type(effect) is CancelTimer:
                self._timers.cancel(effect.key)
            elif isinstance(effect, STORE_EFFECTS) and self._durable is not None:
                try:
                    self._durable.store(effect)
                except DurableQueueError as error:
                    self._fail(error)
                    raise

    def _fail(self, error: DurableQueueError) -> None:
        """The durable queue failed every attempt: the core's state is ahead of what is
        stored, so nothing more may be sent from it. Close; the calls raise ``error``."""
        self._failure = error
        self._closed = True
        self._timers.cancel_all()
        self._inbox.clear()
        self._wake_waiters()
