"""A `CoordinatedConsumer`'s periods of consuming, the hooks told of them, and the
position it reports while consuming."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pykka_delivery.coordinator.lag import ConsumerPosition
from pykka_delivery.coordinator.state import GroupId
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.merged import MergedConsumer, ProducerSet
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.protocol.messages import Ref

__all__ = ["ActivationHooks", "ActivationInterval", "ConfirmTo", "positions_of", "register"]

logger = logging.getLogger("pykka_delivery.coordinator.consumer")


@dataclass(frozen=True, slots=True)
class ActivationInterval:
    """One period of consuming, in `time.monotonic` seconds.

    Attributes:
        start: when its `Consumer` was created (after the coordinator's ``active``).
        end: when that `Consumer` was closed (before answering a step-down); None while
            it is consuming.
        epoch: the coordinator's fencing epoch of the activation (0 from a coordinator
            that sends none).
    """

    start: float
    end: float | None = None
    epoch: int = 0


Hook = Callable[[ActivationInterval], None]


class _Owner(Protocol):
    def _confirm(self, delivery: Delivery) -> None: ...


class ConfirmTo:
    """``confirm_to`` of a delivery handed out: its owner confirms it, then lets a
    pending stop go ahead."""

    __slots__ = ("_delivery", "_owner")

    def __init__(self, owner: _Owner, delivery: Delivery) -> None:
        self._owner = owner
        self._delivery = delivery

    def tell(self, message: object) -> None:
        self._owner._confirm(self._delivery)


class ActivationHooks:
    """The ``on_activated`` / ``on_deactivated`` hooks: queued under the consumer's
    ``lock`` (`due`), called outside it (`run`), one at a time and in order."""

    def __init__(
        self,
        lock: threading.Lock,
        group: GroupId,
        on_activated: Hook | None,
        on_deactivated: Hook | None,
    ) -> None:
        self._lock = lock
        self._group = group
        self._hooks = {"on_activated": on_activated, "on_deactivated": on_deactivated}
        self._due: collections.deque[tuple[str, ActivationInterval]] = collections.deque()
        self._running = threading.RLock()

    def due(self, name: str, interval: ActivationInterval) -> None:
        """With the lock held: queue hook ``name`` with ``interval``."""
        if self._hooks[name] is not None:
            self._due.append((name, interval))

    def run(self) -> None:
        """Without the lock: call the hooks due, one at a time and in order (a thread that
        queued one may find another thread calling it)."""
        with self._running:
            while True:
                with self._lock:
                    if not self._due:
                        return
                    name, interval = self._due.popleft()
                hook = self._hooks[name]
                assert hook is not None
                try:
                    hook(interval)
                except Exception:
                    logger.exception(
                        "CoordinatedConsumer of %s: its %s hook raised (ignored: consuming "
                        "goes on)",
                        self._group,
                        name,
                    )


def positions_of(
    group: GroupId,
    partition_index: int,
    consumer: Consumer | MergedConsumer | None,
    in_flight: Delivery | None,
) -> list[ConsumerPosition]:
    """Where the open ``consumer`` is in its producer's stream, one position per producer
    of a `MergedConsumer` (nothing while not consuming, nor for a producer before its
    first message), ``in_flight`` the delivery handed out."""
    if consumer is None:
        return []
    snapshots = (
        consumer.snapshots() if isinstance(consumer, MergedConsumer) else [consumer.snapshot()]
    )
    g = group
    positions = []
    for snapshot in snapshots:
        if not snapshot.received_seq_nr:
            continue
        # A new activation's Consumer counts from 0 until its first confirmation, but
        # deliveries come in order: all before the one in flight were confirmed.
        confirmed = snapshot.confirmed_seq_nr
        if in_flight is not None and in_flight.producer_id == snapshot.producer_id:
            confirmed = max(confirmed, in_flight.seq_nr - 1)
        positions.append(
            ConsumerPosition(
                g.namespace,
                g.stream,
                g.name,
                partition_index,
                snapshot.producer_id,
                snapshot.received_seq_nr,
                confirmed,
            )
        )
    return positions


def register(consumer: Consumer | MergedConsumer, producer: Ref | ProducerSet) -> None:
    """An activation's handle registers to its producer, or follows its set."""
    if isinstance(consumer, MergedConsumer):
        assert isinstance(producer, ProducerSet)  # _start_consumer chose by it
        consumer.register_to(producer)
    else:
        assert not isinstance(producer, ProducerSet)
        consumer.register_to(producer)
