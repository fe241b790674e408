"""The bases of the pykka controllers: the mailbox is the waiting, a session the rest.

The shells are thin (STYLE.md rule 9): `on_receive` hands the message to the core through
the session, which carries out the effects. They never block on another actor. A message
that breaks the protocol is logged and counted, never raised: an exception from a ``tell``
would stop the pykka actor and lose every unconfirmed message with it.

* `ShellActor`: what every controller has: the ref the other side reaches it by, its
  timers (firings arrive in the mailbox), a count of the messages refused.
* `ControllerActor`: the consumer controller's base: the mailbox's messages fed to the core
  (`_core_receive`, `_core_timer`), its effects carried out by the subclass's session
  (`_run`), a `tell` that survives a dead target (`_send`).
* `ProducerShell`: the producer controllers' base: a producer session (session/producer.py)
  takes every message; when a store of its durable queue fails every attempt, the session
  closes and the actor stops (Akka's controller crashes there; so do we, cleanly).
* `SendNextAdapter`, `AskNextAdapter`: ``RequestNext.send_next_to`` and ``ask_next_to``.
  They check the payload in the producer's own thread with the core's payload gate, so
  that a payload that cannot be encoded for where it goes raises to the producer (its
  ``tell`` raises `SerializationError`, nothing is sent, its `RequestNext` still holds)
  instead of being refused later in the actor, where only the log would say so.
"""

from __future__ import annotations

import abc
import contextlib
import logging
import queue
from collections.abc import Callable, Iterable
from typing import Any

import pykka

from pykka_delivery.delivery.core.effects import Effect
from pykka_delivery.delivery.core.payload_gate import PayloadGate
from pykka_delivery.delivery.messages import MessageWithConfirmation, SendNext
from pykka_delivery.delivery.session.producer import BaseProducerSession
from pykka_delivery.delivery.timers import TimerFired, Timers, TimerService
from pykka_delivery.errors import LocalProtocolError
from pykka_delivery.protocol.messages import Ref
from pykka_delivery.protocol.payload_check import PayloadCheck

__all__ = [
    "AskNextAdapter",
    "ControllerActor",
    "ProducerShell",
    "SendNextAdapter",
    "ShellActor",
    "quiet_tell",
]


def quiet_tell(ref: Ref) -> Callable[[Any], None]:
    """``ref.tell``, for what reaches an actor from outside its own messages (a timer
    firing, a registry listing): once the actor stopped, dropped."""

    def tell(message: Any) -> None:
        with contextlib.suppress(pykka.ActorDeadError):
            ref.tell(message)

    return tell


class _CheckingAdapter:
    """Tells the controller's actor what the producer sends, its payload checked first
    with ``gate`` (the core's, set once the core exists; None: no check)."""

    __slots__ = ("_ref", "gate")

    def __init__(self, ref: Ref) -> None:
        self._ref = ref
        self.gate: PayloadGate | None = None

    def _check(self, payload: object) -> PayloadCheck | None:
        """Refuse ``payload`` if it cannot be encoded; returns the check it passed, which
        the core then does not apply again (read once: the actor may aim the gate anew)."""
        gate = self.gate
        if gate is None:
            return None
        check = gate.check
        if check is not None and type(payload) is not check.unchecked:
            return gate.refuse((payload,))
        return check


class SendNextAdapter(_CheckingAdapter):
    """``RequestNext.send_next_to``: wraps the producer's message so it cannot be mistaken
    for a control message (Akka's message adapter).

    Raises (from ``tell``):
        SerializationError: the payload cannot be encoded for where it goes (nothing was
            sent; the `RequestNext` still holds).
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"SendNextTo({self._ref!r})"

    def tell(self, message: Any) -> None:
        self._ref.tell(SendNext(message, checked=self._check(message)))


class AskNextAdapter(_CheckingAdapter):
    """``RequestNext.ask_next_to``: tells the controller a `MessageWithConfirmation` (or
    anything else) as it is.

    Raises (from ``tell``):
        SerializationError: as `SendNextAdapter`'s, for the message a
            `MessageWithConfirmation` carries.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"AskNextTo({self._ref!r})"

    def tell(self, message: Any) -> None:
        if type(message) is MessageWithConfirmation:
            checked = self._check(message.message)
            if checked is not None:
                message = MessageWithConfirmation(
                    message.message, message.reply_to, checked=checked
                )
        self._ref.tell(message)


class ShellActor(pykka.ThreadingActor):
    """What every controller actor has: ``self_ref``, its timers, ``rejected``."""

    use_daemon_thread = True
    _logger = logging.getLogger("pykka_delivery")

    def __init__(
        self,
        *,
        self_ref_factory: Callable[[pykka.ActorRef[Any]], Ref] | None = None,
        timer_service: TimerService | None = None,
    ) -> None:
        super().__init__()
        # How the other side reaches this controller: our own ref unless a transport (or a
        # fault-injecting test) puts something in front of it.
        self.self_ref: Ref = (
            self_ref_factory(self.actor_ref) if self_ref_factory is not None else self.actor_ref
        )
        self._timers = Timers(quiet_tell(self.actor_ref), timer_service)
        self.rejected = 0

    @staticmethod
    def _create_actor_inbox() -> queue.SimpleQueue[Any]:
        # pykka's default, queue.Queue, takes a Python-level lock and condition on every
        # put and get; SimpleQueue (in C) does what pykka asks of an inbox (put, get,
        # empty) with neither, and a controller's mailbox sees every message it handles.
        return queue.SimpleQueue()

    def on_stop(self) -> None:
        self._timers.cancel_all()


class ControllerActor(ShellActor, abc.ABC):
    """Base of `ConsumerController`: one core fed from the mailbox."""

    @abc.abstractmethod
    def _core_receive(self, message: Any) -> list[Effect]:
        """Feed ``message`` to the controller's core."""

    @abc.abstractmethod
    def _core_timer(self, key: str) -> list[Effect]:
        """Tell the controller's core that timer ``key`` fired."""

    @abc.abstractmethod
    def _run(self, effects: Iterable[Effect]) -> None:
        """Carry out the core's effects (the controller's session does)."""

    def on_receive(self, message: Any) -> None:
        if type(message) is TimerFired:
            if self._timers.accept(message):
                self._run(self._core_timer(message.key))
            return
        try:
            effects = self._core_receive(message)
        except LocalProtocolError as error:
            self.rejected += 1
            self._logger.error("%s", error)
            return
        self._run(effects)

    def _send(self, to: Ref, message: Any) -> None:
        try:
            to.tell(message)
        except pykka.ActorDeadError:
            self._on_dead_target(to, message)

    def _on_dead_target(self, to: Ref, message: Any) -> None:
        self._logger.debug("Dropped %s: %r is dead", type(message).__name__, to)


class ProducerShell(ShellActor):
    """Base of `ProducerController` and `WorkPullingProducerController`: the subclass sets
    ``_session`` (built with this actor's ``_timers``, ``on_failure=self.stop`` and
    ``drop_dead_targets=True``)."""

    _session: BaseProducerSession[Any]

    def on_receive(self, message: Any) -> None:
        if not self._session.receive(message):
            self.rejected += 1

    def on_stop(self) -> None:
        super().on_stop()
        self._session.close()
        self._session.release()
