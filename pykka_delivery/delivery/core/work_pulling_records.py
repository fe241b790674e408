"""The vocabulary and views of a `WorkPullingCore`: the messages a work-pulling producer
controller takes besides the producer's (`CurrentWorkers`, `WorkerMessage`,
`GetWorkerStats`, answered by `WorkerStats`), and its frozen snapshot and statistics.
Read from the core; nothing here assigns its state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pykka_delivery.protocol.messages import Ref

if TYPE_CHECKING:
    from pykka_delivery.delivery.core.work_pulling import WorkPullingCore

__all__ = [
    "CurrentWorkers",
    "GetWorkerStats",
    "WorkPullingSnapshot",
    "WorkPullingStats",
    "WorkerMessage",
    "WorkerSnapshot",
    "WorkerStats",
]


# --- messages --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CurrentWorkers:
    """The service registry's listing: the consumer controllers registered now."""

    workers: frozenset[Ref]


@dataclass(frozen=True, slots=True)
class WorkerMessage:
    """``message`` (a `Request`, `Ack` or `Resend`) from the consumer controller of the
    worker ``worker_id``, for that worker's producer controller."""

    worker_id: str
    message: Any


@dataclass(frozen=True, slots=True)
class GetWorkerStats:
    """Ask for the number of workers; the answer, a `WorkerStats`, goes to ``reply_to``."""

    reply_to: Ref


@dataclass(frozen=True, slots=True)
class WorkerStats:
    """How many workers are registered (the last listing's size)."""

    number_of_workers: int


# --- snapshots -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """One worker as the core sees it.

    Attributes:
        worker_id: the worker's id, also its confirmation qualifier in the durable queue.
        producer_id: the producer id of the worker's session (``<producer_id>-<worker_id>``).
        consumer_controller: the worker's ref, as registered.
        has_demand: the worker may take one message now.
        unconfirmed: the seq_nrs (the controller's numbering) of the messages sent to it
            and not confirmed yet, oldest first.
    """

    worker_id: str
    producer_id: str
    consumer_controller: Ref
    has_demand: bool
    unconfirmed: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class WorkPullingSnapshot:
    """A frozen view of a work-pulling core's state (seq_nrs only, no payloads).

    Attributes:
        current_seq_nr: the seq_nr the next accepted message will get.
        highest_confirmed_seq_nr: the highest seq_nr a worker confirmed.
        requested: a `RequestNext` is outstanding to the producer.
        buffered: the seq_nrs of the messages waiting for a worker with demand, in order.
        workers: every registered worker, in the order they registered.
    """

    current_seq_nr: int
    highest_confirmed_seq_nr: int
    requested: bool
    buffered: tuple[int, ...]
    workers: tuple[WorkerSnapshot, ...]

    @classmethod
    def of(cls, core: WorkPullingCore) -> WorkPullingSnapshot:
        return cls(
            current_seq_nr=core.current_seq_nr,
            highest_confirmed_seq_nr=core.highest_confirmed_seq_nr,
            requested=core.requested,
            buffered=tuple(p.seq_nr for p in core.buffer),
            workers=tuple(
                WorkerSnapshot(
                    worker_id=w.worker_id,
                    producer_id=w.core.producer_id,
                    consumer_controller=w.consumer_controller,
                    has_demand=w.core.has_demand,
                    unconfirmed=tuple(s.seq_nr for s in w.sent),
                )
                for w in core.workers.values()
            ),
        )


@dataclass(frozen=True, slots=True)
class WorkPullingStats:
    """Counters of a work-pulling producer controller, as a frozen snapshot.

    Attributes:
        workers: registered workers now.
        buffered: messages waiting for a worker with demand now.
        accepted: messages accepted from the producer.
        sent: messages sent to a worker (each resend to another worker counted again).
        redelivered: messages taken from a worker that left (or reloaded from the durable
            queue) to be sent to another.
        confirmed: messages a worker confirmed.
        rejected: inputs refused as protocol misuse or for a full buffer (see the log).
        refused_payloads: messages refused because their payload cannot be encoded for a
            worker or the durable queue: when sent (the send raised `SerializationError`),
            or, accepted before such a worker registered, when they would go to it (each
            logged as an error).
    """

    workers: int
    buffered: int
    accepted: int
    sent: int
    redelivered: int
    confirmed: int
    rejected: int
    refused_payloads: int = 0
