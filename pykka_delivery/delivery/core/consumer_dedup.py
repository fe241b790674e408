"""A consumer core's deduplication across restarts: the positions it keeps and what they
say about a session that begins (optional: a consumer given a `DedupStore`, dedup.py).

Akka redelivers after a crash whatever the producer side had not seen confirmed, with its
original seq_nrs, from a new producer controller; some of it the consumer may have
processed already. With positions (producer id -> highest seq_nr confirmed here), each
session starts with a *floor*, that producer id's position when the session began; a
message at or below it is a duplicate: the core does not deliver it, but confirms it at
once as if it had been (the window and the producer's confirmations move on). Every
confirmation moves the position and emits `RecordConfirmed`, which the shell writes to the
store and flushes before the next `Request` or `Ack` leaves, so the producer side never
drops a message this consumer could forget. As in the broker of seed 002: the next seq_nr
is delivered, a seq_nr confirmed before is a duplicate, a session starting above position
+ 1 is a gap (reported with a warning, counted, and delivered). A session starting at
seq_nr 1 below a known position is a *sequence restart* (a producer without a durable
queue restarted, or a durable one resends what it had not seen confirmed): warned about,
and handled as ``settings.on_sequence_restart`` says.

Only this module assigns a `DedupPositions`' fields; the consumer core keeps the floor.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pykka_delivery.delivery.core.effects import Effect, RecordConfirmed

__all__ = ["DedupPositions"]

logger = logging.getLogger("pykka_delivery.consumer")


class DedupPositions:
    """The positions of one consumer core, and its deduplication counters.

    Args:
        positions: producer id -> highest seq_nr confirmed, as loaded from the store.
        on_sequence_restart: ``"drop"`` or ``"reset"`` (`ConsumerControllerSettings`).
    """

    __slots__ = ("_on_sequence_restart", "duplicates", "gaps", "positions", "sequence_restarts")

    def __init__(self, positions: Mapping[str, int], on_sequence_restart: str) -> None:
        self.positions = dict(positions)
        self._on_sequence_restart = on_sequence_restart
        self.duplicates = self.gaps = self.sequence_restarts = 0

    def session_floor(self, producer_id: str, seq_nr: int, effects: list[Effect]) -> int:
        """A session of ``producer_id`` begins at ``seq_nr``: the seq_nr at or below which
        its messages were confirmed here before. Warns of a gap or a sequence restart
        (``"reset"`` forgets the position: `RecordConfirmed` of 0)."""
        position = self.positions.get(producer_id, 0)
        if position and seq_nr == 1:
            self.sequence_restarts += 1
            if self._on_sequence_restart == "reset":
                logger.warning(
                    "Producer %r started a new session at seq_nr 1, but seq_nrs up to %d were "
                    "confirmed here before: forgetting that position and delivering from 1 "
                    '(on_sequence_restart="reset"). If its producer controller has a durable '
                    "queue, messages it resends are delivered twice; restart a producer "
                    "without one under a new producer id instead",
                    producer_id,
                    position,
                )
                self.positions[producer_id] = position = 0
                effects.append(RecordConfirmed(producer_id, 0))
            else:
                logger.warning(
                    "Producer %r started a new session at seq_nr 1, but seq_nrs up to %d were "
                    "confirmed here before: dropping seq_nrs 1..%d as duplicates "
                    '(on_sequence_restart="drop"). Right if it resends them (a durable '
                    "producer queue, a retried task); if it restarted its numbering with new "
                    "messages they are lost here: give that producer a durable queue or a new "
                    'producer id per incarnation, or set on_sequence_restart="reset"',
                    producer_id,
                    position,
                    position,
                )
        elif position and seq_nr > position + 1:
            self.gaps += 1
            logger.warning(
                "Producer %r started a session at seq_nr %d, but only seq_nrs up to %d were "
                "confirmed here: seq_nrs %d..%d never reached this consumer (lost, or "
                "confirmed by another consumer of this producer id); delivering from %d",
                producer_id,
                seq_nr,
                position,
                position + 1,
                seq_nr - 1,
                seq_nr,
            )
        return position

    def skipped(self, producer_id: str, seq_nr: int, floor: int) -> None:
        """``seq_nr`` was not delivered: confirmed before its session began."""
        self.duplicates += 1
        logger.debug(
            "Received SequencedMessage seq_nr %d of %r, not delivering it: confirmed before "
            "(deduplication position %d)",
            seq_nr,
            producer_id,
            floor,
        )

    def confirmed(self, producer_id: str, seq_nr: int) -> RecordConfirmed:
        """``seq_nr`` is confirmed: the new position, for the shell to record before the
        producer side hears of it."""
        self.positions[producer_id] = seq_nr
        return RecordConfirmed(producer_id, seq_nr)
