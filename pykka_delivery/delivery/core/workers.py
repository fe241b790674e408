"""What a `WorkPullingCore` keeps per message and per worker: a message waiting for a
worker (`Pending`), one sent to a worker and unconfirmed (`SentToWorker`), a registered
worker with the `ProducerCore` serving it (`Worker`), and the internal refs that tag what
such a core tells. Plain slotted records; the work-pulling core module changes them.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from pykka_delivery.delivery.core.producer import ProducerCore
from pykka_delivery.protocol.messages import Ref

__all__ = ["NOWHERE", "InternalRef", "Pending", "SentToWorker", "Worker"]


class InternalRef:
    """A ref only this core uses, to recognize what a worker's `ProducerCore` tells its
    producer (demand) or a confirmation reply target (confirmed); it is never told."""

    __slots__ = ("_what",)

    def __init__(self, what: str) -> None:
        self._what = what

    def __repr__(self) -> str:
        return f"<work pulling {self._what}>"

    def tell(self, message: Any) -> None:
        msg = f"{self!r} is internal to WorkPullingCore and cannot be told {message!r}"
        raise AssertionError(msg)


NOWHERE = InternalRef("send_next_to")


class Pending:
    """A message waiting for a worker with demand.

    ``seq_nr`` is the controller's number of the message; with a durable queue, the seq_nr
    it is stored under now, and ``stored_as`` that entry's qualifier.
    """

    __slots__ = ("message", "reply_to", "seq_nr", "stored_as")

    def __init__(
        self, seq_nr: int, message: Any, reply_to: Ref | None, stored_as: str | None
    ) -> None:
        self.seq_nr = seq_nr
        self.message = message
        self.reply_to = reply_to
        self.stored_as = stored_as


class SentToWorker:
    """A message sent to a worker and not confirmed yet (Akka's ``Unconfirmed``)."""

    __slots__ = ("message", "out_seq_nr", "reply_to", "seq_nr")

    def __init__(self, seq_nr: int, out_seq_nr: int, message: Any, reply_to: Ref | None) -> None:
        self.seq_nr = seq_nr
        self.out_seq_nr = out_seq_nr
        self.message = message
        self.reply_to = reply_to


class Worker:
    """One registered worker: its consumer controller and the producer core serving it
    (Akka's ``OutState``)."""

    __slots__ = ("confirmed_to", "consumer_controller", "core", "demand_to", "sent", "worker_id")

    def __init__(self, worker_id: str, consumer_controller: Ref, core: ProducerCore) -> None:
        self.worker_id = worker_id
        self.consumer_controller = consumer_controller
        self.core = core
        self.demand_to = InternalRef(f"demand of worker {worker_id}")
        self.confirmed_to = InternalRef(f"confirmations of worker {worker_id}")
        self.sent: deque[SentToWorker] = deque()

    def timer_key(self, key: str) -> str:
        return f"{self.worker_id}/{key}"
