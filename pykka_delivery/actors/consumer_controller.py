"""`ConsumerController`: the pykka actor around `ConsumerCore`.

Usage, in Akka's shape::

    cc = ConsumerController.start()
    cc.tell(ConsumerController.Start(my_consumer_ref))   # gets Delivery messages
    cc.tell(ConsumerController.RegisterToProducerController(pc))

The consumer handles each `Delivery` and then calls ``delivery.confirm()``; the next one
arrives only after that.

pykka has no death watch. The controller notices that its consumer stopped when a
`Delivery` cannot be told to it, or on the next retry-timer tick (``is_alive()`` of a pykka
ref), and then stops too, as Akka's does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from pykka_delivery.actors._shell import ControllerActor
from pykka_delivery.actors.consumer_core import RETRY, ConsumerCore, ConsumerSnapshot, ConsumerStats
from pykka_delivery.actors.effects import Effect
from pykka_delivery.actors.messages import (
    Confirmed,
    ConsumerStart,
    DeliverThenStop,
    Delivery,
    Ref,
    RegisterToProducerController,
)
from pykka_delivery.actors.settings import ConsumerControllerSettings
from pykka_delivery.actors.timers import TimerService
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["ConsumerController"]


@dataclass(frozen=True, slots=True)
class _ConsumerGone:
    """The consumer actor stopped (found by the retry tick)."""


class ConsumerController(ControllerActor):
    """Receives a producer controller's messages, puts them in order, drops duplicates,
    asks for what is lost, and hands them to the consumer one at a time.

    Args:
        settings: see `ConsumerControllerSettings`.
        serialization: for chunked messages; default `default_serialization`.
        self_ref_factory: builds the ref the producer side uses to reach this controller
            from its pykka ref (a transport's remote address, or a fault injector in tests).
        timer_service: default: the process-wide one.
    """

    Start = ConsumerStart
    Delivery = Delivery
    Confirmed = Confirmed
    DeliverThenStop = DeliverThenStop
    RegisterToProducerController = RegisterToProducerController

    def __init__(
        self,
        settings: ConsumerControllerSettings | None = None,
        *,
        serialization: Serialization | None = None,
        self_ref_factory: Callable[[pykka.ActorRef[Any]], Ref] | None = None,
        timer_service: TimerService | None = None,
    ) -> None:
        super().__init__(self_ref_factory=self_ref_factory, timer_service=timer_service)
        # Deliveries carry our own pykka ref: the consumer is local by definition.
        self.core = ConsumerCore(self.self_ref, settings, serialization, confirm_to=self.actor_ref)

    def on_start(self) -> None:
        self._run(self.core.on_spawned())

    def on_stop(self) -> None:
        self._run(self.core.on_stopped())
        super().on_stop()

    def _core_receive(self, message: Any) -> list[Effect]:
        return self.core.receive(message)

    def on_receive(self, message: Any) -> None:
        if type(message) is _ConsumerGone:
            self._run(self.core.on_consumer_terminated())
        else:
            super().on_receive(message)

    def _core_timer(self, key: str) -> list[Effect]:
        if key == RETRY and self._consumer_is_gone():
            # Not at once: a Confirmed the consumer sent before it stopped may still be
            # queued behind this tick; our own message goes behind it (Akka's Terminated
            # likewise arrives after everything the consumer sent).
            self.actor_ref.tell(_ConsumerGone())
            return []
        return self.core.on_timer(key)

    def _consumer_is_gone(self) -> bool:
        consumer = self.core.consumer
        is_alive = getattr(consumer, "is_alive", None)
        return is_alive is not None and not is_alive()

    def _on_dead_target(self, to: Ref, message: Any) -> None:
        if to is self.core.consumer:
            self._logger.debug("Consumer %r terminated, stopping", to)
            self._run(self.core.on_consumer_terminated())
        else:
            super()._on_dead_target(to, message)

    # Queries, for `proxy()` or `ask`: answered in the actor's thread.

    def snapshot(self) -> ConsumerSnapshot:
        return self.core.snapshot()

    def statistics(self) -> ConsumerStats:
        return self.core.statistics()
