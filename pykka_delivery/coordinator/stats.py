"""`CoordinatorStats`: the coordinator actor's counters, gauges and hand-over histogram.

A frozen snapshot made on request (`snapshot`): the counters are kept as the actor goes,
the gauges are counted from the state when asked (a walk over every consumer, per read,
never per command), the histogram comes from the `handovers.HandoverBook`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from pykka_delivery.coordinator.state import Activity, Connectivity, CoordinatorState

__all__ = [
    "COUNTERS",
    "HANDOVER_BUCKETS",
    "CoordinatorStats",
    "HandoverHistogram",
    "snapshot",
]

HANDOVER_BUCKETS: tuple[float, ...] = (
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    math.inf,
)
"""Upper bounds (seconds) of the hand-over duration histogram's buckets; the last is
+inf."""


@dataclass(frozen=True, slots=True)
class HandoverHistogram:
    """Hand-over durations so far, as a Prometheus histogram keeps them.

    Attributes:
        buckets: ``(upper bound in seconds, cumulative count)`` pairs, one per bound of
            `HANDOVER_BUCKETS`; the last bound is ``math.inf`` and its count is ``count``.
        count: hand-overs timed: those whose beginning the running coordinator saw (a
            step-down sent, an active consumer presumed down or gone), not a group's first
            activation.
        sum: their durations added up, in seconds.
    """

    buckets: tuple[tuple[float, int], ...] = tuple((b, 0) for b in HANDOVER_BUCKETS)
    count: int = 0
    sum: float = 0.0


@dataclass(frozen=True, slots=True)
class CoordinatorStats:
    """Counters and gauges of a `CoordinatorActor` since it started.

    Attributes:
        commands_applied: commands that changed the state (each one logged).
        commands_refused: commands the machine refused.
        updates_sent: consumer updates handed to a sink.
        updates_skipped: consumer updates for a connection with no sink attached (re-sent
            when it attaches).
        sink_failures: sinks whose ``send_update`` raised (their connection became lost).
        connections_purged: connections removed by the stale-connection sweep.
        listings_sent: service listings handed to a sink.
        groups: gauge: groups now (each has at least one consumer).
        consumers_active: gauge: connected consumers that are active or stepping down.
        consumers_waiting: gauge: connected consumers that wait.
        consumers_disconnected: gauge: consumers whose connection is lost and not yet
            presumed down (an active one among them blocks its group).
        consumers_presumed_down: gauge: consumers whose connection stayed lost past the
            ``disconnected_timeout``. The four consumer gauges add up to every consumer.
        rebalances: counter: activation changes, each time a consumer was made its
            group's active one (a group's first consumer included).
        handover_seconds: the hand-over durations: from the decision (the step-down sent,
            the active consumer presumed down or gone) to the next activation.
    """

    commands_applied: int = 0
    commands_refused: int = 0
    updates_sent: int = 0
    updates_skipped: int = 0
    sink_failures: int = 0
    connections_purged: int = 0
    listings_sent: int = 0
    groups: int = 0
    consumers_active: int = 0
    consumers_waiting: int = 0
    consumers_disconnected: int = 0
    consumers_presumed_down: int = 0
    rebalances: int = 0
    handover_seconds: HandoverHistogram = HandoverHistogram()


COUNTERS = (
    "commands_applied",
    "commands_refused",
    "updates_sent",
    "updates_skipped",
    "sink_failures",
    "connections_purged",
    "listings_sent",
)
"""The fields of `CoordinatorStats` the actor counts as it goes."""


def snapshot(
    counters: Mapping[str, int],
    state: CoordinatorState,
    rebalances: int,
    handover_seconds: HandoverHistogram,
) -> CoordinatorStats:
    """The statistics: ``counters`` (named as `COUNTERS`) and the gauges of ``state``."""
    active = waiting = disconnected = presumed_down = 0
    for group in state.groups.values():
        for c in group.consumers:
            if c.connectivity is Connectivity.DISCONNECTED:
                disconnected += 1
            elif c.connectivity is Connectivity.PRESUMED_DOWN:
                presumed_down += 1
            elif c.activity is Activity.WAITING:
                waiting += 1
            else:
                active += 1
    return CoordinatorStats(
        **counters,
        groups=len(state.groups),
        consumers_active=active,
        consumers_waiting=waiting,
        consumers_disconnected=disconnected,
        consumers_presumed_down=presumed_down,
        rebalances=rebalances,
        handover_seconds=handover_seconds,
    )
