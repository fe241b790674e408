"""The producer session: the one interpreter of a producer core's effects.

A session owns a producer core (a `ProducerCore` here, a `WorkPullingCore` in
`WorkPullingSession`) and what carries out the core's decisions: the inbox where the other
side's messages and the timer firings arrive (appended from any thread by the shell's
endpoint), the core's `Timers`, the retried calls to its durable queue and the failure
state. It never waits and starts no thread. The shells are only the waiting around it: a
lock and a condition (`Producer`, `WorkPullingProducer`), futures on an event loop
(`AsyncProducer`), a pykka mailbox (`ProducerController`, `WorkPullingProducerController`).
Every session call is made by one thread at a time: the shell's lock holder, its loop, its
actor.

The rules kept here, once for every shell:

* `run` carries out effects in order: a `Send` is told (a dead actor dropped and logged
  when the shell asks for it), timers are started (not once closed) and cancelled, stores
  go to the durable queue.
* A store that fails every attempt closes the session: the core's state is then ahead of
  what is stored, so nothing more may go out of it. Its timers stop, its inbox is dropped,
  the shell is told (``on_failure``: wake the waiters, stop the actor), the failing call
  raises the store's `DurableQueueError`, and every later call `failed_error`, caused by
  it. A new producer with the same producer id on the same queue reloads what was stored.
* What arrives (`receive`, `process_inbox`): a timer firing reaches the core only while it
  is the current one (a cancelled timer's late firing is dropped); a message the core
  refuses is logged and dropped, never raised into the thread that brought it. A message
  from the producer refused for its payload (it cannot be encoded for where it goes: the
  actors' senders check it first, so only one racing a change of consumer side gets here)
  also gives the producer its `RequestNext` again (`on_refused`), or it would wait for ever.
* Sending (`try_send`): the core's steady-state path first (the numbered message told
  straight to the consumer side, no effect list), the general one when there is demand.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, Protocol, TypeVar

from pykka import ActorDeadError

from pykka_delivery.delivery.core.effects import CancelTimer, Effect, Send, StartTimer
from pykka_delivery.delivery.core.payload_gate import PayloadGate
from pykka_delivery.delivery.core.producer import ProducerCore, ProducerSnapshot, ProducerStats
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.messages import ProducerStart
from pykka_delivery.delivery.stores.calls import STORE_EFFECTS, DurableQueueCalls
from pykka_delivery.delivery.stores.durable_queue import (
    DurableProducerQueue,
    DurableProducerState,
    DurableQueueError,
)
from pykka_delivery.delivery.timers import TimerFired, Timers
from pykka_delivery.errors import ClosedError, LocalProtocolError
from pykka_delivery.protocol.messages import Ref, with_link_problem
from pykka_delivery.protocol.payload_check import PayloadCheck
from pykka_delivery.protocol.serialization import Serialization, SerializationError

__all__ = [
    "BaseProducerSession",
    "Ignore",
    "ProducerSession",
    "ReplySlot",
    "load_durable",
]

logger = logging.getLogger("pykka_delivery.producer")


def load_durable(
    queue: DurableProducerQueue | None, settings: ProducerControllerSettings, owner: str
) -> tuple[DurableQueueCalls | None, DurableProducerState | None]:
    """``queue`` wrapped for retried calls on behalf of ``owner`` (e.g. "Producer 'orders'"),
    and the state loaded from it; (None, None) without a queue.

    Raises:
        DurableQueueError: loading failed every attempt.
        TypeError: ``queue`` is not a `DurableProducerQueue`.
    """
    if queue is None:
        return None, None
    calls = DurableQueueCalls(queue, settings, owner)
    return calls, calls.load()


class ReplySlot:
    """``reply_to`` of a send that waits for its confirmation: the seq_nr lands here."""

    __slots__ = ("seq_nr",)

    def __init__(self) -> None:
        self.seq_nr: int | None = None

    def tell(self, message: Any) -> None:
        self.seq_nr = message


class Ignore:
    """The "producer" of a handle's core: a handle reads demand from the core instead."""

    __slots__ = ()

    def tell(self, message: Any) -> None:
        pass


class _Core(Protocol):
    """What a session needs of any producer core."""

    producer_id: str

    @property
    def has_demand(self) -> bool: ...

    @property
    def all_confirmed(self) -> bool: ...

    def receive(self, message: object) -> list[Effect]: ...

    def on_timer(self, key: str) -> list[Effect]: ...

    def on_refused(self) -> list[Effect]: ...

    @property
    def gate(self) -> PayloadGate: ...


C = TypeVar("C", bound=_Core)


class BaseProducerSession(Generic[C]):
    """What `ProducerSession` and `WorkPullingSession` share: the inbox, the interpreter,
    the failure rule and the wording of the errors a shell raises.

    Args:
        core: the core; the session is its only driver.
        timers: the core's timers; their firings must reach the inbox (or `receive`).
        durable: the durable queue's calls (`load_durable`), None without one.
        name: the shell, as the errors and logs name it ("Producer", "ProducerController").
        on_failure: called when a store failed and the session closed (wake the waiters,
            stop the actor).
        drop_dead_targets: a `Send` to a dead pykka actor is logged and dropped (the
            actors); False: the `ActorDeadError` is raised to the caller.

    Attributes:
        owner: the shell and the producer id, as errors and logs name them.
        inbox: what arrived for the core, in order; append from any thread, then have the
            shell's thread call `process_inbox`.
        runner: how the send paths carry out effects (default `run`); a shell may wrap it.
        closed: no more sends; what arrives is dropped.
        failure: the store error that closed the session, if one did.
    """

    _logger = logger
    DEMAND = "demand"
    """What a sender waits for, as the errors name it."""
    DEMAND_TO_SEND = "demand to send"
    """The same, as a `DeliveryTimeout` of a single send names it."""

    __slots__ = (
        "_drop_dead",
        "_on_failure",
        "closed",
        "core",
        "durable",
        "failure",
        "inbox",
        "owner",
        "runner",
        "timers",
    )

    def __init__(
        self,
        core: C,
        timers: Timers,
        durable: DurableQueueCalls | None,
        *,
        name: str,
        on_failure: Callable[[], None],
        drop_dead_targets: bool = False,
    ) -> None:
        self.core = core
        self.timers = timers
        self.durable = durable
        self.owner = f"{name} {core.producer_id!r}"
        self._on_failure = on_failure
        self._drop_dead = drop_dead_targets
        self.inbox: deque[Any] = deque()
        self.runner: Callable[[list[Effect]], None] = self.run
        self.closed = False
        self.failure: DurableQueueError | None = None

    # --- queries -------------------------------------------------------------------------

    @property
    def has_demand(self) -> bool:
        """A message sent now goes out at once."""
        return self.core.has_demand

    @property
    def all_confirmed(self) -> bool:
        """The consumer side confirmed every message sent so far."""
        return self.core.all_confirmed

    def check_open(self) -> None:
        """Raises:
        ClosedError: the session was closed.
        DurableQueueError: it closed because its durable queue failed (`failed_error`).
        """
        if self.closed:
            if self.failure is not None:
                raise self.failed_error() from self.failure
            msg = f"{self.owner} is closed"
            raise ClosedError(msg)

    def failed_error(self) -> DurableQueueError:
        """What every call raises once the durable queue failed (raised from that failure)."""
        msg = (
            f"{self.owner} is closed: its durable queue failed (see the cause); create a new "
            "producer with the same producer id on the same queue: it reloads what was "
            "stored and resends what is unconfirmed"
        )
        return DurableQueueError(msg)

    def timeout_message(self, what: str, timeout: float | None) -> str:
        """A `DeliveryTimeout`'s message: no ``what`` came within ``timeout`` seconds, and
        why the link to the consumer side is down when its ref can say."""
        return with_link_problem(f"{self.owner}: no {what} within {timeout} s", self.peer())

    def peer(self) -> Ref | None:
        """The consumer side whose link a timeout names when it is down: the point-to-point
        session's consumer; None for a work-pulling one (it has many)."""
        return None

    def partly_sent_message(self, timeout: float | None, sent: int, total: int) -> str:
        """A `DeliveryTimeout`'s message when ``sent`` of ``total`` messages were sent."""
        msg = (
            f"{self.owner}: no {self.DEMAND} within {timeout} s: the first {sent} of {total} "
            "messages were sent"
        )
        return with_link_problem(msg, self.peer())

    def check_payloads(self, payloads: Sequence[object]) -> PayloadCheck | None:
        """Refuse ``payloads`` now, all of them, if one cannot be encoded for where it
        goes (what a `send_many` does before it sends any); returns the check applied, for
        `send_batch`'s ``checked``.

        Raises:
            SerializationError: one cannot be encoded (a note names which).
        """
        return self.core.gate.refuse(payloads)

    # --- what arrives --------------------------------------------------------------------

    def receive(self, message: Any) -> bool:
        """Feed ``message`` (a timer firing, or what the other side told) to the core and
        carry out the effects. A store failure closes the session (the next call raises).

        Returns:
            False if the core refused it (logged as an error, nothing changed).
        """
        if self.closed:
            return True  # what the other side says is ignored from now on
        if type(message) is TimerFired:
            effects = self._on_timer(message.key) if self.timers.accept(message) else []
        else:
            try:
                effects = self.core.receive(message)
            except LocalProtocolError as error:
                self._logger.error("%s", error)
                return False
            except SerializationError as error:
                notes = " ".join(getattr(error, "__notes__", ()))
                self._logger.error("%s: %s %s", self.owner, error, notes)
                with contextlib.suppress(DurableQueueError):
                    self.run(self.core.on_refused())
                return False
        with contextlib.suppress(DurableQueueError):  # closed: the shell's next call raises
            self.run(effects)
        return True

    def process_inbox(self) -> bool:
        """`receive` what the inbox holds, in order.

        Returns:
            True if something was processed: wake whoever waits for a change.
        """
        inbox = self.inbox
        if not inbox:
            return False
        if self.closed:
            inbox.clear()
            return False
        receive = self.receive
        while inbox:
            receive(inbox.popleft())
        return True

    # --- carrying out ----------------------------------------------------------------------

    def run(self, effects: list[Effect]) -> None:
        """Carry out ``effects`` in order.

        Raises:
            DurableQueueError: a store failed every attempt: the session is closed and the
                effects after it were not carried out.
            ActorDeadError: a `Send` to a dead actor, unless ``drop_dead_targets``.
        """
        for effect in effects:
            if type(effect) is Send:
                try:
                    effect.to.tell(effect.message)
                except ActorDeadError as error:
                    self._dead(effect.to, effect.message, error)
            elif type(effect) is StartTimer:
                if not self.closed:
                    self.timers.start(effect.key, effect.interval)
            elif type(effect) is CancelTimer:
                self.timers.cancel(effect.key)
            elif isinstance(effect, STORE_EFFECTS) and self.durable is not None:
                try:
                    self.durable.store(effect)
                except DurableQueueError as error:
                    self._fail(error)
                    raise
            else:
                self._logger.error("%s cannot carry out %r: dropped", self.owner, effect)

    def close(self) -> None:
        """Stop the timers, refuse further sends, ignore what arrives from now on."""
        self.closed = True
        self.timers.cancel_all()
        self.inbox.clear()

    def release(self) -> None:
        """After `close`, outside the shell's lock: flush the durable queue (unless it
        failed; a failing flush is logged: confirmations are sent again on restart)."""
        if self.durable is not None and self.failure is None:
            self.durable.flush_on_stop()

    # --- internals ---------------------------------------------------------------------

    def _on_timer(self, key: str) -> list[Effect]:
        return self.core.on_timer(key)

    def _dead(self, to: Ref, message: Any, error: ActorDeadError) -> None:
        """Telling ``message`` failed: ``to`` is a dead actor. Drop it, or raise ``error``."""
        if not self._drop_dead:
            raise error
        self._logger.debug("Dropped %s: %r is dead", type(message).__name__, to)

    def _fail(self, error: DurableQueueError) -> None:
        """A store failed every attempt: close, and tell the shell."""
        self.failure = error
        self.close()
        self._on_failure()


class ProducerSession(BaseProducerSession[ProducerCore]):
    """The session of a point-to-point producer: one `ProducerCore`.

    The shells: the `Producer` and `AsyncProducer` handles (`for_handle`), and the
    `ProducerController` actor, whose producer is told `RequestNext`.
    """

    __slots__ = ()

    @classmethod
    def for_handle(
        cls,
        producer_id: str,
        self_ref: Ref,
        timers: Timers,
        *,
        settings: ProducerControllerSettings | None,
        serialization: Serialization | None,
        durable_queue: DurableProducerQueue | None,
        clock_millis: Callable[[], int],
        on_failure: Callable[[], None],
    ) -> ProducerSession:
        """A session whose demand is read (`has_demand`, `try_send`) rather than told to a
        producer: what the handles wait on. ``self_ref`` is where the consumer side
        reaches the handle; the durable queue, if any, is loaded here.

        Raises:
            DurableQueueError: loading the durable queue's state failed every attempt.
        """
        owner = f"Producer {producer_id!r}"
        durable, state = load_durable(
            durable_queue, settings or ProducerControllerSettings(), owner
        )
        ignore = Ignore()
        core = ProducerCore(
            producer_id,
            self_ref,
            ignore,
            settings,
            serialization,
            announce_demand=False,
            durable_state=state,
            clock_millis=clock_millis,
            payload_encoders=(durable_queue,),
        )
        session = cls(core, timers, durable, name="Producer", on_failure=on_failure)
        session.receive(ProducerStart(ignore))
        return session

    def try_send(self, message: Any) -> int | None:
        """Send ``message`` if there is demand; returns its seq_nr (its last chunk's), or
        None (nothing sent) without demand.

        Raises:
            SerializationError: its payload cannot be encoded for where it goes (nothing
                was numbered or sent).
            DurableQueueError: storing it failed every attempt (the session is closed).
        """
        core = self.core
        seq_msg = core.next_message(message)  # the steady state: no effects to carry out
        if seq_msg is not None:
            consumer: Ref = core.consumer  # type: ignore[assignment] # set while active
            try:
                consumer.tell(seq_msg)
            except ActorDeadError as error:
                self._dead(consumer, seq_msg, error)
            return seq_msg.seq_nr
        if not core.has_demand:
            return None
        return self.send(message)

    def send(self, message: Any, reply_to: Ref | None = None) -> int:
        """Send ``message`` the general way; returns its seq_nr (its last chunk's). With
        ``reply_to`` (a `ReplySlot`, say), the seq_nr is told to it once the consumer
        confirmed the message, or, with a durable queue, once it is stored.

        Raises:
            LocalProtocolError: there is no demand (nothing was sent).
            SerializationError: its payload cannot be encoded for where it goes (nothing
                was numbered or sent).
            DurableQueueError: storing it failed every attempt (the session is closed).
        """
        core = self.core
        self.runner(core.on_msg(message, reply_to))
        return core.last_seq_nr

    def send_batch(self, messages: Iterator[Any], checked: PayloadCheck | None = None) -> list[int]:
        """Send as many of ``messages`` as the window allows now (one when chunking), with
        one store for all of them in durable mode; returns their seq_nrs (each one's last
        chunk's), empty once ``messages`` is exhausted. ``checked``: the check
        `check_payloads` applied to them (not applied again while it is in force).

        Raises:
            LocalProtocolError: there is no demand (nothing was taken).
            SerializationError: a payload cannot be encoded for where it goes (none of
                those taken was numbered or sent).
            DurableQueueError: storing failed every attempt (the session is closed).
        """
        core = self.core
        before = core.last_seq_nr
        self.runner(core.on_msg_batch(messages, checked))
        last = core.last_seq_nr
        if last == before:
            return []
        if core.settings.chunk_large_messages:
            return [last]  # one message per batch when chunking
        return list(range(before + 1, last + 1))

    def close(self) -> None:
        """`BaseProducerSession.close`, and a warning when that loses messages: without a
        durable queue, what is unconfirmed now is never resent."""
        super().close()
        lost = self.core.on_closed()
        if lost is not None:
            first, last = lost
            self._logger.warning(
                "%s closed with %d unconfirmed message(s), seq_nr %d..%d: they are not resent "
                "and are lost unless the consumer had them. Close after wait_confirmed(), or "
                "give the producer a durable_queue",
                self.owner,
                last - first + 1,
                first,
                last,
            )

    def peer(self) -> Ref | None:
        return self.core.consumer

    def no_demand_message(self) -> str:
        """A `WouldBlock`'s message."""
        return f"{self.owner} has no demand: the consumer's window is full"

    def snapshot(self) -> ProducerSnapshot:
        return self.core.snapshot()

    def statistics(self) -> ProducerStats:
        return self.core.statistics()
