"""The sticky partition assignment (coordinator/assignment.py): balanced, sticky, minimal."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pykka_delivery.coordinator.assignment import moved_count, sticky_assignment


def modulo_assignment(partitions: int, members: list[str]) -> dict[int, str]:
    return {p: members[p % len(members)] for p in range(partitions)}


def minimum_moves(owners: dict[int, str], members: list[str], partitions: int) -> int:
    """Partitions of departed owners plus the excess of members above a balanced target,
    the larger targets given to the largest holders (no balanced assignment does better)."""
    departed = sum(1 for owner in owners.values() if owner not in members)
    loads = sorted((sum(1 for o in owners.values() if o == m) for m in members), reverse=True)
    base, extra = divmod(partitions, len(members))
    targets = [base + 1] * extra + [base] * (len(members) - extra)
    return departed + sum(max(0, load - t) for load, t in zip(loads, targets, strict=True))


def test_a_third_member_joining_two_on_eight_partitions_moves_exactly_two() -> None:
    owners = sticky_assignment(range(8), ["a", "b"], {})
    targets = sticky_assignment(range(8), ["a", "b", "c"], owners)
    assert moved_count(owners, targets) == 2


def test_the_modulo_rule_moves_more_than_two_for_the_same_join() -> None:
    before, after = modulo_assignment(8, ["a", "b"]), modulo_assignment(8, ["a", "b", "c"])
    assert moved_count(before, after) > 2


def test_a_partition_keeps_its_owner_when_the_group_is_already_balanced() -> None:
    owners = {0: "b", 1: "a", 2: "b", 3: "a"}
    assert sticky_assignment(range(4), ["a", "b"], owners) == owners


def test_partitions_of_a_departed_owner_go_to_the_members_below_their_share() -> None:
    owners = {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}
    targets = sticky_assignment(range(6), ["a", "b"], owners)
    assert sorted(targets.values()).count("a") == 3
    assert {p: targets[p] for p in (0, 1, 3, 4)} == {0: "a", 1: "b", 3: "a", 4: "b"}


def test_the_larger_share_goes_to_the_member_holding_more_whatever_its_order() -> None:
    owners = {0: "a", 1: "a", 2: "b", 3: "b", 4: "b"}
    assert sticky_assignment(range(5), ["a", "b"], owners) == owners


def test_ties_are_broken_by_the_members_order() -> None:
    assert sticky_assignment(range(3), ["b", "a"], {}) == {0: "b", 1: "b", 2: "a"}


def test_no_member_assigns_nothing() -> None:
    assert sticky_assignment(range(4), [], {0: "a"}) == {}


_steps = st.lists(st.tuples(st.booleans(), st.integers(0, 63)), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(partitions=st.integers(1, 64), steps=_steps)
def test_any_sequence_of_joins_and_leaves_stays_balanced_and_moves_the_minimum(
    partitions: int, steps: list[tuple[bool, int]]
) -> None:
    members: list[str] = []
    owners: dict[int, str] = {}
    joined = 0
    for join, pick in steps:
        if join or not members:
            members.append(f"m{joined}")
            joined += 1
        else:
            members.pop(pick % len(members))
        if not members:
            owners = {}
            continue
        targets = sticky_assignment(range(partitions), members, owners)
        assert sorted(targets) == list(range(partitions))
        sizes = [sum(1 for o in targets.values() if o == m) for m in members]
        assert max(sizes) - min(sizes) <= 1
        assert moved_count(owners, targets) == minimum_moves(owners, members, partitions)
        assert targets == sticky_assignment(range(partitions), members, owners)
        owners = targets
