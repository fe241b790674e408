"""The sticky rule in the coordinator's state: a partition's consumer from its siblings.

A partitioned consumer group is one coordinator group per partition, keyed
``GroupId(namespace, partition_stream(stream, i), name)`` with partition index ``i``
(docs/partitions.md); its siblings are the groups of the same namespace, consumer name and
base stream (`stream_rules.base_stream`). A member is identified across them by its
connection and its rank among that connection's consumers in each group (a process with
two members of one group registers them in the same order everywhere). The members are
the connected ones, ordered as they first appear in the siblings, lowest partition first;
the owners are the consumers that count as active. `assignment.sticky_assignment` then
gives each partition its target. Read-only: machine.py makes every transition.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from pykka_delivery.coordinator.assignment import sticky_assignment
from pykka_delivery.coordinator.state import (
    Activity,
    Connectivity,
    Consumer,
    CoordinatorState,
    Group,
    GroupId,
    StreamId,
)
from pykka_delivery.coordinator.stream_rules import base_stream, partition_stream

__all__ = ["off_target", "sticky_choice"]

_CONNECTED = Connectivity.CONNECTED
_PRESUMED_DOWN = Connectivity.PRESUMED_DOWN
_WAITING = Activity.WAITING

_Member = tuple[str, int]  # (connection, rank among the connection's consumers in a group)
_Keyed = list[tuple[Consumer, _Member]]


def _keyed(group: Group) -> _Keyed:
    consumers = group.consumers
    connections = [c.connection for c in consumers]
    if len(set(connections)) == len(connections):  # the usual case: one member a process
        return list(zip(consumers, [(c, 0) for c in connections], strict=True))
    ranks: dict[str, int] = {}
    out: _Keyed = []
    for c in group.consumers:
        rank = ranks.get(c.connection, 0)
        ranks[c.connection] = rank + 1
        out.append((c, (c.connection, rank)))
    return out


def _siblings(state: CoordinatorState, gid: GroupId, group: Group) -> dict[int, Group]:
    """The groups of every partition of ``gid``'s partitioned group, ``group`` for its own
    (the version being built), by partition index."""
    own = group.partition_index
    base = base_stream(gid.stream, own)
    count = max(state.streams.get(StreamId(gid.namespace, base), 0), own + 1)
    found: dict[int, Group] = {}
    index = 0
    # Up to the catalog's count, and past it while groups follow (a stream not in it).
    while index < count or index - 1 in found:
        if index == own:
            found[index] = group
        else:
            sibling = state.groups.get(
                GroupId(gid.namespace, partition_stream(base, index), gid.name)
            )
            if sibling is not None and sibling.partition_index == index:
                found[index] = sibling
        index += 1
    return found


class _Plan:
    """The sibling groups' members, owners and sticky targets, computed once."""

    __slots__ = ("keyed", "owners", "targets")

    def __init__(self, siblings: dict[int, Group]) -> None:
        self.keyed = {index: _keyed(g) for index, g in siblings.items()}
        members: dict[_Member, None] = {}
        self.owners: dict[int, _Member] = {}
        for index in sorted(self.keyed):
            for c, key in self.keyed[index]:
                if c.connectivity is _CONNECTED:
                    members[key] = None
                if c.activity is not _WAITING and c.connectivity is not _PRESUMED_DOWN:
                    self.owners.setdefault(index, key)  # `Consumer.counts_as_active`
        self.targets = sticky_assignment(list(self.keyed), list(members), self.owners)

    def target_in(self, index: int) -> Consumer | None:
        """The partition's target consumer, if it is connected in the partition's group."""
        target = self.targets.get(index)
        return next((c for c, key in self.keyed[index] if key == target and c.is_connected), None)


def sticky_choice(state: CoordinatorState, gid: GroupId, group: Group) -> Consumer | None:
    """The consumer that should be active in partitioned group ``group`` (stored, or to be
    stored, under ``gid``) by the sticky rule; `Group.chosen` decides for the modulo rule.

    A blocking consumer (DA, DD: decision D12) is chosen as under every rule. A target
    that is not connected in this partition's group (a member registering partition by
    partition) leaves a connected active consumer in place; with none, the connected
    consumer whose member owns the fewest partitions is chosen (ties: group order).
    """
    blocking = group.blocking()
    if blocking is not None:
        return blocking
    if not group.eligible():
        return None
    index = group.partition_index
    plan = _Plan(_siblings(state, gid, group))
    target = plan.target_in(index)
    if target is not None:
        return target
    current = group.active()
    if current is not None and current.is_connected:
        return current
    loads = Counter(plan.owners.values())
    ranked = [
        (loads[key], rank) for rank, (c, key) in enumerate(plan.keyed[index]) if c.is_connected
    ]
    return plan.keyed[index][min(ranked)[1]][0]


def off_target(state: CoordinatorState, gids: Iterable[GroupId]) -> list[GroupId]:
    """The sibling groups of the partitioned ``gids`` (themselves included) whose active
    consumer is connected, active and not its partition's connected target: a command
    changed one partition's group, and the assignment moved another's."""
    done: set[tuple[str, str, str]] = set()
    out: list[GroupId] = []
    for gid in gids:
        group = state.groups.get(gid)
        if group is None or not group.is_partitioned:
            continue
        family = (gid.namespace, base_stream(gid.stream, group.partition_index), gid.name)
        if family in done:
            continue
        done.add(family)
        siblings = _siblings(state, gid, group)
        plan = _Plan(siblings)
        for index, sibling in siblings.items():
            current = sibling.active()
            if (
                current is None
                or not current.is_connected
                or current.activity is not Activity.ACTIVE
            ):
                continue
            target = plan.target_in(index)
            if target is not None and target.key != current.key:
                out.append(GroupId(gid.namespace, partition_stream(family[1], index), gid.name))
    return sorted(out)
