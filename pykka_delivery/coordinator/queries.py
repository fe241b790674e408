"""Read-only views of the coordinator's state, for listings and the shell's sweeps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pykka_delivery.coordinator.activations import Handover
from pykka_delivery.coordinator.catalog_watch import StreamProducer
from pykka_delivery.coordinator.commands import UpdateSettings
from pykka_delivery.coordinator.state import (
    Consumer,
    CoordinatorSettings,
    CoordinatorState,
    GroupId,
    StreamId,
    active_of,
)

__all__ = [
    "GroupInfo",
    "StreamInfo",
    "list_groups",
    "list_nodes",
    "list_streams",
    "settings_change",
]


_DEFAULT_DISCONNECTED_TIMEOUT = CoordinatorSettings().disconnected_timeout


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One group as listed.

    Attributes:
        group: its key.
        partition_index: -1 for a simple group, else the partition's index.
        consumers: in the group's order; each has ``label`` (``"active (connected)"``)
            and, while disconnected, ``disconnected_at`` (the coordinator's wall clock).
        last_handover: the group's last change of active consumer seen by the running
            coordinator (None before the first one, and after a restart until the next).
        disconnected_timeout: the coordinator's `CoordinatorSettings.disconnected_timeout`:
            a disconnected consumer is presumed down about that long after its
            ``disconnected_at`` (no sooner than ``recovery_min_delay`` after a restart).
        listed_at: the coordinator's wall clock when it made the listing (0 if unknown),
            so durations are read on one clock: see `disconnected_for`, `presumed_down_in`.

    Equality compares the group, its partition index and its consumers only.
    """

    group: GroupId
    partition_index: int
    consumers: tuple[Consumer, ...]
    # Not compared: two listings of the same groups are equal whenever they were made.
    last_handover: Handover | None = field(default=None, compare=False)
    disconnected_timeout: float = field(default=_DEFAULT_DISCONNECTED_TIMEOUT, compare=False)
    listed_at: float = field(default=0.0, compare=False)

    def active(self) -> Consumer | None:
        """The consumer that counts as active (active or stepping down, not presumed
        down), if any."""
        return active_of(self.consumers)

    def disconnected_for(self, consumer: Consumer) -> float | None:
        """Seconds ``consumer`` had been disconnected when listed; None if it is not
        disconnected (connected, or presumed down already)."""
        if not consumer.is_disconnected:
            return None
        return max(0.0, self.listed_at - consumer.disconnected_at)

    def presumed_down_in(self, consumer: Consumer) -> float | None:
        """Seconds left, when listed, before ``consumer`` is presumed down (0 if due);
        None if it is not disconnected."""
        if not consumer.is_disconnected:
            return None
        due = consumer.disconnected_at + self.disconnected_timeout
        return max(0.0, due - self.listed_at)


def list_groups(
    state: CoordinatorState,
    namespace: str | None = None,
    *,
    handovers: Mapping[GroupId, Handover] | None = None,
    now: float = 0.0,
) -> tuple[GroupInfo, ...]:
    """Every group (of ``namespace``, if given), sorted by key, with its consumers.

    ``handovers`` gives each group's last hand-over (the shell keeps them), ``now`` the
    wall clock stamped as ``listed_at``.
    """
    handovers = handovers or {}
    timeout = state.settings.disconnected_timeout
    return tuple(
        GroupInfo(gid, group.partition_index, group.consumers, handovers.get(gid), timeout, now)
        for gid, group in sorted(state.groups.items())
        if namespace is None or gid.namespace == namespace
    )


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """One stream of the catalog as listed: its key, its partition count and its
    registered producers (sorted by name; none from an older server)."""

    stream: StreamId
    partitions: int
    producers: tuple[StreamProducer, ...] = ()


def list_streams(
    state: CoordinatorState,
    namespace: str | None = None,
    producers: Callable[[StreamId], tuple[StreamProducer, ...]] | None = None,
) -> tuple[StreamInfo, ...]:
    """Every stream of the catalog (of ``namespace``, if given), sorted by key, with the
    producers ``producers`` gives for it (the actor's `ProducerCatalog.producers`)."""
    return tuple(
        StreamInfo(sid, partitions, () if producers is None else producers(sid))
        for sid, partitions in sorted(state.streams.items())
        if namespace is None or sid.namespace == namespace
    )


def list_nodes(state: CoordinatorState) -> tuple[str, ...]:
    """The nodes hosting at least one consumer, sorted; the shell's stale-node sweep
    compares them with the nodes it knows and purges the others."""
    return tuple(sorted({c.node for g in state.groups.values() for c in g.consumers}))


def settings_change(state: CoordinatorState, wanted: CoordinatorSettings) -> UpdateSettings | None:
    """The command that brings the state's settings to ``wanted``, or None if they match
    (the shell checks its configuration periodically, as RabbitMQ's tick does)."""
    if state.settings == wanted:
        return None
    return UpdateSettings.of(wanted)
