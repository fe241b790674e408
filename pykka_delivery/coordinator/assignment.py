"""Sticky partition assignment, pure: which member should own each partition of a group.

The partitions of one partitioned consumer group (one coordinator group per partition,
docs/partitions.md) are shared by its members. RabbitMQ's rule gives partition ``i`` to
``eligible[i % len(eligible)]``, so a join or a leave moves about every partition. The
sticky rule (Kafka's cooperative-sticky idea, Runnel's incremental rebalance) moves only
what balance needs:

* each member's target size is the fair share, ``n // m`` or one more; the larger sizes go
  to the members holding the most now (ties: the members' order), which keeps the most;
* a member keeps its partitions up to its target size (its lowest indices first);
* the partitions left over (no owner, an owner gone, or an owner's excess) go to the
  members below their target, in the members' order, lowest partition first.

The result is balanced (sizes differ by at most one), deterministic (no hashing, ties by
order) and moves the fewest partitions any balanced assignment can: those of departed
owners plus the excess of the members above their target.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TypeVar

__all__ = ["PARTITION_ASSIGNMENTS", "moved_count", "sticky_assignment"]

PARTITION_ASSIGNMENTS = ("sticky", "modulo")
"""The values of `CoordinatorSettings.partition_assignment`."""

M = TypeVar("M", bound=Hashable)


def sticky_assignment(
    partitions: Sequence[int], members: Sequence[M], owners: Mapping[int, M]
) -> dict[int, M]:
    """The target owner of every partition in ``partitions``.

    Args:
        partitions: the partition indices of the group, each once.
        members: the members that may own partitions, each once, in the deterministic
            order that breaks ties.
        owners: the current owner of some partitions; an owner not in ``members`` has
            gone, and its partitions move.

    Returns:
        partition -> member for every partition; empty when there is no member.
    """
    if not members:
        return {}
    order = {member: rank for rank, member in enumerate(members)}
    held: dict[M, list[int]] = {member: [] for member in members}
    free: list[int] = []
    for partition in sorted(partitions):
        owner = owners.get(partition)
        if owner is not None and owner in held:
            held[owner].append(partition)
        else:
            free.append(partition)
    base, extra = divmod(len(partitions), len(members))
    # The larger targets go to those holding the most: that keeps the most in place.
    by_load = sorted(members, key=lambda member: (-len(held[member]), order[member]))
    target = {member: base + (1 if rank < extra else 0) for rank, member in enumerate(by_load)}
    result: dict[int, M] = {}
    for member in members:
        kept = held[member][: target[member]]
        free.extend(held[member][target[member] :])
        result.update((partition, member) for partition in kept)
    free.sort()
    taken = 0
    for member in members:
        want = target[member] - min(len(held[member]), target[member])
        for partition in free[taken : taken + want]:
            result[partition] = member
        taken += want
    return result


def moved_count(owners: Mapping[int, Hashable], targets: Mapping[int, Hashable]) -> int:
    """How many partitions that have an owner get another one in ``targets``."""
    return sum(1 for partition, owner in owners.items() if targets.get(partition, owner) != owner)
