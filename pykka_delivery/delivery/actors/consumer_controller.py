"""`ConsumerController`: the pykka actor around a `ConsumerSession`.

Usage, in Akka's shape::

    cc = ConsumerController.start()
    cc.tell(ConsumerController.Start(my_consumer_ref))   # gets Delivery messages
    cc.tell(ConsumerController.RegisterToProducerController(pc))

The consumer handles each `Delivery` and then calls ``delivery.confirm()``; the next one
arrives only after that.

The actor's mailbox does the waiting: each message is fed to the session's core, and the
session (session/consumer.py) carries out the effects, as for the consumer handles, except
that deliveries go out to the consumer actor instead of waiting to be received. What the
session sent is told once the message is handled.

pykka has no death watch. The controller notices that its consumer stopped when a
`Delivery` cannot be told to it, or on the next retry-timer tick (``is_alive()`` of a pykka
ref), and then stops too, as Akka's does.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pykka

from pykka_delivery.delivery.actors._shell import ControllerActor
from pykka_delivery.delivery.core.consumer import RETRY, ConsumerSnapshot, ConsumerStats
from pykka_delivery.delivery.core.effects import Effect
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.messages import (
    Confirmed,
    ConsumerStart,
    DeliverThenStop,
    Delivery,
    RegisterToProducerController,
    Rejected,
)
from pykka_delivery.delivery.registry import ServiceRegistry, default_registry
from pykka_delivery.delivery.session.consumer import ConsumerSession
from pykka_delivery.delivery.stores.dead_letters import DeadLetterDestination, DeadLetterError
from pykka_delivery.delivery.stores.dedup import DedupStore, DedupStoreError
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import ConsumerFenced
from pykka_delivery.protocol.messages import Ref
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
        service_key: makes this controller a worker of the work-pulling producer
            controllers of that key: it registers its ref under the key in ``registry``
            when it starts and deregisters when it stops (Akka's
            ``ConsumerController(serviceKey)``). None (the default): no registration.
        registry: where to register; default: the process-wide `default_registry()`.
        dedup_store: turns on deduplication across restarts (dedup.py): positions are
            loaded from it when the controller is created (`DedupStoreError` from
            ``start()`` if that fails), each confirmation is recorded, and the store is
            flushed before every Request/Ack and when the controller stops. The caller
            owns the store (closes it after the controller stopped). If the store keeps
            failing, the controller logs an error and stops without confirming more.
        dead_letters: where a message goes once the consumer rejected it
            (``delivery.reject(reason)``) ``settings.max_attempts`` times: a
            `DeadLetterDestination`, the path of an SQLite file for a
            `SqliteDeadLetters`, or a ``postgresql://`` URL for a ``PostgresDeadLetters``,
            that the controller owns (closed when it stops). None (the
            default): a `Rejected` is refused (logged as an error, nothing changes). If
            the destination fails, the controller logs an error and stops (the message
            stays unconfirmed at the producer).
        epoch: the fencing epoch of this activation (from a coordinator; 0, the
            default: none), sent with its registration, Requests and Acks. When the
            producer controller serves a newer epoch it answers `Fenced`: the controller
            logs a warning and stops without delivering or confirming more. Above 0, a
            ``dedup_store`` with a ``fence`` method is fenced with it (`ConsumerFenced`
            from the constructor if the store holds a newer epoch, and the controller
            stops if the store refuses a write later).

    Raises:
        TypeError, ValueError: ``epoch`` is not an int >= 0.
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
        service_key: str | None = None,
        registry: ServiceRegistry | None = None,
        dedup_store: DedupStore | None = None,
        dead_letters: DeadLetterDestination | str | os.PathLike[str] | None = None,
        epoch: int = 0,
    ) -> None:
        if service_key is not None and (not isinstance(service_key, str) or not service_key):
            msg = f"service_key must be a non-empty str or None, got {service_key!r}"
            raise ValueError(msg)
        super().__init__(self_ref_factory=self_ref_factory, timer_service=timer_service)
        self.service_key = service_key
        self._registry = registry if registry is not None else default_registry()
        # Created here, in the caller's thread: a store that cannot be read fails start().
        # Deliveries carry our own pykka ref: the consumer is local by definition.
        self._session = ConsumerSession(
            self.self_ref,
            settings,
            name="ConsumerController.start",
            timers=self._timers,
            serialization=serialization,
            confirm_to=self.actor_ref,
            dedup_store=dedup_store,
            dead_letters=dead_letters,
            hand_out=False,
            on_end=self._stop_once,
            epoch=epoch,
        )
        self.core = self._session.core

    def on_start(self) -> None:
        self._session.start()
        if self.service_key is not None:
            self._registry.register(self.service_key, self.self_ref)

    def on_stop(self) -> None:
        try:
            self._session.close()
        except (DedupStoreError, ConsumerFenced) as error:
            self._logger.error("ConsumerController stopping: %s", error)
        self._tell_outbox()
        if self.service_key is not None:
            # After the last Ack above: the work-pulling controller takes it in before it
            # hands our unconfirmed messages to the other workers (fewer duplicates).
            self._registry.deregister(self.service_key, self.self_ref)
        super().on_stop()

    def _core_receive(self, message: Any) -> list[Effect]:
        if type(message) is Rejected:
            self._session.check_can_reject()  # else refused: the delivery still awaits
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

    def _run(self, effects: Iterable[Effect]) -> None:
        """The session carries the effects out (a failing store closes it: it logs here,
        and the actor stops); then what it sent is told."""
        try:
            self._session.run(effects)
        except (DedupStoreError, DeadLetterError, ConsumerFenced) as error:
            self._logger.error("ConsumerController stopping: %s", error)
            return
        self._tell_outbox()

    def _tell_outbox(self) -> None:
        for to, message in self._session.take_outbox():
            self._send(to, message)

    def _stop_once(self) -> None:
        if not self.actor_stopped.is_set():  # in on_stop it is stopping already
            self.stop()

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
