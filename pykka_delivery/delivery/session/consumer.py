"""`ConsumerSession`: the one interpreter of a `ConsumerCore`'s effects, for every shell.

Theory of operation. Three shells run a consumer core: the blocking `Consumer` and the
asyncio `AsyncConsumer` handles, whose deliveries wait here until the application takes
them, and the `ConsumerController` actor, whose deliveries go out to its consumer actor.
They differ only in how they wait; everything else is here, with no waiting and no threads
(the shell calls one method at a time: under a lock, on its event loop, in its mailbox).

* The inbox: what the producer side, the timers and a transport tell the shell's endpoint,
  appended from any thread (`accept`, `accept_many`). `poll` feeds it to the core one
  message at a time, and only until the core hands out a delivery, so the core's stash
  stays empty and the inbox is the buffer (the producer side sends at most a window).
* The steady state first: a `SequencedMessage` or `SequencedRun` at the head of the inbox
  goes through `ConsumerCore.next_delivery`, with no effect list; anything else, and what
  it refuses, through the core's general inputs.
* The outstanding delivery: handed out by `poll`, answered once by `confirm` or `reject`.
* `_run`, the effect interpreter: a delivery goes to the ready queue (handles) or out
  (the actor); a `Request` or `Ack` goes out only after the deduplication store is
  flushed (dedup.py), `RecordConfirmed` is recorded there, `WriteDeadLetter` is written
  before the confirmation that follows it, timers start and stop.
* The outbox: what is told once the caller's step is done (`take_outbox`), outside the
  shell's lock, so that a producer answering at once on the same thread finds the
  consumer consistent.
* One failure rule: a deduplication store or dead-letter destination that fails closes
  the session at once and drops the outbox, so nothing unflushed or unwritten reaches the
  producer side (which keeps those messages for the next consumer). The error is raised
  to the call that met it and named by every `ClosedError` after.
* Fencing is the same rule: a `Fenced` of a newer epoch from the producer side, or a
  `ConsumerFenced` from the deduplication store, closes the session at once (nothing more
  is delivered or confirmed), and every call after raises `ConsumerFenced`.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, NoReturn

from pykka_delivery.delivery.core.consumer import ConsumerCore, ConsumerSnapshot, ConsumerStats
from pykka_delivery.delivery.core.consumer_control import check_epoch
from pykka_delivery.delivery.core.effects import (
    CancelTimer,
    Effect,
    RecordConfirmed,
    Send,
    StartTimer,
    Stop,
    WriteDeadLetter,
)
from pykka_delivery.delivery.core.settings import (
    ACTOR_FLOW_CONTROL_WINDOW,
    HANDLE_FLOW_CONTROL_WINDOW,
    ConsumerControllerSettings,
)
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.stores.dead_letters import (
    DeadLetterDestination,
    DeadLetterError,
    dead_letter_destination,
    write_dead_letter,
)
from pykka_delivery.delivery.stores.dedup import DedupStore, DedupStoreError, DedupWriter
from pykka_delivery.delivery.timers import TimerFired, Timers
from pykka_delivery.errors import (
    ClosedError,
    ConsumerFenced,
    DeliveryTimeout,
    LocalProtocolError,
    WouldBlock,
)
from pykka_delivery.protocol.messages import (
    Fenced,
    PeerLinkChanged,
    Ref,
    SequencedMessage,
    SequencedRun,
    with_link_problem,
)
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["ConsumerSession", "Sends", "nothing_ready"]

logger = logging.getLogger("pykka_delivery.consumer")

Sends = Sequence[tuple[Ref, Any]]


class _Ready:
    """The core's "consumer" when the session hands deliveries out: `_run` queues what
    is sent to it (so its ``tell`` is only there to make it a ref)."""

    __slots__ = ("_deliveries",)

    def __init__(self, deliveries: deque[Delivery]) -> None:
        self._deliveries = deliveries

    def tell(self, message: Any) -> None:
        self._deliveries.append(message)


class ConsumerSession:
    """A consumer core with its inbox, its outstanding delivery, its stores and timers.

    Args:
        self_ref: where the producer side reaches the shell (`RegisterConsumer` names it).
        settings: see `ConsumerControllerSettings`.
        name: how the shell is created, for the errors that name a fix
            (``"Consumer"``, ``"AsyncConsumer"``, ``"ConsumerController.start"``).
        timers: the shell's timers; their firings must reach the inbox (a handle) or the
            shell (an actor, which feeds them to the core itself).
        inbox: the deque the shell's endpoint appends to (made by the shell when its
            endpoint must exist first); default: a new one.
        serialization: for chunked messages.
        confirm_to, new_confirm_to: ``Delivery.confirm_to``, see `ConsumerCore`.
        dedup_store: turns on deduplication across restarts (dedup.py); its positions
            are loaded here.
        dead_letters: where rejected messages go at ``max_attempts``: a
            `DeadLetterDestination`, or the path of an SQLite file or a ``postgresql://``
            URL of a store the session owns (closed by `close`); None: `reject` is refused.
        hand_out: True (the handles): the session is the core's consumer, and its
            deliveries wait for `poll`. False (the actor): they go out, to the consumer
            the core is started with (`ConsumerStart`), like any other send.
        on_end: called when the session ends by itself: the core stopped (``Stop``:
            `deliver_then_stop` done, the consumer gone, fenced) or a store failed. A
            handle wakes its waiting reader; an actor stops.
        epoch: the fencing epoch of this activation (0: none), see `ConsumerCore`. Above
            0, a ``dedup_store`` with a ``fence`` method is fenced with it before its
            positions are loaded.

    Raises:
        TypeError, ValueError: ``epoch`` is not an int >= 0.
        ConsumerFenced: the deduplication store holds a newer epoch already.
        DedupStoreError: the deduplication store could not be loaded.
        TypeError: ``dedup_store`` or ``dead_letters`` is not one.
        DeadLetterError: the dead-letter file cannot be opened.
    """

    __slots__ = (
        "_dead_letters",
        "_dedup",
        "_failure",
        "_name",
        "_on_end",
        "_owns_dead_letters",
        "_ready",
        "_ready_ref",
        "_timers",
        "accept",
        "accept_many",
        "closed",
        "core",
        "inbox",
        "outbox",
        "outstanding",
    )

    def __init__(
        self,
        self_ref: Ref,
        settings: ConsumerControllerSettings | None = None,
        *,
        name: str,
        timers: Timers,
        inbox: deque[Any] | None = None,
        serialization: Serialization | None = None,
        confirm_to: Ref | None = None,
        new_confirm_to: Callable[[], Ref] | None = None,
        dedup_store: DedupStore | None = None,
        dead_letters: DeadLetterDestination | str | os.PathLike[str] | None = None,
        hand_out: bool = True,
        on_end: Callable[[], None] | None = None,
        epoch: int = 0,
    ) -> None:
        settings = settings or ConsumerControllerSettings()
        check_epoch(epoch, name)
        self._dedup = None if dedup_store is None else DedupWriter(dedup_store, settings)
        fence = getattr(dedup_store, "fence", None) if epoch else None
        if fence is not None:  # a user's own store may have none
            fence(epoch)
        positions = None if self._dedup is None else self._dedup.load()
        self._dead_letters, self._owns_dead_letters = dead_letter_destination(dead_letters)
        self.core = ConsumerCore(
            self_ref,
            settings,
            serialization,
            confirm_to,
            new_confirm_to,
            dedup_positions=positions,
            default_window=HANDLE_FLOW_CONTROL_WINDOW if hand_out else ACTOR_FLOW_CONTROL_WINDOW,
            epoch=epoch,
        )
        self.inbox: deque[Any] = deque() if inbox is None else inbox
        # A deque's append and extend are atomic: any thread may call them.
        self.accept = self.inbox.append
        self.accept_many = self.inbox.extend
        self._name = name
        self._timers = timers
        self._on_end = on_end
        self._ready: deque[Delivery] = deque()
        self._ready_ref = _Ready(self._ready) if hand_out else None
        self.outstanding: Delivery | None = None
        self.outbox: list[tuple[Ref, Any]] = []
        self.closed = False
        self._failure: DedupStoreError | DeadLetterError | ConsumerFenced | None = None

    def start(self) -> None:
        """Start the core's retry timer and, when handing deliveries out, register as
        its consumer. Call once, before anything else."""
        self._run(self.core.on_spawned())
        if self._ready_ref is not None:
            self._run(self.core.on_start(self._ready_ref))

    # --- the consumer's side ---------------------------------------------------------

    def poll(self) -> Delivery | None:
        """The next delivery, if what arrived so far yields one; it is then outstanding.
        None: nothing yet (what the core sent meanwhile is in the outbox).

        Raises:
            ClosedError: the session is closed (`check_open`).
            LocalProtocolError: the outstanding delivery is not answered yet.
            DedupStoreError, DeadLetterError: a store failed (the session is closed).
        """
        if self.closed or self.outstanding is not None:
            self.check_can_receive()
        ready = self._ready
        inbox = self.inbox
        while inbox and not ready:
            head = inbox[0]
            if type(head) is SequencedRun:
                delivery = self.core.next_delivery(head, True)  # the steady state
                if delivery is not None:
                    if head.seq_nr == head.last_seq_nr:
                        inbox.popleft()
                    self.outstanding = delivery
                    return delivery
                # Not the steady state: the rest of the run one message at a time.
                inbox.popleft()
                inbox.extendleft(reversed(head.expand()))
                continue
            inbox.popleft()
            if type(head) is SequencedMessage:
                delivery = self.core.next_delivery(head)  # the steady state
                if delivery is not None:
                    self.outstanding = delivery
                    return delivery
            self._feed(head)
            if self.closed:  # fenced
                self.check_open()
        if not ready:
            return None
        delivery = ready.popleft()
        self.outstanding = delivery
        return delivery

    def expects(self, confirm_to: Ref) -> bool:
        """Whether the session is open and ``confirm_to`` is the outstanding delivery's
        (may be asked from any thread)."""
        outstanding = self.outstanding
        return outstanding is not None and outstanding.confirm_to is confirm_to and not self.closed

    def confirm(self, confirm_to: Ref) -> Sends:
        """The outstanding delivery, whose ``confirm_to`` this is, was confirmed.
        Returns what to tell now (the outbox, taken).

        Raises:
            ClosedError: the session is closed.
            LocalProtocolError: not the outstanding delivery (answered already?).
            DedupStoreError: the deduplication store failed (the session is closed).
        """
        outstanding = self.outstanding
        if outstanding is None or outstanding.confirm_to is not confirm_to or self.closed:
            self.refuse("confirm")
        self.outstanding = None
        effects = self.core.on_confirmed()
        if effects:  # mostly none: a Request goes out once per half window
            self._run(effects)
            return self.take_outbox()
        return ()

    def reject(self, confirm_to: Ref, reason: str) -> Sends:
        """The outstanding delivery was rejected: it comes again after the backoff, or
        goes to the dead letters at ``max_attempts``. Returns what to tell now.

        Raises:
            ClosedError: the session is closed.
            LocalProtocolError: not the outstanding delivery, or no dead-letter
                destination (`check_can_reject`; nothing changed).
            DeadLetterError, DedupStoreError: a store failed (the session is closed).
        """
        if not self.expects(confirm_to):
            self.refuse("reject")
        self.check_can_reject()
        self.outstanding = None
        self._run(self.core.on_rejected(reason))
        return self.take_outbox()

    def refuse(self, answer: Literal["confirm", "reject"]) -> NoReturn:
        """Raise why an answer (of a delivery that is not the outstanding one) is refused.

        Raises:
            ClosedError: the session is closed.
            LocalProtocolError: otherwise.
        """
        self.check_open()
        if answer == "confirm":
            msg = (
                "Consumer: confirm() of a delivery that is not the outstanding one "
                "(already confirmed?): confirm each delivery once"
            )
        else:
            msg = (
                "Consumer: reject() of a delivery that is not the outstanding one "
                "(already confirmed or rejected?): answer each delivery once"
            )
        raise LocalProtocolError(msg)

    def check_can_reject(self) -> None:
        """Raises `LocalProtocolError` without a dead-letter destination: a message
        rejected ``max_attempts`` times would have nowhere to go."""
        if self._dead_letters is None:
            msg = (
                "Consumer: reject() needs a dead-letter destination for the messages "
                f"rejected max_attempts times: pass {self._name}(dead_letters=path or "
                "destination); nothing changed"
            )
            raise LocalProtocolError(msg)

    # --- the producer's side and the lifecycle ---------------------------------------

    def register_to(self, producer_controller: Ref) -> None:
        """Connect to ``producer_controller`` (repeated until its first message arrives).

        Raises:
            ClosedError: the session is closed.
        """
        self.check_open()
        self._run(self.core.on_register_to(producer_controller))

    def deliver_then_stop(self) -> None:
        """Stop once every message received so far is delivered and confirmed.

        Raises:
            ClosedError: the session is closed.
        """
        self.check_open()
        # What already arrived counts as received: take it into the core first.
        inbox = self.inbox
        while inbox:
            self._feed(inbox.popleft())
        self._run(self.core.on_deliver_then_stop())

    def close(self) -> None:
        """Stop now: the core's `Ack` of what is confirmed goes to the outbox, after the
        deduplication store is flushed (unconfirmed messages stay with the producer side,
        for the next consumer). Timers stop; an owned dead-letter file is closed. Once
        closed, calling it again does nothing.

        Raises:
            DedupStoreError: the store could not be flushed (the outbox is dropped; the
                session is closed all the same).
        """
        try:
            if not self.closed:
                self.closed = True
                self._run(self.core.on_stopped())
                if self._dedup is not None:
                    self._dedup_call(self._dedup.flush)
        finally:
            self._timers.cancel_all()
            if self._owns_dead_letters:
                self._owns_dead_letters = False
                self._dead_letters.close()  # type: ignore[union-attr] # owned: SQLite

    def run(self, effects: Iterable[Effect]) -> None:
        """Carry out effects of the core that the shell fed itself (the actor); after a
        store failed, nothing is carried out any more.

        Raises:
            DedupStoreError, DeadLetterError: a store failed (the session is closed).
        """
        if self._failure is None:
            self._run(effects)

    def take_outbox(self) -> list[tuple[Ref, Any]]:
        """What the core sent since the last call, to be told in order."""
        sends = self.outbox
        if sends:
            self.outbox = []
        return sends

    # --- checks and queries ----------------------------------------------------------

    def check_open(self) -> None:
        """Raises `ClosedError` once the session is closed, naming the failure that
        closed it, if one did; `ConsumerFenced` once it was fenced."""
        if not self.closed:
            return
        failure = self._failure
        if isinstance(failure, ConsumerFenced):
            raise ConsumerFenced(str(failure), failure.epoch, failure.newer_epoch)
        if isinstance(failure, DeadLetterError):
            msg = f"Consumer was closed because a dead letter could not be written: {failure}"
            raise ClosedError(msg) from failure
        if failure is not None:
            msg = f"Consumer was closed because its deduplication store failed: {failure}"
            raise ClosedError(msg) from failure
        msg = "Consumer is closed"
        raise ClosedError(msg)

    def check_can_receive(self) -> None:
        """Raises `ClosedError` once closed, `LocalProtocolError` while a delivery is
        outstanding."""
        self.check_open()
        if self.outstanding is not None:
            msg = (
                f"Consumer: delivery seq_nr {self.outstanding.seq_nr} is not confirmed yet: "
                "call delivery.confirm() before receiving the next"
            )
            raise LocalProtocolError(msg)

    def check_not_stopped(self) -> None:
        """Raises `ClosedError` once the core stopped after `deliver_then_stop`: nothing
        more will be delivered."""
        if self.core.is_stopped:
            msg = "Consumer stopped after delivering every message (deliver_then_stop)"
            raise ClosedError(msg)

    @property
    def is_stopped(self) -> bool:
        return self.core.is_stopped

    def nothing_delivered(self, timeout: float | None) -> DeliveryTimeout:
        """The `DeliveryTimeout` of a ``receive`` that got nothing within ``timeout``,
        naming why the link to the producer side is down when its ref can say."""
        core = self.core
        peer = core.registering if core.registering is not None else core.producer_controller
        msg = f"Consumer: nothing delivered within {timeout} s"
        return DeliveryTimeout(with_link_problem(msg, peer))

    def snapshot(self) -> ConsumerSnapshot:
        return self.core.snapshot()

    def statistics(self) -> ConsumerStats:
        return self.core.statistics()

    # --- internals -------------------------------------------------------------------

    def _feed(self, message: Any) -> None:
        core = self.core
        if type(message) is SequencedMessage:
            self._run(core.on_sequenced(message))
        elif type(message) is TimerFired:
            if self._timers.accept(message):
                self._run(core.on_timer(message.key))
        elif type(message) is PeerLinkChanged:
            self._run(core.on_peer_link_changed(message))
        elif type(message) is Fenced:
            core.on_fenced(message)
            error = core.fenced_error()
            if error is not None and not self.closed:
                self._fail(error)
        elif type(message) is SequencedRun:
            for sequenced in message.expand():
                self._run(core.on_sequenced(sequenced))
        else:
            logger.error("%s cannot handle %s: dropped", self._name, type(message).__name__)

    def _run(self, effects: Iterable[Effect]) -> None:
        dedup = self._dedup
        for effect in effects:
            if type(effect) is Send:
                if effect.to is self._ready_ref:
                    self._ready.append(effect.message)
                    continue
                if dedup is not None:  # flushed before any Request/Ack is told
                    self._dedup_call(dedup.before_send, effect.message)
                self.outbox.append((effect.to, effect.message))
            elif type(effect) is StartTimer:
                self._timers.start(effect.key, effect.interval)
            elif type(effect) is CancelTimer:
                self._timers.cancel(effect.key)
            elif type(effect) is Stop:
                self._timers.cancel_all()
                if self._on_end is not None:
                    self._on_end()
            elif type(effect) is RecordConfirmed:
                if dedup is not None:
                    self._dedup_call(dedup.record, effect.producer_id, effect.seq_nr)
            elif type(effect) is WriteDeadLetter:
                try:
                    write_dead_letter(self._dead_letters, effect)
                except DeadLetterError as error:
                    self._fail(error)
                    raise
            else:
                logger.error("%s cannot carry out %r: dropped", self._name, effect)

    def _dedup_call(self, call: Callable[..., None], *args: Any) -> None:
        try:
            call(*args)
        except (DedupStoreError, ConsumerFenced) as error:
            fenced = error.__cause__  # the writer gives up on a store's ConsumerFenced at once
            if isinstance(fenced, ConsumerFenced):
                self._fail(fenced)
                raise fenced from None
            self._fail(error)
            raise

    def _fail(self, error: DedupStoreError | DeadLetterError | ConsumerFenced) -> None:
        """A store failed, or the consumer was fenced: close at once, dropping the
        outbox."""
        self.closed = True
        self._failure = error
        self.outbox = []
        self._timers.cancel_all()
        if self._on_end is not None:
            self._on_end()


def nothing_ready() -> WouldBlock:
    """What a handle's ``receive_nowait`` raises when no delivery is ready."""
    msg = "Consumer has no delivery ready"
    return WouldBlock(msg)
