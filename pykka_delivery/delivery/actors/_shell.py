"""The base of the pykka controllers: one core, its timers, its effects carried out.

The shell is thin (STYLE.md rule 9): `on_receive` feeds the core and runs the effects. It
never blocks on another actor. A message that breaks the protocol is logged and counted,
never raised: an exception from a ``tell`` would stop the pykka actor and lose every
unconfirmed message with it.
"""

from __future__ import annotations

import abc
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

import pykka

from pykka_delivery.delivery.core.effects import (
    CancelTimer,
    Effect,
    Send,
    StartTimer,
    Stop,
)
from pykka_delivery.delivery.timers import TimerFired, Timers, TimerService
from pykka_delivery.errors import LocalProtocolError
from pykka_delivery.protocol.messages import Ref

__all__ = ["ControllerActor"]


def _quiet_tell(ref: Ref) -> Callable[[TimerFired], None]:
    def tell(message: TimerFired) -> None:
        with contextlib.suppress(pykka.ActorDeadError):  # the owner stopped: so do its timers
            ref.tell(message)

    return tell


class ControllerActor(pykka.ThreadingActor, abc.ABC):
    """Base of `ProducerController` and `ConsumerController`: one core, its timers."""

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
        self._timers = Timers(_quiet_tell(self.actor_ref), timer_service)
        self.rejected = 0

    @abc.abstractmethod
    def _core_receive(self, message: Any) -> list[Effect]:
        """Feed ``message`` to the controller's core."""

    @abc.abstractmethod
    def _core_timer(self, key: str) -> list[Effect]:
        """Tell the controller's core that timer ``key`` fired."""

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

    def on_stop(self) -> None:
        self._timers.cancel_all()

    def _run(self, effects: Iterable[Effect]) -> None:
        for effect in effects:
            if type(effect) is Send:
                self._send(effect.to, effect.message)
            elif type(effect) is StartTimer:
                self._timers.start(effect.key, effect.interval)
            elif type(effect) is CancelTimer:
                self._timers.cancel(effect.key)
            elif type(effect) is Stop:
                self._timers.cancel_all()
                self.stop()
            elif not self._run_other(effect):
                return

    def _run_other(self, effect: Effect) -> bool:
        """Carry out an effect only some controllers emit (a store, say); False: the
        controller is stopping and the effects after this one must not be carried out."""
        self._logger.error("%s cannot carry out %r: dropped", type(self).__name__, effect)
        return True

    def _send(self, to: Ref, message: Any) -> None:
        try:
            to.tell(message)
        except pykka.ActorDeadError:
            self._on_dead_target(to, message)

    def _on_dead_target(self, to: Ref, message: Any) -> None:
        self._logger.debug("Dropped %s: %r is dead", type(message).__name__, to)
