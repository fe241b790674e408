"""The watches and timer cancels that follow from a command's change of membership: the
machine adds them around the effects of every command but `Recover` (machine.py)."""

from __future__ import annotations

from collections.abc import Mapping

from pykka_delivery.coordinator.commands import Command, DisconnectedTimeout
from pykka_delivery.coordinator.effects import (
    CancelTimer,
    Effect,
    UnwatchConnection,
    WatchConnection,
)
from pykka_delivery.coordinator.state import CoordinatorState, Group, GroupId

__all__ = ["with_bookkeeping"]


def with_bookkeeping(
    before: CoordinatorState,
    after: CoordinatorState,
    command: Command,
    effects: list[Effect],
    changed: set[GroupId],
) -> list[Effect]:
    """Add the watches and timer cancels that follow from the change of membership.

    A connection is watched while it has consumers. Its disconnected timer is cancelled
    when it has no disconnected consumer left, unless that timer is the one firing now.
    ``changed``: the keys whose group differs between ``before`` and ``after``
    (`changed_group_ids`, which the machine has already computed).
    """
    # Only the groups the command replaced can change membership or connectivity, and
    # only connections found in them need a look at the others: a registration costs a
    # scan of its own group, not of every consumer (bench/coordinator.py).
    b, a = before.groups, after.groups
    if not changed:
        return effects

    def in_changed(groups: Mapping[GroupId, Group], disconnected: bool) -> set[str]:
        return {
            c.connection
            for gid in changed
            if (g := groups.get(gid)) is not None
            for c in g.consumers
            if not disconnected or c.is_disconnected
        }

    def elsewhere(connection: str, disconnected: bool) -> bool:
        """``connection`` has a (disconnected) consumer in a group the command left alone."""
        return any(
            c.connection == connection and (not disconnected or c.is_disconnected)
            for gid, g in a.items()
            if gid not in changed
            for c in g.consumers
        )

    old, new = in_changed(b, False), in_changed(a, False)
    watched = [c for c in sorted(new - old) if not elsewhere(c, False)]
    unwatched = [c for c in sorted(old - new) if not elsewhere(c, False)]
    fired = command.connection if isinstance(command, DisconnectedTimeout) else None
    settled = [
        c
        for c in sorted(in_changed(b, True) - in_changed(a, True))
        if c != fired and not elsewhere(c, True)
    ]
    return [
        *(WatchConnection(c) for c in watched),
        *effects,
        *(CancelTimer(DisconnectedTimeout(c)) for c in settled),
        *(UnwatchConnection(c) for c in unwatched),
    ]
