"""Activation changes: who became active, stepped down or went away, and why. Pure.

The machine decides; this module only reads what it decided. `activation_changes`
compares a group before and after one command and names each change of a consumer's
part (activated, stepping down, deactivated, disconnected, reconnected) with its
reason, derived from the command and the consumer's status. It reads no clock: the
shell (`handovers.HandoverBook`) stamps the changes with its own time, logs them and
turns them into hand-overs and statistics. Keeping this out of the machine's state keeps
the command log and its replay exactly as they were.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pykka_delivery.coordinator.commands import (
    ActivateConsumer,
    Command,
    ConnectionDown,
    ConnectionLost,
    ConnectionReconnected,
    DisconnectedTimeout,
    EvaluateGroup,
    PurgeStaleConnections,
    RegisterConsumer,
    UnregisterConsumer,
)
from pykka_delivery.coordinator.state import (
    Activity,
    Connectivity,
    Consumer,
    CoordinatorState,
    Group,
    GroupId,
    changed_group_ids,
)

__all__ = [
    "ActivationChange",
    "ActivationEvent",
    "ConsumerId",
    "Handover",
    "HandoverReason",
    "activation_changes",
]


class HandoverReason(enum.Enum):
    """Why a consumer's part in its group changed (the ``reason`` of a log line and of
    a `Handover`)."""

    REGISTERED = "registered"
    """A consumer registered: the group's first, or a simple group had no active one."""
    REBALANCED = "rebalanced"
    """A partitioned group's members changed, so its active consumer was told to step
    down for the one its rule now chooses."""
    STEPPED_DOWN = "stepped_down"
    """The consumer told to step down answered (or an operator's anonymous activate)."""
    UNREGISTERED = "unregistered"
    """The active consumer unregistered (left its group)."""
    CONNECTION_CLOSED = "connection_closed"
    """The active consumer's connection closed with a goodbye (its consumers left)."""
    CONNECTION_LOST = "connection_lost"
    """The active consumer's connection was lost: its group waits for it to return or
    to be presumed down."""
    PRESUMED_DOWN = "presumed_down"
    """A lost connection stayed away for the coordinator's ``disconnected_timeout``."""
    RECONNECTED = "reconnected"
    """A lost connection came back (a presumed-down active consumer is told to step
    down: its group chose another)."""
    PURGED = "purged"
    """The stale-connection sweep removed the consumer's connection."""
    EVALUATED = "evaluated"
    """An operator's `EvaluateGroup` dropped disconnected consumers."""
    UNKNOWN = "unknown"
    """A reason a newer coordinator sent that this client does not know."""


class ActivationEvent(enum.Enum):
    """What happened to one consumer's part in its group."""

    ACTIVATED = "activated"
    """It was made the group's active consumer and told so."""
    STEPPING_DOWN = "stepping_down"
    """It was told to step down; the next one starts once it answers."""
    DEACTIVATED = "deactivated"
    """It no longer counts as active: it stepped down, left, or was presumed down."""
    DISCONNECTED = "disconnected"
    """Its connection was lost while it counted as active: its group waits for it."""
    RECONNECTED = "reconnected"
    """Its connection came back while it still counted as active."""


@dataclass(frozen=True, slots=True)
class ConsumerId:
    """A consumer as listings and logs name it.

    Attributes:
        connection: the connection that registered it.
        subscription_id: unique within the connection.
        owner: the connection's label (may be empty).
    """

    connection: str
    subscription_id: int
    owner: str = ""

    @classmethod
    def of(cls, consumer: Consumer) -> ConsumerId:
        return cls(consumer.connection, consumer.subscription_id, consumer.owner)

    def __str__(self) -> str:
        where = f"{self.connection}/{self.subscription_id}"
        return f"{where} ({self.owner})" if self.owner else where


@dataclass(frozen=True, slots=True)
class Handover:
    """A group's last hand-over: its active consumer changed (or it got its first).

    Attributes:
        at: wall-clock seconds (the coordinator's clock) when ``to_consumer`` was
            activated.
        from_consumer: the consumer that was active before; None for a group's first
            active consumer, or when the coordinator restarted during the hand-over.
        to_consumer: the consumer activated.
        reason: why the hand-over began: the change that took ``from_consumer`` out
            (`HandoverReason.REBALANCED`, ``UNREGISTERED``, ``CONNECTION_CLOSED``,
            ``PRESUMED_DOWN``, ...), or ``REGISTERED`` for a first consumer.
        duration: seconds from the coordinator's decision (the step-down sent, the
            active consumer presumed down or gone) to the activation; 0 when both came
            with one command, or when the coordinator did not see the decision (a first
            consumer, a restart in between).
    """

    at: float
    from_consumer: ConsumerId | None
    to_consumer: ConsumerId
    reason: HandoverReason
    duration: float = 0.0


@dataclass(frozen=True, slots=True)
class ActivationChange:
    """One change of one consumer's part in its group, as `activation_changes` finds it.

    Attributes:
        group: the group's key.
        partition_index: the group's partition index (-1 for a simple group).
        consumer: the consumer whose part changed.
        event: what happened to it.
        reason: why.
        replaced: for `ActivationEvent.ACTIVATED`, the consumer that counted as active
            before the command (None if there was none); else None.
    """

    group: GroupId
    partition_index: int
    consumer: ConsumerId
    event: ActivationEvent
    reason: HandoverReason
    replaced: ConsumerId | None = None


# The reason a command gives to the activations and deactivations it causes.
_REASONS: dict[type, HandoverReason] = {
    RegisterConsumer: HandoverReason.REGISTERED,
    UnregisterConsumer: HandoverReason.UNREGISTERED,
    ActivateConsumer: HandoverReason.STEPPED_DOWN,
    ConnectionDown: HandoverReason.CONNECTION_CLOSED,
    ConnectionLost: HandoverReason.CONNECTION_LOST,
    DisconnectedTimeout: HandoverReason.PRESUMED_DOWN,
    ConnectionReconnected: HandoverReason.RECONNECTED,
    PurgeStaleConnections: HandoverReason.PURGED,
    EvaluateGroup: HandoverReason.EVALUATED,
}


def activation_changes(
    before: CoordinatorState, after: CoordinatorState, command: Command
) -> list[ActivationChange]:
    """The activation changes ``command`` made, taking ``before`` to ``after``.

    Only groups whose record changed are compared (the machine keeps untouched groups
    as they were), in key order; within a group, consumers that stopped counting as
    active come first, so a hand-over reads in order.
    """
    reason = _REASONS.get(type(command))
    if reason is None:
        return []  # settings, the catalog, Recover: no consumer changes its part
    b, a = before.groups, after.groups
    changes: list[ActivationChange] = []
    for gid in sorted(changed_group_ids(b, a)):
        changes += _group_changes(gid, b.get(gid), a.get(gid), reason)
    return changes


def _group_changes(
    gid: GroupId, before: Group | None, after: Group | None, reason: HandoverReason
) -> list[ActivationChange]:
    if before == after:
        return []
    group = after if after is not None else before
    assert group is not None
    was_there = () if before is None else before.consumers
    is_there = () if after is None else after.consumers
    # A consumer the machine kept as it was (the same object) did not change: only the
    # others are keyed and compared (a registration changes one of the group's).
    kept = set(map(id, was_there)).intersection(map(id, is_there))
    old = {c.key: c for c in was_there if id(c) not in kept}
    new = {c.key: c for c in is_there if id(c) not in kept}
    replaced = None if before is None else before.active()

    def change(
        c: Consumer, event: ActivationEvent, why: HandoverReason = reason
    ) -> ActivationChange:
        was = ConsumerId.of(replaced) if event is _ACTIVATED and replaced is not None else None
        return ActivationChange(gid, group.partition_index, ConsumerId.of(c), event, why, was)

    endings = [
        change(c, _DEACTIVATED) for k, c in old.items() if k not in new and c.counts_as_active
    ]
    others: list[ActivationChange] = []
    for key, now in new.items():
        was = old.get(key)
        event, why = _event(was, now, reason)
        if event is _DEACTIVATED:
            endings.append(change(now, event, why))
        elif event is not None:
            others.append(change(now, event, why))
    return endings + others


_ACTIVATED = ActivationEvent.ACTIVATED
_DEACTIVATED = ActivationEvent.DEACTIVATED


def _event(
    was: Consumer | None, now: Consumer, reason: HandoverReason
) -> tuple[ActivationEvent | None, HandoverReason]:
    """The change of one consumer present after the command (None: no change)."""
    if now.activity is Activity.ACTIVE and now.is_connected:
        if was is None or not was.counts_as_active or was.activity is not Activity.ACTIVE:
            return _ACTIVATED, reason  # new, waiting, stepping down or presumed down before
        if not was.is_connected:
            return ActivationEvent.RECONNECTED, HandoverReason.RECONNECTED
        return None, reason
    if was is None:
        return None, reason
    if was.connectivity is Connectivity.PRESUMED_DOWN and was.activity is Activity.ACTIVE:
        if now.is_connected:
            # Back after its group chose another: told to step down, it may still consume.
            return ActivationEvent.STEPPING_DOWN, HandoverReason.RECONNECTED
        return None, reason
    if not was.counts_as_active:
        return None, reason
    if not now.counts_as_active:
        return _DEACTIVATED, reason
    if was.activity is Activity.ACTIVE and now.activity is Activity.DEACTIVATING:
        return ActivationEvent.STEPPING_DOWN, HandoverReason.REBALANCED
    if was.is_connected and not now.is_connected:
        return ActivationEvent.DISCONNECTED, HandoverReason.CONNECTION_LOST
    if not was.is_connected and now.is_connected:
        return ActivationEvent.RECONNECTED, HandoverReason.RECONNECTED
    return None, reason
