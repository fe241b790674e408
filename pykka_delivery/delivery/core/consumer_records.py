"""The consumer core's phases and the frozen records it reports (`ConsumerCore.snapshot`,
`ConsumerCore.statistics`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "ACTIVE",
    "RESENDING",
    "STOPPED",
    "WAITING_FOR_CONFIRMATION",
    "WAITING_FOR_START",
    "ConsumerPhase",
    "ConsumerSnapshot",
    "ConsumerStats",
]


class ConsumerPhase(enum.Enum):
    WAITING_FOR_START = "waiting_for_start"  # no consumer yet: stash
    ACTIVE = "active"  # waiting for the next SequencedMessage
    RESENDING = "resending"  # gap seen: ignore all but the expected seq_nr
    WAITING_FOR_CONFIRMATION = "waiting_for_confirmation"  # a Delivery is out: stash
    STOPPED = "stopped"


# The phases as module globals, for the modules of the consumer core: the hot paths compare
# phases on every message, and a global is cheaper to look up than an enum member.
WAITING_FOR_START = ConsumerPhase.WAITING_FOR_START
ACTIVE = ConsumerPhase.ACTIVE
RESENDING = ConsumerPhase.RESENDING
WAITING_FOR_CONFIRMATION = ConsumerPhase.WAITING_FOR_CONFIRMATION
STOPPED = ConsumerPhase.STOPPED


@dataclass(frozen=True, slots=True)
class ConsumerSnapshot:
    """A frozen view of a consumer core's state (seq_nrs only, no payloads)."""

    phase: ConsumerPhase
    producer_id: str
    received_seq_nr: int
    confirmed_seq_nr: int
    requested_seq_nr: int
    stashed: tuple[int, ...]
    collected_chunks: tuple[int, ...]
    registering: bool
    stopping: bool
    retry_interval: float


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """Counters of a consumer controller, as a frozen snapshot.

    Attributes:
        delivered: deliveries handed to the consumer.
        confirmed: deliveries the consumer confirmed.
        duplicates: messages dropped as already received.
        gaps: gaps detected (a `Resend` sent).
        dropped: messages dropped for other reasons (stash full, wrong producer,
            registering elsewhere, waiting for a resend).
        retries: retry-timer firings that re-sent a Request, Resend or RegisterConsumer.
        dedup_duplicates: messages not delivered because the deduplication position
            shows them confirmed before (redelivered after a restart); each was
            confirmed to the producer side at once. Not included in ``duplicates``.
        dedup_gaps: sessions that started more than one seq_nr above the producer id's
            deduplication position: messages this consumer never confirmed are missing
            (each is logged as a warning naming them).
        sequence_restarts: sessions of a known producer id that started at seq_nr 1
            below its deduplication position (see ``on_sequence_restart``).
        rejected: deliveries the consumer rejected (each redelivered or dead-lettered).
        dead_lettered: messages written to the dead-letter destination after
            ``max_attempts`` rejected deliveries (counted in ``confirmed`` too: the
            stream moved on past them).
    """

    delivered: int
    confirmed: int
    duplicates: int
    gaps: int
    dropped: int
    retries: int
    dedup_duplicates: int
    dedup_gaps: int
    sequence_restarts: int
    rejected: int
    dead_lettered: int
