"""Pieces the blocking and the asyncio handles share (how they wait differs; this not)."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from pykka_delivery.actors._shell import DurableQueueCalls
from pykka_delivery.actors.consumer_core import ConsumerCore
from pykka_delivery.actors.dead_letters import DeadLetterError
from pykka_delivery.actors.dedup import DedupWriter
from pykka_delivery.actors.durable_queue import (
    DurableProducerQueue,
    DurableProducerState,
    DurableQueueError,
)
from pykka_delivery.actors.effects import Effect
from pykka_delivery.actors.messages import Delivery, PeerLinkChanged, SequencedMessage
from pykka_delivery.actors.producer_core import ProducerCore
from pykka_delivery.actors.settings import ProducerControllerSettings
from pykka_delivery.actors.timers import TimerFired, Timers
from pykka_delivery.errors import ClosedError, LocalProtocolError

__all__ = [
    "DeliveryFeed",
    "Ignore",
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
        else:
            logger.error("Consumer cannot handle %s: dropped", type(message).__name__)

    def _next_ready(self) -> Delivery | None:
        """Feed the inbox to the core until it hands out a delivery (or the inbox is empty)."""
        ready = self._ready.deliveries
        inbox = self._inbox
        next_delivery = self._core.next_delivery
        while not ready and inbox:
            message = inbox.popleft()
            if type(message) is SequencedMessage:
                delivery = next_delivery(message)  # the steady state: no effects to run
                if delivery is not None:
                    self._outstanding = delivery
                    return delivery
            self._feed(message)
        if not ready:
            return None
        delivery = ready.popleft()
        self._outstanding = delivery
        return delivery
