"""`changed_group_ids`: the groups a command touched, found without hashing every key."""

from __future__ import annotations

from types import MappingProxyType

from pykka_delivery.coordinator import SIMPLE, GroupId, RegisterConsumer, apply, initial_state
from pykka_delivery.coordinator.state import Group, changed_group_ids


def _groups(n: int) -> dict[GroupId, Group]:
    state = initial_state()
    for g in range(n):
        state = apply(state, RegisterConsumer("ns", f"s{g}", "app", "c", 1, "n", SIMPLE)).state
    return dict(state.groups)


def test_a_replaced_group_is_changed_and_the_others_are_not() -> None:
    before = _groups(4)
    after = dict(before)
    gid = list(before)[1]
    after[gid] = Group(SIMPLE, consumers=before[gid].consumers)

    assert changed_group_ids(MappingProxyType(before), MappingProxyType(after)) == {gid}


def test_a_group_added_or_removed_last_is_changed() -> None:
    after = _groups(4)
    last = list(after)[3]
    before = {gid: g for gid, g in after.items() if gid != last}

    assert changed_group_ids(before, after) == {last}
    assert changed_group_ids(after, before) == {last}


def test_a_group_removed_before_others_is_changed() -> None:
    before = _groups(4)
    first, second = list(before)[:2]
    after = {gid: g for gid, g in before.items() if gid != first}

    assert changed_group_ids(before, after) == {first}
    assert changed_group_ids(after, before) == {first}
    assert second not in changed_group_ids(before, after)


def test_equal_keys_that_are_other_objects_compare_by_key() -> None:
    before = _groups(3)
    after = {GroupId(g.namespace, g.stream, g.name): v for g, v in before.items()}

    assert changed_group_ids(before, after) == set()
