"""The sticky rule in the coordinator machine (decision D14): the partitions of one
partitioned consumer group move only as balance needs, and always by step-down."""

from __future__ import annotations

import pytest

from pykka_delivery.coordinator import (
    ActivateConsumer,
    ConnectionDown,
    CoordinatorSettings,
    CoordinatorState,
    GroupId,
    RegisterConsumer,
    SendConsumerUpdate,
    UpdateSettings,
    apply,
    initial_state,
)
from pykka_delivery.coordinator.effects import Effect
from pykka_delivery.coordinator.store import decode_state, encode_state

PARTITIONS = 8


def gid(partition: int, stream: str = "orders", name: str = "app") -> GroupId:
    return GroupId("ns", f"{stream}-{partition}", name)


def register(member: str, partition: int, name: str = "app") -> RegisterConsumer:
    group = gid(partition, name=name)
    return RegisterConsumer(
        group.namespace, group.stream, group.name, member, partition, "n-" + member, partition
    )


def settle(state: CoordinatorState, effects: list[Effect]) -> CoordinatorState:
    """Answer every step-down as a member would, until none is pending."""
    pending = [e for e in effects if isinstance(e, SendConsumerUpdate) and not e.active]
    while pending:
        e = pending.pop(0)
        answer = ActivateConsumer(
            e.group.namespace,
            e.group.stream,
            e.group.name,
            e.connection,
            e.subscription_id,
            e.epoch,
        )
        outcome = apply(state, answer)
        state = outcome.state
        pending += [
            x for x in outcome.effects if isinstance(x, SendConsumerUpdate) and not x.active
        ]
    return state


def join(state: CoordinatorState, member: str, name: str = "app") -> CoordinatorState:
    """``member`` registers every partition (as a `GroupMember` does), step-downs answered."""
    for partition in range(PARTITIONS):
        outcome = apply(state, register(member, partition, name))
        state = settle(outcome.state, outcome.effects)
    return state


def owners(state: CoordinatorState, name: str = "app") -> dict[int, str]:
    out = {}
    for partition in range(PARTITIONS):
        group = state.groups.get(gid(partition, name=name))
        active = None if group is None else group.active()
        if active is not None:
            out[partition] = active.connection
    return out


def moved(before: dict[int, str], after: dict[int, str]) -> int:
    return sum(1 for p, owner in before.items() if after.get(p) != owner)


def two_members(assignment: str = "sticky") -> CoordinatorState:
    state = initial_state(CoordinatorSettings(partition_assignment=assignment))
    return join(join(state, "a"), "b")


def test_the_default_rule_is_sticky() -> None:
    assert CoordinatorSettings().partition_assignment == "sticky"


def test_a_third_member_joining_two_on_eight_partitions_moves_exactly_two() -> None:
    state = two_members()
    before = owners(state)

    after = owners(join(state, "c"))

    assert sorted(after.values()).count("c") == 2
    assert moved(before, after) == 2


def test_the_modulo_rule_moves_more_partitions_for_the_same_join() -> None:
    state = two_members("modulo")
    before = owners(state)

    after = owners(join(state, "c"))

    assert moved(before, after) > 2


def test_two_members_share_eight_partitions_four_each() -> None:
    assert sorted(owners(two_members()).values()) == ["a"] * 4 + ["b"] * 4


def test_a_join_steps_the_old_owner_down_and_activates_nobody_before_its_answer() -> None:
    state = two_members()
    for partition in range(PARTITIONS - 1):
        state = settle(*apply(state, register("c", partition))[::2])

    outcome = apply(state, register("c", PARTITIONS - 1))

    updates = [e for e in outcome.effects if isinstance(e, SendConsumerUpdate)]
    assert updates and all(not e.active for e in updates)
    group = outcome.state.groups[gid(PARTITIONS - 1)]
    active = group.active()
    assert active is not None and active.connection != "c"


def test_a_member_that_leaves_hands_only_its_own_partitions_over() -> None:
    state = join(two_members(), "c")
    before = owners(state)

    outcome = apply(state, ConnectionDown("c"))
    after = owners(settle(outcome.state, outcome.effects))

    assert {p: o for p, o in before.items() if o != "c"} == {
        p: o for p, o in after.items() if before[p] != "c"
    }
    assert sorted(after.values()) == ["a"] * 4 + ["b"] * 4


def test_another_consumer_name_on_the_same_stream_is_another_group_of_partitions() -> None:
    state = join(join(two_members(), "x", name="other"), "y", name="other")

    assert sorted(owners(state, "other").values()) == ["x"] * 4 + ["y"] * 4
    assert sorted(owners(state).values()) == ["a"] * 4 + ["b"] * 4


def test_an_unknown_partition_assignment_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="partition_assignment must be one of 'sticky', 'modulo'"):
        CoordinatorSettings(partition_assignment="round-robin")


def test_update_settings_carries_the_partition_assignment() -> None:
    settings = CoordinatorSettings(partition_assignment="modulo")

    assert UpdateSettings.of(settings).settings() == settings


def test_a_snapshot_keeps_the_partition_assignment() -> None:
    state = initial_state(CoordinatorSettings(partition_assignment="modulo"))

    assert decode_state(encode_state(state)).settings.partition_assignment == "modulo"


def test_a_snapshot_written_before_the_setting_existed_loads_as_sticky() -> None:
    data = encode_state(initial_state())
    del data["settings"]["partition_assignment"]

    assert decode_state(data).settings.partition_assignment == "sticky"


def test_a_leave_moves_an_over_full_members_partition_in_a_group_the_leave_did_not_touch() -> None:
    """c, waiting in partition 0 only, counted as a member with a share of one: a keeps two
    partitions until c leaves, then its excess (partition 2) goes to b, waiting there."""
    state = initial_state()
    for member, partition in (("d", 0), ("a", 2), ("a", 1), ("c", 0), ("b", 2)):
        state = apply(state, register(member, partition)).state

    outcome = apply(state, ConnectionDown("c"))

    updates = [e for e in outcome.effects if isinstance(e, SendConsumerUpdate)]
    assert [(e.connection, e.group, e.active) for e in updates] == [("a", gid(2), False)]
    assert owners(settle(outcome.state, outcome.effects)) == {0: "d", 1: "a", 2: "b"}


def test_two_members_on_one_connection_are_told_apart_by_their_registration_order() -> None:
    state = initial_state()
    for subscription_base in (0, 10):  # two GroupMembers of one process, one client
        for partition in range(PARTITIONS):
            group = gid(partition)
            command = RegisterConsumer(
                group.namespace,
                group.stream,
                group.name,
                "p",
                subscription_base + partition,
                "n-p",
                partition,
            )
            outcome = apply(state, command)
            state = settle(outcome.state, outcome.effects)

    actives = [state.groups[gid(p)].active() for p in range(PARTITIONS)]
    subscriptions = sorted(c.subscription_id // 10 for c in actives if c is not None)
    assert subscriptions == [0] * 4 + [1] * 4
