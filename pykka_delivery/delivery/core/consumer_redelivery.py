"""Rejections, beyond Akka: a delivery the consumer rejected comes again after a backoff,
and after ``max_attempts`` deliveries goes to the dead letters (dead_letters.py).

The consumer core keeps a `Redelivery` only while the delivery awaiting confirmation has
been rejected, so the steady state (no rejection) reads one attribute and writes none.
Only this module assigns a `Redelivery`'s fields.
"""

from __future__ import annotations

import logging

from pykka_delivery.delivery.core.effects import StartTimer, WriteDeadLetter
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.protocol.messages import SequencedMessage, SequencedRun

__all__ = ["REDELIVER", "Redelivery"]

logger = logging.getLogger("pykka_delivery.consumer")

REDELIVER = "redeliver"
"""Key of the timer that delivers a rejected message again after its backoff."""


class Redelivery:
    """The rejections of the current delivery: its attempt (1 = first delivery), and
    whether its next delivery waits for the `REDELIVER` timer."""

    __slots__ = ("attempt", "waiting")

    def __init__(self) -> None:
        self.attempt = 1
        self.waiting = False

    def rejected(
        self,
        current: SequencedMessage | SequencedRun,
        reason: str,
        settings: ConsumerControllerSettings,
    ) -> StartTimer | WriteDeadLetter:
        """The consumer rejected ``current``: the timer of its next attempt, or, at
        ``max_attempts``, the dead letter to write before the stream moves on."""
        attempt = self.attempt
        if attempt < settings.max_attempts:
            backoff = min(
                settings.redelivery_backoff * 2 ** (attempt - 1), settings.redelivery_backoff_max
            )
            logger.debug(
                "Delivery %r seq_nr %d rejected (attempt %d of %d), again in %s s: %s",
                current.producer_id,
                current.seq_nr,
                attempt,
                settings.max_attempts,
                backoff,
                reason,
            )
            self.waiting = True
            return StartTimer(REDELIVER, backoff)
        logger.warning(
            "Delivery %r seq_nr %d rejected %d times, to the dead letters: %s",
            current.producer_id,
            current.seq_nr,
            attempt,
            reason,
        )
        return WriteDeadLetter(
            current.producer_id, current.seq_nr, current.message, reason, attempt
        )

    def redeliver(self) -> None:
        """The backoff is over: the next delivery is the next attempt."""
        self.waiting = False
        self.attempt += 1

    def skip_backoff(self) -> None:
        """Delivered again at once (to a new consumer), as the same attempt."""
        self.waiting = False
