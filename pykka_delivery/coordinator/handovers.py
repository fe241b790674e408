"""The coordinator shell's record of activation changes: logs, hand-overs, statistics.

`CoordinatorActor` hands every state change to a `HandoverBook` with its clocks. The
book logs one INFO line per activation change (structured fields in ``extra``, for a
JSON log format), keeps each group's last `Handover` for listings, counts activations
and times hand-overs into a fixed-bucket histogram (`HandoverHistogram`, which a
Prometheus exporter turns into a histogram as it is).

What it keeps lives in the running coordinator, not in its command log: after a
restart the last hand-overs are unknown until the next ones, and a hand-over under way
at the restart is recorded without its beginning.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from pykka_delivery.coordinator.activations import (
    ActivationChange,
    ActivationEvent,
    ConsumerId,
    Handover,
    HandoverReason,
)
from pykka_delivery.coordinator.state import CoordinatorState, GroupId
from pykka_delivery.coordinator.stats import HANDOVER_BUCKETS, HandoverHistogram

__all__ = ["HandoverBook"]

logger = logging.getLogger("pykka_delivery.coordinator")


@dataclass(frozen=True, slots=True)
class _Start:
    """A hand-over decided and not finished: who left, why, when (monotonic)."""

    from_consumer: ConsumerId
    reason: HandoverReason
    at: float


# Events that begin a hand-over: the active consumer is told to step down, or goes.
_BEGINS = frozenset({ActivationEvent.STEPPING_DOWN, ActivationEvent.DEACTIVATED})


class HandoverBook:
    """Each group's hand-over under way and last one, the activation count and the
    duration histogram. Mutable: used only in the coordinator actor's thread."""

    def __init__(self) -> None:
        self._pending: dict[GroupId, _Start] = {}
        self._last: dict[GroupId, Handover] = {}
        self._bucket_counts = [0] * len(HANDOVER_BUCKETS)
        self._count = 0
        self._sum = 0.0
        self.activations = 0

    def record(
        self,
        changes: list[ActivationChange],
        state: CoordinatorState,
        *,
        now: float,
        monotonic: float,
    ) -> None:
        """Log ``changes`` (those of one command that changed the state to ``state``;
        possibly none) and keep the hand-overs they begin and finish. ``now`` is
        wall-clock seconds (a hand-over's ``at``), ``monotonic`` times durations."""
        for change in changes:
            _log(change)
            if change.event in _BEGINS and change.reason is not HandoverReason.RECONNECTED:
                # The first decision counts: a stepping-down consumer presumed down later
                # is still the same hand-over.
                self._pending.setdefault(
                    change.group, _Start(change.consumer, change.reason, monotonic)
                )
            elif change.event is ActivationEvent.ACTIVATED:
                self._activated(change, now, monotonic)
        # A group that is gone takes its pending hand-over along (few are pending). Its
        # last hand-over is never listed again (a new group's first activation replaces
        # it), so those are swept only when they outnumber the groups.
        for gid in [g for g in self._pending if g not in state.groups]:
            del self._pending[gid]
        if len(self._last) > 2 * len(state.groups) + 64:
            self._last = {g: h for g, h in self._last.items() if g in state.groups}

    def _activated(self, change: ActivationChange, now: float, monotonic: float) -> None:
        self.activations += 1
        start = self._pending.pop(change.group, None)
        if start is None:
            handover = Handover(now, change.replaced, change.consumer, change.reason)
        else:
            duration = max(0.0, monotonic - start.at)
            handover = Handover(now, start.from_consumer, change.consumer, start.reason, duration)
            self._observe(duration)
        self._last[change.group] = handover

    def _observe(self, duration: float) -> None:
        self._bucket_counts[bisect.bisect_left(HANDOVER_BUCKETS, duration)] += 1
        self._count += 1
        self._sum += duration

    def last_handovers(self) -> Mapping[GroupId, Handover]:
        """Each group's last hand-over seen by this coordinator (a copy)."""
        return dict(self._last)

    def histogram(self) -> HandoverHistogram:
        """The durations so far, with cumulative bucket counts."""
        cumulative, total = [], 0
        for bound, n in zip(HANDOVER_BUCKETS, self._bucket_counts, strict=True):
            total += n
            cumulative.append((bound, total))
        return HandoverHistogram(tuple(cumulative), self._count, self._sum)


def _log(change: ActivationChange) -> None:
    gid, consumer = change.group, change.consumer
    logger.info(
        "Activation: consumer %s %s in group %r of stream %r (namespace %r, partition %d): %s",
        consumer,
        change.event.value.replace("_", " "),
        gid.name,
        gid.stream,
        gid.namespace,
        change.partition_index,
        change.reason.value.replace("_", " "),
        extra={
            "event": "activation",
            "change": change.event.value,
            "group": gid.name,
            "stream": gid.stream,
            "namespace": gid.namespace,
            "partition": change.partition_index,
            "consumer": str(consumer),
            "connection": consumer.connection,
            "subscription_id": consumer.subscription_id,
            "owner": consumer.owner,
            "reason": change.reason.value,
        },
    )
