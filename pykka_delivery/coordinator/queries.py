"""Read-only views of the coordinator's state, for listings and the shell's sweeps."""

from __future__ import annotations

from dataclasses import dataclass

from pykka_delivery.coordinator.commands import UpdateSettings
from pykka_delivery.coordinator.state import (
    Consumer,
    CoordinatorSettings,
    CoordinatorState,
    GroupId,
    StreamId,
)

__all__ = [
    "GroupInfo",
    "StreamInfo",
    "list_groups",
    "list_nodes",
    "list_streams",
    "settings_change",
]


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """One group as listed.

    Attributes:
        group: its key.
        partition_index: -1 for a simple group, else the partition's index.
        consumers: in the group's order; each has ``label`` (``"active (connected)"``).
    """

    group: GroupId
    partition_index: int
    consumers: tuple[Consumer, ...]


def list_groups(state: CoordinatorState, namespace: str | None = None) -> tuple[GroupInfo, ...]:
    """Every group (of ``namespace``, if given), sorted by key, with its consumers."""
    return tuple(
        GroupInfo(gid, group.partition_index, group.consumers)
        for gid, group in sorted(state.groups.items())
        if namespace is None or gid.namespace == namespace
    )


@dataclass(frozen=True, slots=True)
class StreamInfo:
    """One stream of the catalog as listed: its key and its partition count."""

    stream: StreamId
    partitions: int


def list_streams(state: CoordinatorState, namespace: str | None = None) -> tuple[StreamInfo, ...]:
    """Every stream of the catalog (of ``namespace``, if given), sorted by key."""
    return tuple(
        StreamInfo(sid, partitions)
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
