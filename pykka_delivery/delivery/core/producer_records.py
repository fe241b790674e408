"""What a `ProducerCore` is and shows of itself: its phases (`ProducerPhase`),
`ProducerSnapshot` (its state, seq_nrs only), `ProducerStats` (its counters, kept in a
`ProducerCounters`) and the wording of its refusals. The core modules count and change its
state; nothing here does.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pykka_delivery.delivery.core.producer import ProducerCore
    from pykka_delivery.delivery.core.stuck import StuckCheck

__all__ = [
    "ACTIVE",
    "WAITING_FOR_INITIALIZATION",
    "ProducerCounters",
    "ProducerPhase",
    "ProducerSnapshot",
    "ProducerStats",
    "cannot_handle_message",
    "no_demand_message",
]


class ProducerPhase(enum.Enum):
    WAITING_FOR_INITIALIZATION = "waiting_for_initialization"  # needs producer and consumer
    ACTIVE = "active"


# The phases as module globals, for the modules of the producer core: the hot paths compare
# phases on every message, and a global is several times cheaper to read than an enum
# member.
WAITING_FOR_INITIALIZATION = ProducerPhase.WAITING_FOR_INITIALIZATION
ACTIVE = ProducerPhase.ACTIVE


@dataclass(frozen=True, slots=True)
class ProducerSnapshot:
    """A frozen view of a producer core's state (seq_nrs only, no payloads)."""

    phase: ProducerPhase
    current_seq_nr: int
    confirmed_seq_nr: int
    requested_seq_nr: int
    requested: bool
    first_seq_nr: int
    support_resend: bool
    unconfirmed: tuple[int, ...]
    remaining_chunks: tuple[int, ...]
    pending_replies: tuple[int, ...]
    epoch: int = 0  # the highest fencing epoch registered (0: none)

    @property
    def sent_seq_nr(self) -> int:
        """The last seq_nr numbered (``current_seq_nr`` is the next one to give)."""
        return self.current_seq_nr - 1

    @property
    def in_flight(self) -> int:
        """Messages numbered and not confirmed yet."""
        return max(0, self.sent_seq_nr - self.confirmed_seq_nr)

    @classmethod
    def of(cls, core: ProducerCore) -> ProducerSnapshot:
        return cls(
            phase=core.phase,
            current_seq_nr=core.current_seq_nr,
            confirmed_seq_nr=core.confirmed_seq_nr,
            requested_seq_nr=core.requested_seq_nr,
            requested=core.requested,
            first_seq_nr=core.first_seq_nr,
            support_resend=core.support_resend,
            unconfirmed=tuple(m.seq_nr for m in core.unconfirmed),
            remaining_chunks=tuple(m.seq_nr for m in core.remaining_chunks),
            pending_replies=tuple(sorted(core.replies)),
            epoch=core.epoch,
        )


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """Counters of a producer controller, as a frozen snapshot.

    Attributes:
        sent: messages (or chunks) sent for the first time.
        resent: messages (or chunks) sent again (Resend, retries, first-message resends).
        requests: `Request` messages received.
        resend_requests: `Resend` messages received.
        acks: `Ack` messages received.
        rejected: inputs refused as protocol misuse (see the log for each).
        stored: messages (or chunks) handed to the durable queue to store (0 without one).
        stuck: messages sent more than ``stuck_after`` seconds ago and not confirmed, at
            the last check (a gauge; 0 when the check is off).
        stuck_reports: times messages were found stuck after none were (each logged as a
            warning).
        lost_on_close: messages still unconfirmed when the producer was closed without a
            durable queue: never resent, so lost unless the consumer had them (each close
            that lost some is logged as a warning naming their seq_nrs).
        refused_payloads: messages refused when sent because their payload cannot be
            encoded for the consumer side's transport or the durable queue (the send
            raised `SerializationError`; nothing was numbered).
        fenced: `RegisterConsumer`, `Request` and `Ack` messages ignored because their
            fencing epoch is lower than the highest registered (each answered with
            `Fenced`, or told so once already).
    """

    sent: int
    resent: int
    requests: int
    resend_requests: int
    acks: int
    rejected: int
    stored: int
    stuck: int
    stuck_reports: int
    lost_on_close: int
    refused_payloads: int = 0
    fenced: int = 0


class ProducerCounters:
    """The counters of a producer core (each described in `ProducerStats`)."""

    __slots__ = (
        "acks",
        "fenced",
        "lost_on_close",
        "rejected",
        "requests",
        "resend_requests",
        "resent",
        "stored",
    )

    def __init__(self) -> None:
        self.resent = self.requests = self.resend_requests = 0
        self.acks = self.rejected = self.stored = self.lost_on_close = self.fenced = 0

    def statistics(self, sent: int, stuck: StuckCheck, refused_payloads: int) -> ProducerStats:
        """The counters with ``sent``, ``stuck``'s gauge and the payload gate's count, as
        a frozen snapshot."""
        return ProducerStats(
            sent=sent,
            resent=self.resent,
            requests=self.requests,
            resend_requests=self.resend_requests,
            acks=self.acks,
            rejected=self.rejected,
            stored=self.stored,
            stuck=stuck.stuck,
            stuck_reports=stuck.reports,
            lost_on_close=self.lost_on_close,
            refused_payloads=refused_payloads,
            fenced=self.fenced,
        )


def cannot_handle_message(core: ProducerCore, message: object) -> str:
    """Why ``core`` refuses ``message``: it is not one a producer controller takes."""
    return (
        f"ProducerController {core.producer_id!r} cannot handle {type(message).__name__} "
        f"(in phase {core.phase.value})"
    )


def no_demand_message(core: ProducerCore, *, active: bool) -> str:
    """Why ``core`` (``active``: in its active phase) refuses a message now."""
    name = f"ProducerController {core.producer_id!r}"
    if not active:
        missing = [
            what
            for what, ref in (("ProducerStart", core.producer), ("RegisterConsumer", core.consumer))
            if ref is None
        ]
        return (
            f"{name} got a message before it was started (still waiting for "
            f"{' and '.join(missing)}): wait for RequestNext"
        )
    if core.remaining_chunks:
        return (
            f"{name} got a message while {len(core.remaining_chunks)} numbered messages or "
            "chunks are unsent: wait for RequestNext"
        )
    return (
        f"{name} got a message with no demand (requested up to seq_nr "
        f"{core.requested_seq_nr}, next seq_nr {core.current_seq_nr}): send one message per "
        "RequestNext"
    )
