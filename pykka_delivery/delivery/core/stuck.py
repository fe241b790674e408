"""Finding messages a producer sent long ago that are still unconfirmed ("stuck").

A producer core runs the check on its ``stuck_check`` timer, every quarter of
``ProducerControllerSettings.stuck_after``. Nothing is recorded per message: each check
leaves one mark (when, last seq_nr sent by then), and the marks older than ``stuck_after``
say what was sent that long ago; what of it is not confirmed yet is stuck.
"""

from __future__ import annotations

import logging
from collections import deque

__all__ = ["StuckCheck"]

logger = logging.getLogger("pykka_delivery.producer")


class StuckCheck:
    """The stuck-message gauge of one producer, and its warnings.

    Args:
        producer_id: names the producer in the log.
        stuck_after: seconds after which an unconfirmed message counts as stuck.

    Attributes:
        stuck: messages found stuck at the last check (a gauge).
        reports: times messages were found stuck after none were.
    """

    __slots__ = ("_marks", "_producer_id", "_stuck_after", "reports", "stuck")

    def __init__(self, producer_id: str, stuck_after: float) -> None:
        self._producer_id = producer_id
        self._stuck_after = stuck_after
        self._marks: deque[tuple[float, int]] = deque()
        self.stuck = 0
        self.reports = 0

    def check(self, now: float, last_sent: int, confirmed: int) -> None:
        """Count what was sent ``stuck_after`` seconds before ``now`` or earlier and is
        not confirmed (``confirmed`` is the confirmed seq_nr); warn when that becomes
        non-zero, tell when it is zero again."""
        marks = self._marks
        marks.append((now, last_sent))
        limit = now - self._stuck_after
        sent_by_limit = None
        while marks and marks[0][0] <= limit:
            sent_by_limit = marks.popleft()[1]
        if sent_by_limit is not None:
            marks.appendleft((limit, sent_by_limit))  # still the latest mark that old
        stuck = 0 if sent_by_limit is None else max(0, sent_by_limit - confirmed)
        if stuck and not self.stuck:
            self.reports += 1
            logger.warning(
                "Producer %r: %d messages sent more than %s s ago are not confirmed (the "
                "oldest is seq_nr %d; the consumer side confirmed up to %d): is the consumer "
                "alive, connected and confirming?",
                self._producer_id,
                stuck,
                self._stuck_after,
                confirmed + 1,
                confirmed,
            )
        elif self.stuck and not stuck:
            logger.info("Producer %r: no message is stuck any more", self._producer_id)
        self.stuck = stuck
