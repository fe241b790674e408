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

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pykka

from pykka_delivery.delivery.actors._shell import ControllerActor
from pykka_delivery.delivery.core.consumer import (
    RETRY,
    ConsumerCore,
    ConsumerSnapshot,
    ConsumerStats,
)
from pykka_delivery.delivery.core.effects import Effect, RecordConfirmed, WriteDeadLetter
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
from pykka_delivery.delivery.stores.dead_letters import (
    DeadLetterDestination,
    DeadLetterError,
    dead_letter_destination,
    write_dead_letter,
)
from pykka_delivery.delivery.stores.dedup import DedupStore, DedupStoreError, DedupWriter
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import LocalProtocolError
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
            `DeadLetterDestination`, or the path of an SQLite file for a
            `SqliteDeadLetters` the controller owns (closed when it stops). None (the
            default): a `Rejected` is refused (logged as an error, nothing changes). If
            the destination fails, the controller logs an error and stops (the message
            stays unconfirmed at the producer).
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
    ) -> None:
        # Loaded here, in the caller's thread: a store that cannot be read fails start().
        settings = settings or ConsumerControllerSettings()
        self._dedup = None if dedup_store is None else DedupWriter(dedup_store, settings)
        positions = None if self._dedup is None else self._dedup.load()
        if service_key is not None and (not isinstance(service_key, str) or not service_key):
            msg = f"service_key must be a non-empty str or None, got {service_key!r}"
            raise ValueError(msg)
        super().__init__(self_ref_factory=self_ref_factory, timer_service=timer_service)
        self._dead_letters, self._owns_dead_letters = dead_letter_destination(dead_letters)
        self.service_key = service_key
        self._registry = registry if registry is not None else default_registry()
        # Deliveries carry our own pykka ref: the consumer is local by definition.
        self.core = ConsumerCore(
            self.self_ref,
            settings,
            serialization,
            confirm_to=self.actor_ref,
            dedup_positions=positions,
        )

    def on_start(self) -> None:
        self._run(self.core.on_spawned())
        if self.service_key is not None:
            self._registry.register(self.service_key, self.self_ref)

    def on_stop(self) -> None:
        self._run(self.core.on_stopped())
        if self.service_key is not None:
            # After the last Ack above: the work-pulling controller takes it in before it
            # hands our unconfirmed messages to the other workers (fewer duplicates).
            self._registry.deregister(self.service_key, self.self_ref)
        if self._dedup is not None and self._dedup.broken is None:
            self._dedup_call(self._dedup.flush)
        if self._owns_dead_letters:
            self._dead_letters.close()  # type: ignore[union-attr] # owned: SQLite
        super().on_stop()

    def _core_receive(self, message: Any) -> list[Effect]:
        if type(message) is Rejected and self._dead_letters is None:
            msg = (
                "ConsumerController: a Rejected needs a dead-letter destination for the "
                "messages rejected max_attempts times: start it with dead_letters=path or "
                "destination; the delivery still awaits confirmation"
            )
            raise LocalProtocolError(msg)
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

    # The deduplication store: record each confirmation, flush before the producer side
    # hears of it (a Request or Ack), give up by stopping.

    def _run_other(self, effect: Effect) -> bool:
        if type(effect) is WriteDeadLetter:
            try:
                write_dead_letter(self._dead_letters, effect)
            except DeadLetterError as error:
                self._logger.error("ConsumerController stopping: %s", error)
                self.stop()
                return False
            return True
        dedup = self._dedup
        if type(effect) is RecordConfirmed and dedup is not None:
            if dedup.broken is not None:
                return False  # stopping already
            return self._dedup_call(dedup.record, effect.producer_id, effect.seq_nr)
        return super()._run_other(effect)

    def _send(self, to: Ref, message: Any) -> None:
        dedup = self._dedup
        if dedup is not None:
            if dedup.broken is not None:
                return  # stopping: nothing more goes out
            if not self._dedup_call(dedup.before_send, message):
                return
        super()._send(to, message)

    def _dedup_call(self, call: Callable[..., None], *args: Any) -> bool:
        try:
            call(*args)
        except DedupStoreError as error:
            self._logger.error("ConsumerController stopping: %s", error)
            if not self.actor_stopped.is_set():  # in on_stop it is stopping already
                self.stop()
            return False
        return True

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
