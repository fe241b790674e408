"""`ProducerController`: the pykka actor around `ProducerCore`.

Usage, in Akka's shape::

    pc = ProducerController.start("orders")
    pc.tell(ProducerController.Start(my_producer_ref))   # gets RequestNext messages
    cc.tell(ConsumerController.RegisterToProducerController(pc))

On each `RequestNext` the producer sends one message with
``request_next.send_next_to.tell(message)`` (or asks for a confirmation with
``request_next.ask_next_to.tell(MessageWithConfirmation(message, reply_to))``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pykka

from pykka_delivery.actors._shell import ControllerActor
from pykka_delivery.actors.effects import Effect
from pykka_delivery.actors.messages import (
    MessageWithConfirmation,
    ProducerStart,
    Ref,
    RegisterConsumer,
    RequestNext,
    SendNext,
)
from pykka_delivery.actors.producer_core import ProducerCore, ProducerSnapshot, ProducerStats
from pykka_delivery.actors.settings import ProducerControllerSettings
from pykka_delivery.actors.timers import TimerService
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["ProducerController"]


class _SendNextAdapter:
    """``RequestNext.send_next_to``: wraps the producer's message so it cannot be mistaken
    for a control message (Akka's message adapter)."""

    __slots__ = ("_ref",)

    def __init__(self, ref: Ref) -> None:
        self._ref = ref

    def __repr__(self) -> str:
        return f"SendNextTo({self._ref!r})"

    def tell(self, message: Any) -> None:
        self._ref.tell(SendNext(message))


class ProducerController(ControllerActor):
    """Numbers a producer's messages and delivers them to one consumer controller, within
    the consumer's flow-control window, resending what is lost.

    Args:
        producer_id: identifies the stream (stamped on every message).
        settings: see `ProducerControllerSettings`.
        serialization: for chunking; default `default_serialization`.
        self_ref_factory: builds the ref the consumer side uses to reach this controller
            from its pykka ref (a transport's remote address, or a fault injector in tests).
        timer_service: default: the process-wide one.
    """

    Start = ProducerStart
    RequestNext = RequestNext
    MessageWithConfirmation = MessageWithConfirmation
    RegisterConsumer = RegisterConsumer

    def __init__(
        self,
        producer_id: str,
        settings: ProducerControllerSettings | None = None,
        *,
        serialization: Serialization | None = None,
        self_ref_factory: Callable[[pykka.ActorRef[Any]], Ref] | None = None,
        timer_service: TimerService | None = None,
    ) -> None:
        super().__init__(self_ref_factory=self_ref_factory, timer_service=timer_service)
        self.core = ProducerCore(
            producer_id,
            self.self_ref,
            _SendNextAdapter(self.actor_ref),
            settings,
            serialization,
        )

    def _core_receive(self, message: Any) -> list[Effect]:
        return self.core.receive(message)

    def _core_timer(self, key: str) -> list[Effect]:
        return self.core.on_timer(key)

    # Queries, for `proxy()` or `ask`: answered in the actor's thread.

    def snapshot(self) -> ProducerSnapshot:
        return self.core.snapshot()

    def statistics(self) -> ProducerStats:
        return self.core.statistics()
