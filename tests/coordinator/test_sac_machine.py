"""rabbit_stream_sac_coordinator_SUITE, ported to the pure coordinator machine.

Each original test (shared/reference/rabbitmq-sac.md, section 4) is ported with its setup
and its expectations: the whole state (every group, its consumers in order with their
status) and the exact effect list after each step. As in the original, groups are built
directly (``grp``, ``csr``) and commands are applied with `apply`; ``view`` prints a state
as ``{group: ["connection/subscription STATUS", ...]}`` (timestamps ignored, as the
original ignores ``ts``). Status codes: C/D/P (connected, disconnected, presumed down)
followed by A/W/D (active, waiting, deactivating).

Differences in what is asserted, everywhere:

* Monitors are `WatchConnection` / `UnwatchConnection` effects, emitted when a connection
  gets its first consumer or loses its last one; ``ensure_monitors`` has no counterpart.
  They appear in the exact effect lists.
* A disconnected timer that is no longer needed is cancelled (`CancelTimer`).
* There is no reverse index (``pids_groups``); a connection's groups are derived from the
  groups. Where the original asserts the index, we assert the derived view.
* No machine versions: one behaviour, RabbitMQ's current one (v8) except where
  docs/coordinator.md ("Decisions") says otherwise.

Original test -> test here:

1. check_conf_test -> test_settings_change_is_none_only_when_settings_match
   (the "conf without the key" and "not a state record" cases cannot occur: settings are a
   typed record)
2. simple_sac_test -> test_simple_group_first_registered_is_active_and_next_takes_over
3. super_stream_partition_sac_test -> test_partitioned_group_hands_over_through_step_down
4. super_stream_partition_sac_re_notifies_stepping_down_consumer_re_selected_as_active_test
   -> test_activate_notifies_a_stepping_down_consumer_chosen_again
5. ensure_monitors_test -> test_connection_is_watched_while_it_has_consumers
6. handle_connection_down_sac_should_get_activated_test
   -> test_connection_down_of_active_activates_next_in_simple_group
7. handle_connection_down_sac_active_does_not_change_test
   -> test_connection_down_of_waiting_keeps_active_in_simple_group
8. handle_connection_down_sac_no_more_consumers_test
   -> test_connection_down_of_last_connection_deletes_group
9. handle_connection_down_sac_no_consumers_in_down_connection_test
   -> test_connection_down_of_connection_without_consumers_changes_nothing
   (a spurious index entry cannot exist: there is no index)
10. handle_connection_down_super_stream_active_stays_test
    -> test_connection_down_keeps_active_still_chosen_in_partitioned_group
11. handle_connection_down_super_stream_active_changes_test
    -> test_connection_down_steps_down_active_no_longer_chosen
12. handle_connection_down_super_stream_activate_in_remaining_connection_test
    -> test_connection_down_of_active_activates_chosen_in_partitioned_group
13. handle_connection_down_super_stream_no_active_removed_or_present_test
    -> test_connection_down_without_active_changes_no_status_in_partitioned_group
14. register_consumer_with_different_partition_index_should_return_error_test
    -> test_register_with_conflicting_partition_index_is_refused
15. handle_connection_down_consumers_from_dead_connection_should_be_filtered_out_test
    -> test_connection_down_twice_activates_the_remaining_consumer
16. import_state_v4_empty_test -> not applicable: there is no earlier state format to
    import; a restarted coordinator replays its command log from the empty state
    (test_sac_stateful.py::test_replaying_a_command_log_rebuilds_the_same_state)
17. import_state_v4_test -> not applicable, as 16
18. handle_connection_node_disconnected_test
    -> test_connection_lost_makes_consumers_disconnected_and_starts_timer
19. handle_node_reconnected_test -> test_node_reconnected_checks_each_connection_of_the_node
20. handle_node_reconnected_v8_test
    -> test_node_reconnected_checks_a_connection_once_whatever_its_groups
21. connection_reconnected_simple_disconnected_becomes_connected_test
    -> test_reconnected_disconnected_active_is_active_again
22. connection_reconnected_v8_apply_matches_v7_test
    -> test_reconnected_touches_only_groups_of_the_connection
23. connection_reconnected_v8_ensure_monitors_skips_rebuild_test
    -> test_reconnected_connected_connection_changes_nothing
24. connection_reconnected_simple_active_should_be_first_test
    -> test_reconnected_simple_group_moves_active_to_front
25. connection_reconnected_super_disconnected_becomes_connected_test
    -> test_reconnected_partitioned_group_steps_down_active_no_longer_chosen
26. presume_conn_down_simple_disconnected_becomes_presumed_down_test
    -> test_timeout_presumes_down_and_activates_next_in_simple_group
27. presume_conn_down_super_stream_disconnected_becomes_presumed_down_test
    -> test_timeout_presumes_down_and_activates_chosen_in_partitioned_group
28. presume_conn_down_simple_connected_does_not_become_presumed_down_test
    -> test_stale_timeout_leaves_connected_consumers_in_simple_group
29. presume_conn_down_super_stream_connected_does_not_become_presumed_down_test
    -> test_stale_timeout_leaves_connected_consumers_in_partitioned_group
30. register_consumer_simple_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_activation_on_register_in_simple_group
31. register_consumer_super_stream_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_register_in_partitioned_group
32. unregister_active_consumer_should_not_select_disconnected_consumer (never run in the
    original: no ``_test`` suffix) -> test_unregister_active_does_not_choose_a_disconnected_consumer
33. unregister_consumer_simple_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_unregister_in_simple_group
34. unregister_consumer_super_stream_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_unregister_in_partitioned_group
35. activate_consumer_simple_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_activate_in_simple_group
36. active_consumer_super_stream_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_activate_in_partitioned_group
37. activate_consumer_simple_unblock_all_waiting_test
    -> test_activate_unblocks_all_waiting_simple_group
38. activate_consumer_simple_unblock_ignore_disconnected_test
    -> test_activate_skips_disconnected_consumers_in_simple_group
39. activate_consumer_super_stream_unblock_all_waiting_test
    -> test_activate_unblocks_all_waiting_partitioned_group
40. activate_consumer_super_stream_unblock_ignore_disconnected_test
    -> test_activate_skips_disconnected_consumers_in_partitioned_group
41. handle_connection_down_simple_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_connection_down_in_simple_group
42. handle_connection_down_super_stream_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_connection_down_in_partitioned_group
43. handle_connection_node_disconnected_simple_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_connection_lost_in_simple_group
44. handle_connection_node_disconnected_super_stream_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_connection_lost_in_partitioned_group
45. handle_connection_node_disconnected_deactivating_triggers_rebalance_test
    -> test_connection_lost_of_deactivating_consumer_blocks_partitioned_group_until_its_timer
    (the expectation differs by decision D12: RabbitMQ v6 makes the lost CD waiting and
    activates p2 at once; we keep it deactivating, disconnected, and p2 is activated when
    its timer fires, with the state RabbitMQ reaches at once)
46. handle_connection_node_disconnected_simple_deactivating_triggers_rebalance_test
    -> test_connection_lost_of_deactivating_consumer_blocks_simple_group_until_its_timer
    (differs by D12, as 45)
47. handle_connection_down_deactivating_triggers_rebalance_test
    -> test_connection_down_of_deactivating_consumer_activates_chosen
48. handle_connection_node_disconnected_multiple_one_deactivating_test
    -> test_connection_lost_with_several_consumers_one_deactivating
    (differs by D12, as 45)
49. handle_connection_node_disconnected_deactivating_then_reconnect_test
    -> test_deactivating_consumer_lost_then_reconnected_then_late_activate
    (differs by D12: RabbitMQ activates p2 on the loss, steps it down on the reconnect and
    re-activates p1 on the late answer; we activate nobody on the loss, tell p1 to step
    down again on the reconnect, and its answer re-activates it: the same end state,
    with no second consumer started in between)
50. connection_reconnected_simple_disconn_active_blocks_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_reconnect_in_simple_group
51. connection_reconnected_simple_forg_act_disconn_active_blocks_rebalancing_test
    -> test_presumed_down_active_back_beside_disconnected_active_steps_down_in_simple_group
    (decision D3: the disconnected active moves to the front, as in every simple-group
    re-check)
52. connection_reconnected_simple_forg_act_should_trigger_rebalancing_test
    -> test_presumed_down_active_back_steps_down_and_current_active_stays_in_simple_group
    (decision D3: only the returning consumer steps down)
53. connection_reconnected_super_stream_disconn_active_blocks_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_reconnect_in_partitioned_group
54. connection_reconnected_super_stream_forg_act_disconn_active_blocks_rebalancing_test
    -> test_presumed_down_active_back_beside_disconnected_active_steps_down_in_partitioned_group
55. connection_reconnected_super_stream_forg_act_should_trigger_rebalancing_test
    -> test_presumed_down_active_back_hands_over_to_chosen_in_partitioned_group
    (decision D3: same effects; the current active is deactivating rather than waiting)
56. presume_conn_down_simple_disconn_active_blocks_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_timeout_in_simple_group
57. presume_conn_down_super_stream_disconn_active_block_rebalancing_test
    -> test_disconnected_active_blocks_rebalance_on_timeout_in_partitioned_group
58. presume_conn_down_simple_deactivating_triggers_rebalance_test
    -> test_timeout_of_disconnected_deactivating_consumer_rebalances_simple_group
59. presume_conn_down_super_stream_deactivating_triggers_rebalance_test
    -> test_timeout_of_disconnected_deactivating_consumer_rebalances_partitioned_group
60. purge_nodes_test -> test_purge_removes_consumers_of_stale_nodes
    (+ test_purge_removes_listed_connections, test_purge_never_activates_a_consumer_it_purges)
61. node_disconnected_and_reconnected_test -> test_node_lost_and_reconnected_across_groups
62. node_disconnected_reconnected_connection_down_test
    -> test_lost_connection_found_dead_after_node_reconnected
63. list_nodes_test -> test_list_nodes_gives_sorted_unique_nodes
64. state_enter_test -> test_recover_watches_connections_and_rearms_timers,
    test_recover_timer_keeps_its_deadline_but_waits_at_least_the_minimum (decision D1),
    test_recover_resends_current_consumer_updates (decision D2); ``state_enter(follower)``
    has no counterpart: the shell applies `Recover` once, when it starts serving
65. evaluate_group_not_found_test -> test_evaluate_unknown_group_is_refused
66. evaluate_group_all_connected_no_dead_pids_test
    -> test_evaluate_group_with_all_connected_changes_nothing
67. evaluate_group_remove_dead_pid_consumers_test
    -> test_evaluate_group_removes_dead_connections
68. evaluate_group_remove_disconnected_consumers_test
    -> test_evaluate_group_removes_disconnected_consumers
69. evaluate_group_remove_presumed_down_consumers_test
    -> test_evaluate_group_removes_presumed_down_consumers
70. evaluate_group_mix_dead_and_disconnected_test
    -> test_evaluate_group_removes_dead_and_disconnected
71. evaluate_group_empty_after_cleanup_test -> test_evaluate_group_deletes_emptied_group
72. evaluate_group_super_stream_rebalance_test
    -> test_evaluate_group_steps_down_active_no_longer_chosen
73. evaluate_group_super_stream_active_removed_test
    -> test_evaluate_group_activates_chosen_when_active_removed
74. evaluate_group_ensure_monitors_test
    -> test_evaluate_group_unwatches_connections_it_empties

Decisions (docs/coordinator.md, "Decisions") -> tests after the ports:

* D1 timer re-armed after a restart
  -> test_recover_timer_keeps_its_deadline_but_waits_at_least_the_minimum
* D2 Recover re-sends the current updates -> test_recover_resends_current_consumer_updates
* D3 a presumed-down active consumer comes back -> the ports of 51, 52 and 55,
  test_presumed_down_active_back_keeps_the_group_live_if_both_old_actives_crash,
  test_presumed_down_active_back_leaves_no_consumer_of_its_connection_behind,
  test_presumed_down_active_back_alone_is_stepped_down_then_activated
* D4 an activate with no step-down pending
  -> test_activate_without_pending_step_down_steps_down_an_active_no_longer_chosen
* D5 no reverse index (RabbitMQ's v8 gap)
  -> test_stale_timer_after_reconnect_does_not_hide_a_later_connection_down,
  test_presumed_down_connection_is_checked_when_its_node_comes_back
* D6 refusals -> test_unregister_unknown_consumer_is_refused_and_changes_nothing,
  test_activate_unknown_group_is_refused, test_unknown_command_is_refused_and_changes_nothing,
  test_commands_check_their_values_on_construction (and the ports of 14 and 65)
* D7 registering again -> test_register_again_replies_the_stored_status_and_changes_nothing
* D8 connection lost -> test_connection_lost_leaves_presumed_down_consumers_presumed_down,
  test_connection_lost_again_starts_the_timer_only_if_it_disconnects_consumers
* D9 purge at once -> test_purge_never_activates_a_consumer_it_purges
* D10 watches and timer cancels -> the ports of 5, 21 and 74
* D11 an answer names the consumer that answers
  -> test_late_answer_of_another_consumer_leaves_the_pending_step_down_pending,
  test_anonymous_answer_still_counts_for_the_pending_step_down
* D12 a deactivating consumer whose connection is lost blocks its group -> the ports of
  45, 46, 48 and 49, test_lost_deactivating_consumer_blocks_its_group_until_its_timer,
  test_lost_deactivating_consumer_back_is_told_again_and_its_answer_hands_over,
  test_lost_deactivating_consumer_leaving_hands_over,
  test_lost_deactivating_consumer_blocks_a_simple_group,
  test_recover_keeps_a_lost_deactivating_consumer_blocking_until_its_timer,
  test_list_groups_lists_groups_by_key_with_status_labels
* settings and the log's needs -> test_update_settings_applies_to_the_next_timer,
  test_commands_hold_only_plain_values, test_state_groups_cannot_be_changed_in_place,
  test_list_groups_lists_groups_by_key_with_status_labels
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from types import MappingProxyType

import pytest

from pykka_delivery.coordinator import (
    OK,
    SIMPLE,
    ActivateConsumer,
    Activity,
    CancelTimer,
    CheckConnection,
    Command,
    ConnectionDown,
    ConnectionLost,
    ConnectionReconnected,
    Connectivity,
    Consumer,
    CoordinatorSettings,
    CoordinatorState,
    DisconnectedTimeout,
    Effect,
    EvaluateGroup,
    Group,
    GroupId,
    NodeReconnected,
    PurgeStaleConnections,
    Recover,
    Refusal,
    Refused,
    RegisterConsumer,
    Registered,
    SendConsumerUpdate,
    StartTimer,
    UnregisterConsumer,
    UnwatchConnection,
    UpdateSettings,
    WatchConnection,
    apply,
    list_groups,
    list_nodes,
    settings_change,
)

GID = GroupId("/", "sO", "app")
STREAM = GroupId("/", "stream", "app")
G0 = GroupId("/", "s0", "app")
G1 = GroupId("/", "s1", "app")
G2 = GroupId("/", "s2", "app")

_CONNECTIVITY = {
    "C": Connectivity.CONNECTED,
    "D": Connectivity.DISCONNECTED,
    "P": Connectivity.PRESUMED_DOWN,
}
_ACTIVITY = {"A": Activity.ACTIVE, "W": Activity.WAITING, "D": Activity.DEACTIVATING}


# --- builders (the original's csr/grp/state) ------------------------------------------------


def csr(spec: str, node: str = "n0", disconnected_at: float = 0.0) -> Consumer:
    """``csr("p0/1 CA")``: consumer of connection p0, subscription 1, connected active."""
    key, _, status = spec.partition(" ")
    connection, _, sub = key.partition("/")
    status = status or "CW"
    return Consumer(
        connection,
        int(sub or 0),
        node,
        "owning connection label",
        _CONNECTIVITY[status[0]],
        _ACTIVITY[status[1]],
        disconnected_at,
    )


def grp(*consumers: str | Consumer, index: int = SIMPLE) -> Group:
    return Group(index, tuple(csr(c) if isinstance(c, str) else c for c in consumers))


RABBITMQ_SETTINGS = CoordinatorSettings(disconnected_timeout=60.0, partition_assignment="modulo")
"""The reference's ``disconnected_timeout`` (60 s), which the ported tests' timers assume
(our default is 20 s: decision D13 in docs/coordinator.md), and its modulo placement of
partitions (our default is sticky: D14)."""


def state(
    groups: Mapping[GroupId, Group] | None = None, settings: CoordinatorSettings | None = None
) -> CoordinatorState:
    return CoordinatorState(MappingProxyType(dict(groups or {})), settings or RABBITMQ_SETTINGS)


def view(s: CoordinatorState) -> dict[GroupId, list[str]]:
    """Every group as ``["connection/subscription STATUS", ...]``, in the group's order."""
    return {
        gid: [
            f"{c.connection}/{c.subscription_id} {c.connectivity.name[0]}{c.activity.name[0]}"
            for c in g.consumers
        ]
        for gid, g in s.groups.items()
    }


# --- commands -------------------------------------------------------------------------------


def register(
    connection: str, sub: int = 0, index: int = SIMPLE, gid: GroupId = GID, node: str = "n0"
) -> RegisterConsumer:
    return RegisterConsumer(
        gid.namespace, gid.stream, gid.name, connection, sub, node, index, "owning label"
    )


def unregister(connection: str, sub: int = 0, gid: GroupId = GID) -> UnregisterConsumer:
    return UnregisterConsumer(gid.namespace, gid.stream, gid.name, connection, sub)


def activate(gid: GroupId = GID) -> ActivateConsumer:
    return ActivateConsumer(gid.namespace, gid.stream, gid.name)


def evaluate(gid: GroupId = GID, dead: tuple[str, ...] = ()) -> EvaluateGroup:
    return EvaluateGroup(gid.namespace, gid.stream, gid.name, dead)


def lost(connection: str, now: float = 1000.0) -> ConnectionLost:
    return ConnectionLost(connection, now)


# --- effects --------------------------------------------------------------------------------


def act(connection: str, sub: int = 0, gid: GroupId = GID) -> SendConsumerUpdate:
    return SendConsumerUpdate(connection, sub, gid, active=True)


def step(connection: str, sub: int = 0, gid: GroupId = GID) -> SendConsumerUpdate:
    return SendConsumerUpdate(connection, sub, gid, active=False)


def timer(connection: str, delay: float = 60.0) -> StartTimer:
    return StartTimer(DisconnectedTimeout(connection), delay)


def lost_effects(connection: str, delay: float = 60.0) -> list[Effect]:
    """What a `ConnectionLost` that disconnects consumers emits: their timer, and the
    liveness check that hands a crashed process's consumers over at once."""
    return [timer(connection, delay), check(connection)]


def cancel(connection: str) -> CancelTimer:
    return CancelTimer(DisconnectedTimeout(connection))


def watch(connection: str) -> WatchConnection:
    return WatchConnection(connection)


def unwatch(connection: str) -> UnwatchConnection:
    return UnwatchConnection(connection)


def check(connection: str) -> CheckConnection:
    return CheckConnection(connection)


def run(s: CoordinatorState, command: Command) -> tuple[CoordinatorState, list[Effect]]:
    """Apply a command that must succeed; return the new state and the effects."""
    outcome = apply(s, command)
    assert not isinstance(outcome.reply, Refused), outcome.reply
    return outcome.state, outcome.effects


# --- 1-5: settings, registration, hand-over, watches ------------------------------------------


def test_settings_change_is_none_only_when_settings_match() -> None:
    default = CoordinatorSettings()
    changed = state(settings=CoordinatorSettings(disconnected_timeout=42.0))

    command = settings_change(changed, default)

    assert settings_change(state(settings=default), default) is None
    assert command == UpdateSettings(disconnected_timeout=20.0, recovery_min_delay=10.0)
    assert run(changed, command)[0].settings == default


def test_simple_group_first_registered_is_active_and_next_takes_over() -> None:
    s = state()

    s, reply, effects = apply(s, register("p", 0))
    assert reply == Registered(active=True)
    assert view(s) == {GID: ["p/0 CA"]}
    assert effects == [watch("p"), act("p", 0)]

    s, reply, effects = apply(s, register("p", 1))
    assert reply == Registered(active=False)
    assert view(s) == {GID: ["p/0 CA", "p/1 CW"]}
    assert effects == []

    s, reply, effects = apply(s, register("p", 2))
    assert reply == Registered(active=False)
    assert view(s) == {GID: ["p/0 CA", "p/1 CW", "p/2 CW"]}
    assert effects == []

    s, reply, effects = apply(s, unregister("p", 0))
    assert reply == OK
    assert view(s) == {GID: ["p/1 CA", "p/2 CW"]}
    assert effects == [act("p", 1)]

    s, effects = run(s, unregister("p", 1))
    assert view(s) == {GID: ["p/2 CA"]}
    assert effects == [act("p", 2)]

    s, effects = run(s, unregister("p", 2))
    assert view(s) == {}
    assert effects == [unwatch("p")]


def test_partitioned_group_hands_over_through_step_down() -> None:
    s = state()

    s, reply, effects = apply(s, register("p", 0, index=1))
    assert reply == Registered(active=True)
    assert view(s) == {GID: ["p/0 CA"]}
    assert effects == [watch("p"), act("p", 0)]

    s, reply, effects = apply(s, register("p", 1, index=1))
    assert reply == Registered(active=False)
    assert view(s) == {GID: ["p/0 CD", "p/1 CW"]}
    assert effects == [step("p", 0)]

    s, effects = run(s, activate())
    assert view(s) == {GID: ["p/0 CW", "p/1 CA"]}  # 1 mod 2 = 1
    assert effects == [act("p", 1)]

    s, reply, effects = apply(s, register("p", 2, index=1))
    assert reply == Registered(active=False)
    assert view(s) == {GID: ["p/0 CW", "p/1 CA", "p/2 CW"]}  # 1 mod 3 = 1
    assert effects == []

    s, effects = run(s, unregister("p", 0))
    assert view(s) == {GID: ["p/1 CD", "p/2 CW"]}
    assert effects == [step("p", 1)]

    s, effects = run(s, activate())
    assert view(s) == {GID: ["p/1 CW", "p/2 CA"]}
    assert effects == [act("p", 2)]

    s, effects = run(s, unregister("p", 1))
    assert view(s) == {GID: ["p/2 CA"]}
    assert effects == []

    s, effects = run(s, unregister("p", 2))
    assert view(s) == {}
    assert effects == [unwatch("p")]


def test_activate_notifies_a_stepping_down_consumer_chosen_again() -> None:
    # Regression test for RabbitMQ #16975: the consumer that stepped down is chosen again
    # and must be told, or the partition is stranded.
    s = state()

    s, effects = run(s, register("p", 0, index=3))
    assert effects == [watch("p"), act("p", 0)]
    s, effects = run(s, register("p", 1, index=3))
    assert effects == [step("p", 0)]  # 3 mod 2 = 1
    s, effects = run(s, register("p", 2, index=3))
    assert view(s) == {GID: ["p/0 CD", "p/1 CW", "p/2 CW"]}  # 3 mod 3 = 0: the CD one
    assert effects == []

    s, effects = run(s, activate())

    assert view(s) == {GID: ["p/0 CA", "p/1 CW", "p/2 CW"]}
    assert effects == [act("p", 0)]


def test_connection_is_watched_while_it_has_consumers() -> None:
    s = state()

    s, effects = run(s, register("self", 0, gid=STREAM))
    assert effects == [watch("self"), act("self", 0, STREAM)]
    s, effects = run(s, register("self", 1, gid=STREAM))
    assert effects == []  # already watched

    s, effects = run(s, unregister("self", 0, STREAM))
    assert effects == [act("self", 1, STREAM)]  # still has subscription 1: stays watched
    assert s.connections() == {"self"}

    refused = apply(s, unregister("unknown", 0, STREAM))
    assert refused.state is s
    assert refused.effects == []

    s, effects = run(s, unregister("self", 1, STREAM))
    assert effects == [unwatch("self")]
    assert s.connections() == frozenset()


# --- 6-15: connection down, partition index conflict -------------------------------------------


def test_connection_down_of_active_activates_next_in_simple_group() -> None:
    s = state({GID: grp("p0/0 CA", "p1/1 CW", "p0/2 CW")})

    s, effects = run(s, ConnectionDown("p0"))
    assert view(s) == {GID: ["p1/1 CA"]}
    assert s.group_ids_of("p1") == (GID,)
    assert effects == [act("p1", 1), unwatch("p0")]

    s, effects = run(s, ConnectionDown("p1"))
    assert view(s) == {}
    assert effects == [unwatch("p1")]


def test_connection_down_of_waiting_keeps_active_in_simple_group() -> None:
    s = state({GID: grp("p1/0 CA", "p0/1 CW", "p0/2 CW")})

    s, effects = run(s, ConnectionDown("p0"))

    assert view(s) == {GID: ["p1/0 CA"]}
    assert effects == [unwatch("p0")]


def test_connection_down_of_last_connection_deletes_group() -> None:
    s = state({GID: grp("p0/0 CA", "p0/1 CW")})

    s, effects = run(s, ConnectionDown("p0"))

    assert view(s) == {}
    assert effects == [unwatch("p0")]


def test_connection_down_of_connection_without_consumers_changes_nothing() -> None:
    s = state({GID: grp("p1/0 CA", "p1/1 CW")})

    after, effects = run(s, ConnectionDown("p0"))

    assert after == s
    assert effects == []


def test_connection_down_keeps_active_still_chosen_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p0/1 CA", "p1/2 CW", "p1/3 CW", index=1)})

    s, effects = run(s, ConnectionDown("p1"))

    assert view(s) == {GID: ["p0/0 CW", "p0/1 CA"]}
    assert effects == [unwatch("p1")]


def test_connection_down_steps_down_active_no_longer_chosen() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 CA", "p0/2 CW", "p1/3 CW", index=1)})

    s, effects = run(s, ConnectionDown("p0"))

    assert view(s) == {GID: ["p1/1 CD", "p1/3 CW"]}
    assert effects == [step("p1", 1), unwatch("p0")]


def test_connection_down_of_active_activates_chosen_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p0/1 CA", "p1/2 CW", "p1/3 CW", index=1)})

    s, effects = run(s, ConnectionDown("p0"))

    assert view(s) == {GID: ["p1/2 CW", "p1/3 CA"]}
    assert effects == [act("p1", 3), unwatch("p0")]


def test_connection_down_without_active_changes_no_status_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p0/1 CW", "p1/2 CW", "p1/3 CW", index=1)})

    s, effects = run(s, ConnectionDown("p0"))

    assert view(s) == {GID: ["p1/2 CW", "p1/3 CW"]}
    assert effects == [unwatch("p0")]


def test_register_with_conflicting_partition_index_is_refused() -> None:
    s, effects = run(state(), register("p0", 0, SIMPLE, STREAM))
    assert effects == [watch("p0"), act("p0", 0, STREAM)]

    outcome = apply(s, register("p0", 1, 1, STREAM))

    assert isinstance(outcome.reply, Refused)
    assert outcome.reply.reason is Refusal.PARTITION_INDEX_CONFLICT
    assert "partition index -1" in outcome.reply.message
    assert "register with partition index -1, or use another consumer name" in (
        outcome.reply.message
    )
    assert outcome.state is s
    assert outcome.effects == []


def test_connection_down_twice_activates_the_remaining_consumer() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 CA", "p2/2 CW", index=1)})

    s, effects = run(s, ConnectionDown("p0"))
    assert view(s) == {GID: ["p1/1 CD", "p2/2 CW"]}
    assert effects == [step("p1", 1), unwatch("p0")]

    s, effects = run(s, ConnectionDown("p1"))
    assert view(s) == {GID: ["p2/2 CA"]}
    assert effects == [act("p2", 2), unwatch("p1")]


# --- 18-29: connection lost, node and connection reconnected, disconnected timeout ---------------


def test_connection_lost_makes_consumers_disconnected_and_starts_timer() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 CA", "p2/2 CW", index=1)})

    s, effects = run(s, ConnectionLost("p1", now=1234.5))

    assert view(s) == {GID: ["p0/0 CW", "p1/1 DA", "p2/2 CW"]}
    assert s.groups[GID].consumers[1].disconnected_at == 1234.5
    assert effects == lost_effects("p1", 60.0)
    # Still a member: a later ConnectionDown finds it (RabbitMQ before v8 dropped the
    # connection from its index here; see test_lost_connection_found_dead_...).
    assert s.group_ids_of("p1") == (GID,)


def test_node_reconnected_checks_each_connection_of_the_node() -> None:
    a, b, c = csr("a/0", "n0"), csr("b/2", "n0"), csr("c/1", "n1")
    s = state(
        {
            G0: Group(0, (csr("a/0 CA", "n0"), csr("c/1 DW", "n1"), b)),
            G1: Group(1, (a, csr("c/1 DA", "n1"), b)),
            G2: Group(1, (a, c.with_status(Connectivity.DISCONNECTED), csr("b/2 CA", "n0"))),
        }
    )

    after, effects = run(s, NodeReconnected("n1"))

    assert after == s
    assert effects == [check("c")]


def test_node_reconnected_checks_a_connection_once_whatever_its_groups() -> None:
    s = state(
        {
            G0: Group(0, (csr("a/0 CA", "n0"), csr("c/1 DW", "n1"))),
            G1: Group(1, (csr("a/0 CA", "n0"), csr("c/1 DW", "n1"))),
        }
    )

    after, effects = run(s, NodeReconnected("n1"))

    assert after == s
    assert effects == [check("c")]
    assert run(s, NodeReconnected("n0"))[1] == [check("a")]
    assert run(s, NodeReconnected("n9"))[1] == []


def test_reconnected_disconnected_active_is_active_again() -> None:
    s = state({GID: grp("p0/0 DA", "p1/1 CW", "p2/2 CW")})

    s, effects = run(s, ConnectionReconnected("p0"))

    assert view(s) == {GID: ["p0/0 CA", "p1/1 CW", "p2/2 CW"]}
    assert effects == [cancel("p0")]


def test_reconnected_touches_only_groups_of_the_connection() -> None:
    other = GroupId("/", "other-stream", "app")
    s = state({GID: grp("p0/0 DA", "p1/1 CW"), other: grp("other/0 CA")})

    s, effects = run(s, ConnectionReconnected("p0"))

    assert view(s) == {GID: ["p0/0 CA", "p1/1 CW"], other: ["other/0 CA"]}
    assert effects == [cancel("p0")]


def test_reconnected_connected_connection_changes_nothing() -> None:
    s = state({GID: grp("p0/0 CA")})

    after, effects = run(s, ConnectionReconnected("p0"))

    assert after == s
    assert effects == []  # still watched: no new watch, no timer to cancel


def test_reconnected_simple_group_moves_active_to_front() -> None:
    s = state({GID: grp("p0/0 DW", "p1/1 CA", "p2/2 CW")})

    s, effects = run(s, ConnectionReconnected("p0"))

    assert view(s) == {GID: ["p1/1 CA", "p0/0 CW", "p2/2 CW"]}
    assert effects == [cancel("p0")]


def test_reconnected_partitioned_group_steps_down_active_no_longer_chosen() -> None:
    s = state({GID: grp("p0/0 DW", "p1/1 CW", "p2/2 CA", index=1)})

    s, effects = run(s, ConnectionReconnected("p0"))

    assert view(s) == {GID: ["p0/0 CW", "p1/1 CW", "p2/2 CD"]}  # 1 mod 3 = 1: p1
    assert effects == [step("p2", 2), cancel("p0")]


def test_timeout_presumes_down_and_activates_next_in_simple_group() -> None:
    s = state({GID: grp("p0/0 DA", "p1/1 CW", "p2/2 CW")})

    s, effects = run(s, DisconnectedTimeout("p0"))

    assert view(s) == {GID: ["p0/0 PA", "p1/1 CA", "p2/2 CW"]}
    assert effects == [act("p1", 1)]  # no CancelTimer: it is the timer firing


def test_timeout_presumes_down_and_activates_chosen_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 DA", "p2/2 CW", index=1)})

    s, effects = run(s, DisconnectedTimeout("p1"))

    assert view(s) == {GID: ["p0/0 CW", "p1/1 PA", "p2/2 CA"]}
    assert effects == [act("p2", 2)]


def test_stale_timeout_leaves_connected_consumers_in_simple_group() -> None:
    s = state({GID: grp("p0/0 CA", "p1/1 CW", "p2/2 CW")})

    after, effects = run(s, DisconnectedTimeout("p1"))

    assert after == s
    assert effects == []


def test_stale_timeout_leaves_connected_consumers_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 CA", "p2/2 CW", index=1)})

    after, effects = run(s, DisconnectedTimeout("p1"))

    assert after == s
    assert effects == []


# --- 30-44: a disconnected active consumer blocks everything ---------------------------------


def test_disconnected_active_blocks_activation_on_register_in_simple_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 DA", "p0/2 CW")})

    s, reply, effects = apply(s, register("p0", 3))

    assert reply == Registered(active=False)
    assert view(s) == {GID: ["p0/0 CW", "p1/1 DA", "p0/2 CW", "p0/3 CW"]}
    assert effects == []


def test_disconnected_active_blocks_rebalance_on_register_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 DA", "p0/2 CW", index=1)})

    s, reply, effects = apply(s, register("p0", 3, index=1))

    assert reply == Registered(active=False)
    assert view(s) == {GID: ["p0/0 CW", "p1/1 DA", "p0/2 CW", "p0/3 CW"]}
    assert effects == []


def test_unregister_active_does_not_choose_a_disconnected_consumer() -> None:
    s = state({GID: grp("p/0 CA", "p/1 DW")})

    s, effects = run(s, unregister("p", 0))

    assert view(s) == {GID: ["p/1 DW"]}
    assert effects == []


def test_disconnected_active_blocks_rebalance_on_unregister_in_simple_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 DA", "p0/2 CW")})

    s, effects = run(s, unregister("p0", 2))

    assert view(s) == {GID: ["p0/0 CW", "p1/1 DA"]}
    assert effects == []


def test_disconnected_active_blocks_rebalance_on_unregister_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 DA", "p0/2 CW", index=1)})

    s, effects = run(s, unregister("p0", 0))

    assert view(s) == {GID: ["p1/1 DA", "p0/2 CW"]}
    assert effects == []


def test_disconnected_active_blocks_activate_in_simple_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 DA", "p0/2 CW")})

    after, reply, effects = apply(s, activate())

    assert reply == OK
    assert after == s
    assert effects == []


def test_disconnected_active_blocks_activate_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 DA", "p0/2 CW", index=1)})

    after, reply, effects = apply(s, activate())

    assert reply == OK
    assert after == s
    assert effects == []


def test_activate_unblocks_all_waiting_simple_group() -> None:
    s = state({GID: grp("p/0 CW", "p/1 CW", "p/2 CW")})

    s, effects = run(s, activate())

    assert view(s) == {GID: ["p/0 CA", "p/1 CW", "p/2 CW"]}
    assert effects == [act("p", 0)]


def test_activate_skips_disconnected_consumers_in_simple_group() -> None:
    s = state({GID: grp("p/0 DW", "p/1 CW", "p/2 CW", "p/3 CW")})

    s, effects = run(s, activate())

    assert view(s) == {GID: ["p/0 DW", "p/1 CA", "p/2 CW", "p/3 CW"]}
    assert effects == [act("p", 1)]


def test_activate_unblocks_all_waiting_partitioned_group() -> None:
    s = state({GID: grp("p/0 CW", "p/1 CW", "p/2 CW", index=1)})

    s, effects = run(s, activate())

    assert view(s) == {GID: ["p/0 CW", "p/1 CA", "p/2 CW"]}
    assert effects == [act("p", 1)]


def test_activate_skips_disconnected_consumers_in_partitioned_group() -> None:
    s = state({GID: grp("p/0 DW", "p/1 CW", "p/2 CW", "p/3 CW", index=1)})

    s, effects = run(s, activate())

    # eligible = [1, 2, 3]; 1 mod 3 = 1 -> subscription 2
    assert view(s) == {GID: ["p/0 DW", "p/1 CW", "p/2 CA", "p/3 CW"]}
    assert effects == [act("p", 2)]


def test_disconnected_active_blocks_rebalance_on_connection_down_in_simple_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/0 DA", "p2/0 CW")})

    s, effects = run(s, ConnectionDown("p2"))

    assert view(s) == {GID: ["p0/0 CW", "p1/0 DA"]}
    assert effects == [unwatch("p2")]


def test_disconnected_active_blocks_rebalance_on_connection_down_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/0 DA", "p2/0 CW", index=1)})

    s, effects = run(s, ConnectionDown("p0"))

    assert view(s) == {GID: ["p1/0 DA", "p2/0 CW"]}
    assert effects == [unwatch("p0")]


def test_disconnected_active_blocks_rebalance_on_connection_lost_in_simple_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/0 DA", "p2/0 CW")})

    s, effects = run(s, lost("p2"))

    assert view(s) == {GID: ["p0/0 CW", "p1/0 DA", "p2/0 DW"]}
    assert effects == lost_effects("p2")


def test_disconnected_active_blocks_rebalance_on_connection_lost_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/0 DA", "p2/0 CW", index=1)})

    s, effects = run(s, lost("p0"))

    assert view(s) == {GID: ["p0/0 DW", "p1/0 DA", "p2/0 CW"]}
    assert effects == lost_effects("p0")


# --- 45-49: a deactivating consumer that disconnects or dies ---------------------------------


def test_connection_lost_of_deactivating_consumer_blocks_partitioned_group_until_its_timer() -> (
    None
):
    # Decision D12. RabbitMQ v6: [p0 CW, p1 DW, p2 CA] and ACT(p2) on the loss. p1 may
    # still be finishing (its messages do not go through the coordinator): nobody starts.
    s = state({GID: grp("p0/0 CW", "p1/1 CD", "p2/2 CW", index=1)})

    s, effects = run(s, lost("p1"))
    assert view(s) == {GID: ["p0/0 CW", "p1/1 DD", "p2/2 CW"]}
    assert effects == lost_effects("p1")

    s, effects = run(s, DisconnectedTimeout("p1"))
    assert view(s) == {GID: ["p0/0 CW", "p1/1 PW", "p2/2 CA"]}
    assert effects == [act("p2", 2)]


def test_connection_lost_of_deactivating_consumer_blocks_simple_group_until_its_timer() -> None:
    # Decision D12, as for 45. RabbitMQ v6: [p0 CA, p1 DW, p2 CW] and ACT(p0) on the loss.
    s = state({GID: grp("p0/0 CW", "p1/1 CD", "p2/2 CW")})

    s, effects = run(s, lost("p1"))
    assert view(s) == {GID: ["p0/0 CW", "p1/1 DD", "p2/2 CW"]}
    assert effects == lost_effects("p1")

    s, effects = run(s, DisconnectedTimeout("p1"))
    assert view(s) == {GID: ["p0/0 CA", "p1/1 PW", "p2/2 CW"]}
    assert effects == [act("p0", 0)]


def test_connection_down_of_deactivating_consumer_activates_chosen() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 CD", "p2/2 CW", index=1)})

    s, effects = run(s, ConnectionDown("p1"))

    assert view(s) == {GID: ["p0/0 CW", "p2/2 CA"]}
    assert effects == [act("p2", 2), unwatch("p1")]


def test_connection_lost_with_several_consumers_one_deactivating() -> None:
    # Decision D12. RabbitMQ v6: [p0/0 DW, p0/1 DW, p1/2 CA] and ACT(p1, 2) on the loss.
    s = state({GID: grp("p0/0 CD", "p0/1 CW", "p1/2 CW", index=1)})

    s, effects = run(s, lost("p0"))
    assert view(s) == {GID: ["p0/0 DD", "p0/1 DW", "p1/2 CW"]}
    assert effects == lost_effects("p0")

    s, effects = run(s, DisconnectedTimeout("p0"))
    assert view(s) == {GID: ["p0/0 PW", "p0/1 PW", "p1/2 CA"]}
    assert effects == [act("p1", 2)]


def test_deactivating_consumer_lost_then_reconnected_then_late_activate() -> None:
    # Decision D12. RabbitMQ v6 activates p2 on the loss, steps p2 down on the reconnect
    # (p1 is chosen again: 1 mod 3) and activates p1 on the late answer, so p2 may start
    # while p1 still finishes. Here nobody starts until p1 answers.
    s = state({GID: grp("p0/0 CW", "p1/1 CD", "p2/2 CW", index=1)})

    s, effects = run(s, lost("p1"))
    assert view(s) == {GID: ["p0/0 CW", "p1/1 DD", "p2/2 CW"]}
    assert effects == lost_effects("p1")

    s, effects = run(s, ConnectionReconnected("p1"))
    assert view(s) == {GID: ["p0/0 CW", "p1/1 CD", "p2/2 CW"]}
    assert effects == [step("p1", 1), cancel("p1")]  # told again: it may have missed it

    s, effects = run(s, activate())  # p1's late answer to its step-down
    assert view(s) == {GID: ["p0/0 CW", "p1/1 CA", "p2/2 CW"]}
    assert effects == [act("p1", 1)]  # chosen again, and told (#16975)


# --- 50-59: a presumed-down or disconnected active consumer comes back or times out ------------


def test_disconnected_active_blocks_rebalance_on_reconnect_in_simple_group() -> None:
    s = state({GID: grp("p0/0 DW", "p1/0 DA", "p2/0 CW")})

    s, effects = run(s, ConnectionReconnected("p0"))

    assert view(s) == {GID: ["p1/0 DA", "p0/0 CW", "p2/0 CW"]}
    assert effects == [cancel("p0")]


def test_presumed_down_active_back_beside_disconnected_active_steps_down_in_simple_group() -> None:
    s = state({GID: grp("p0/0 PA", "p1/0 DA", "p2/0 CW")})

    s, effects = run(s, ConnectionReconnected("p0"))

    # RabbitMQ: [p0 CW, p1 DA, p2 CW]; we re-check the group, which moves the active
    # consumer to the front as every simple-group re-check does (decision D3).
    assert view(s) == {GID: ["p1/0 DA", "p0/0 CW", "p2/0 CW"]}
    assert effects == [step("p0", 0)]


def test_presumed_down_active_back_steps_down_and_current_active_stays_in_simple_group() -> None:
    # Decision D3. RabbitMQ steps down p0 *and* p1, then the first answer activates p0.
    # We keep p1, active since p0 was presumed down, and only p0 steps down.
    s = state({GID: grp("p0/0 PA", "p1/0 CA", "p2/0 CW")})

    s, effects = run(s, ConnectionReconnected("p0"))
    assert view(s) == {GID: ["p1/0 CA", "p0/0 CW", "p2/0 CW"]}
    assert effects == [step("p0", 0)]

    s, effects = run(s, activate())  # p0's answer
    assert view(s) == {GID: ["p1/0 CA", "p0/0 CW", "p2/0 CW"]}
    assert effects == []

    after, effects = run(s, activate())
    assert after == s
    assert effects == []


def test_disconnected_active_blocks_rebalance_on_reconnect_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 DA", "p1/0 DW", "p2/0 CW", index=1)})

    s, effects = run(s, ConnectionReconnected("p1"))

    assert view(s) == {GID: ["p0/0 DA", "p1/0 CW", "p2/0 CW"]}
    assert effects == [cancel("p1")]


def test_presumed_down_active_back_beside_disconnected_active_steps_down_in_partitioned_group() -> (
    None
):
    s = state({GID: grp("p0/0 PA", "p1/0 DA", "p2/0 CW", index=1)})

    s, effects = run(s, ConnectionReconnected("p0"))

    assert view(s) == {GID: ["p0/0 CW", "p1/0 DA", "p2/0 CW"]}
    assert effects == [step("p0", 0)]


def test_presumed_down_active_back_hands_over_to_chosen_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 PA", "p1/0 CW", "p2/0 CA", index=1)})

    s, effects = run(s, ConnectionReconnected("p0"))
    # 1 mod 3 = 1: p1 is chosen, so p2 steps down too (RabbitMQ: same two effects, p2 CW).
    assert view(s) == {GID: ["p0/0 CW", "p1/0 CW", "p2/0 CD"]}
    assert effects == [step("p0", 0), step("p2", 0)]

    s, effects = run(s, activate())
    assert view(s) == {GID: ["p0/0 CW", "p1/0 CA", "p2/0 CW"]}
    assert effects == [act("p1", 0)]

    after, effects = run(s, activate())
    assert after == s
    assert effects == []


def test_disconnected_active_blocks_rebalance_on_timeout_in_simple_group() -> None:
    s = state({GID: grp("p0/0 DW", "p1/0 CW", "p2/0 DA")})

    s, effects = run(s, DisconnectedTimeout("p0"))

    assert view(s) == {GID: ["p2/0 DA", "p0/0 PW", "p1/0 CW"]}
    assert effects == []


def test_disconnected_active_blocks_rebalance_on_timeout_in_partitioned_group() -> None:
    s = state({GID: grp("p0/0 DW", "p1/0 CW", "p2/0 DA", index=1)})

    s, effects = run(s, DisconnectedTimeout("p0"))

    assert view(s) == {GID: ["p0/0 PW", "p1/0 CW", "p2/0 DA"]}
    assert effects == []


def test_timeout_of_disconnected_deactivating_consumer_rebalances_simple_group() -> None:
    # A lost CD becomes DD (decision D12; RabbitMQ v6 no longer produces it).
    s = state({GID: grp("p0/0 CW", "p1/1 DD", "p2/2 CW")})

    s, effects = run(s, DisconnectedTimeout("p1"))

    assert view(s) == {GID: ["p0/0 CA", "p1/1 PW", "p2/2 CW"]}
    assert effects == [act("p0", 0)]


def test_timeout_of_disconnected_deactivating_consumer_rebalances_partitioned_group() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 DD", "p2/2 CW", index=1)})

    s, effects = run(s, DisconnectedTimeout("p1"))

    assert view(s) == {GID: ["p0/0 CW", "p1/1 PW", "p2/2 CA"]}
    assert effects == [act("p2", 2)]


# --- 60-64: nodes, purge, recovery -------------------------------------------------------------


def test_purge_removes_consumers_of_stale_nodes() -> None:
    s = state(
        {
            G0: Group(SIMPLE, (csr("n1p0 DA", "n1"), csr("n0p1", "n0"), csr("n0p2", "n0"))),
            G1: Group(1, (csr("n1p1 DW", "n1"), csr("n1p2 DA", "n1"), csr("n0p0", "n0"))),
            G2: Group(SIMPLE, (csr("n0p0 CA", "n0"), csr("n0p1", "n0"), csr("n0p2", "n0"))),
        }
    )

    s, effects = run(s, PurgeStaleConnections(nodes=("n1",)))

    assert view(s) == {
        G0: ["n0p1/0 CA", "n0p2/0 CW"],
        G1: ["n0p0/0 CA"],
        G2: ["n0p0/0 CA", "n0p1/0 CW", "n0p2/0 CW"],
    }
    assert effects == [
        act("n0p1", 0, G0),
        act("n0p0", 0, G1),
        cancel("n1p0"),
        cancel("n1p1"),
        cancel("n1p2"),
        unwatch("n1p0"),
        unwatch("n1p1"),
        unwatch("n1p2"),
    ]


def test_purge_removes_listed_connections() -> None:
    s = state({GID: grp("p0/0 CA", "p1/0 CW", "p2/0 CW")})

    s, effects = run(s, PurgeStaleConnections(connections=("p0", "p2", "unknown")))

    assert view(s) == {GID: ["p1/0 CA"]}
    assert effects == [act("p1", 0), unwatch("p0"), unwatch("p2")]


def test_purge_never_activates_a_consumer_it_purges() -> None:
    # Decision D9 (found by the stateful test): purging p0 first, then p1, would tell p1
    # to become active just before removing it (RabbitMQ PR #13671).
    s = state({GID: grp("p0/0 CA", "p1/0 CW", "p2/0 CW")})

    s, effects = run(s, PurgeStaleConnections(connections=("p0", "p1")))

    assert view(s) == {GID: ["p2/0 CA"]}
    assert effects == [act("p2", 0), unwatch("p0"), unwatch("p1")]


def test_node_lost_and_reconnected_across_groups() -> None:
    n0 = {name: csr(f"{name}/0", "n0") for name in ("n0p0", "n0p1", "n0p2")}
    n1 = {name: csr(f"{name}/0", "n1") for name in ("n1p0", "n1p1", "n1p2")}
    active = Activity.ACTIVE
    s = state(
        {
            G0: Group(SIMPLE, (n0["n0p0"].with_status(activity=active), n1["n1p0"], n0["n0p1"])),
            G1: Group(1, (n1["n1p1"], n0["n0p2"].with_status(activity=active), n1["n1p2"])),
            G2: Group(SIMPLE, (n0["n0p0"].with_status(activity=active), n1["n1p1"], n0["n0p2"])),
        }
    )

    for connection in ("n1p0", "n1p1", "n1p2"):
        s, effects = run(s, lost(connection))
        assert effects == lost_effects(connection)
    assert view(s) == {
        G0: ["n0p0/0 CA", "n1p0/0 DW", "n0p1/0 CW"],
        G1: ["n1p1/0 DW", "n0p2/0 CA", "n1p2/0 DW"],
        G2: ["n0p0/0 CA", "n1p1/0 DW", "n0p2/0 CW"],
    }

    after, effects = run(s, NodeReconnected("n1"))
    assert after == s
    assert effects == [check("n1p0"), check("n1p1"), check("n1p2")]

    s, effects = run(s, ConnectionReconnected("n1p0"))
    assert view(s) == {
        G0: ["n0p0/0 CA", "n1p0/0 CW", "n0p1/0 CW"],
        G1: ["n1p1/0 DW", "n0p2/0 CA", "n1p2/0 DW"],
        G2: ["n0p0/0 CA", "n1p1/0 DW", "n0p2/0 CW"],
    }
    assert effects == [cancel("n1p0")]

    s, effects = run(s, ConnectionReconnected("n1p1"))
    assert view(s) == {
        G0: ["n0p0/0 CA", "n1p0/0 CW", "n0p1/0 CW"],
        G1: ["n1p1/0 CW", "n0p2/0 CA", "n1p2/0 DW"],
        G2: ["n0p0/0 CA", "n1p1/0 CW", "n0p2/0 CW"],
    }
    assert effects == [cancel("n1p1")]

    s, effects = run(s, DisconnectedTimeout("n1p2"))
    assert view(s) == {
        G0: ["n0p0/0 CA", "n1p0/0 CW", "n0p1/0 CW"],
        G1: ["n1p1/0 CW", "n0p2/0 CA", "n1p2/0 PW"],
        G2: ["n0p0/0 CA", "n1p1/0 CW", "n0p2/0 CW"],
    }
    assert effects == []


def test_lost_connection_found_dead_after_node_reconnected() -> None:
    s = state({GID: Group(1, (csr("p0", "n0"), csr("p1/0 CA", "n1"), csr("p2", "n2")))})

    s, effects = run(s, lost("p1"))
    assert view(s) == {GID: ["p0/0 CW", "p1/0 DA", "p2/0 CW"]}
    assert effects == lost_effects("p1")

    after, effects = run(s, NodeReconnected("n1"))
    assert after == s
    assert effects == [check("p1")]

    s, effects = run(s, ConnectionDown("p1"))  # the check found it dead
    assert view(s) == {GID: ["p0/0 CW", "p2/0 CA"]}
    assert effects == [act("p2", 0), cancel("p1"), unwatch("p1")]


def test_list_nodes_gives_sorted_unique_nodes() -> None:
    p0, p1, p2 = csr("p0", "n0"), csr("p1", "n1"), csr("p2", "n2")

    assert list_nodes(
        state({G0: Group(-1, (p0,)), G1: Group(-1, (p1,)), G2: Group(-1, (p2,))})
    ) == ("n0", "n1", "n2")
    assert list_nodes(state({G0: Group(-1, (p0,)), G2: Group(-1, (p2,))})) == ("n0", "n2")
    assert list_nodes(state({G2: Group(-1, (p2,))})) == ("n2",)
    assert list_nodes(state({G1: Group(-1, (p1,)), G2: Group(-1, (p2, p1))})) == ("n1", "n2")
    assert list_nodes(state({G0: Group(-1, (p0, p1, p2))})) == ("n0", "n1", "n2")
    assert list_nodes(state()) == ()


def test_recover_watches_connections_and_rearms_timers() -> None:
    def three(name: str, node: str) -> Group:
        return Group(SIMPLE, tuple(csr(f"{name}/{sub}", node) for sub in range(3)))

    p1_lost = csr("p1/1 DW", "n1", disconnected_at=999.0)
    p2_lost = csr("p2/1 DW", "n2", disconnected_at=999.0)
    now = Recover(now=1000.0)

    s = state({G0: three("p0", "n0"), G1: three("p1", "n1"), G2: three("p2", "n2")})
    assert run(s, now) == (s, [watch("p0"), watch("p1"), watch("p2")])

    s = state({G0: three("p0", "n0"), G1: three("p1", "n1"), G2: grp("p0", "p1", "p1/1")})
    assert run(s, now)[1] == [watch("p0"), watch("p1")]

    s = state({G0: Group(SIMPLE, (csr("p0"), p1_lost)), G2: grp("p0")})
    assert run(s, now)[1] == [watch("p0"), watch("p1"), timer("p1", 59.0)]

    s = state(
        {
            G0: Group(SIMPLE, (csr("p0"), p1_lost)),
            G1: Group(SIMPLE, (csr("p0"), p2_lost)),
            G2: Group(SIMPLE, (csr("p0"), p1_lost)),
        }
    )
    assert run(s, now)[1] == [
        watch("p0"),
        watch("p1"),
        watch("p2"),
        timer("p1", 59.0),
        timer("p2", 59.0),
    ]


# --- 65-74: evaluate group ----------------------------------------------------------------------


def test_evaluate_unknown_group_is_refused() -> None:
    s = state()

    outcome = apply(s, evaluate(GroupId("/", "stream", "app")))

    assert isinstance(outcome.reply, Refused)
    assert outcome.reply.reason is Refusal.GROUP_NOT_FOUND
    assert outcome.state is s
    assert outcome.effects == []


def test_evaluate_group_with_all_connected_changes_nothing() -> None:
    s = state({GID: grp("p0/0 CA", "p1/1 CW")})

    after, effects = run(s, evaluate())

    assert after == s
    assert effects == []


def test_evaluate_group_removes_dead_connections() -> None:
    s = state({GID: grp("p0/0 CA", "p1/1 CW")})

    s, effects = run(s, evaluate(dead=("p0",)))

    assert view(s) == {GID: ["p1/1 CA"]}
    assert effects == [act("p1", 1), unwatch("p0")]


def test_evaluate_group_removes_disconnected_consumers() -> None:
    s = state({GID: grp("p0/0 CA", "p1/1 DW", "p2/2 CW")})

    s, effects = run(s, evaluate())

    assert view(s) == {GID: ["p0/0 CA", "p2/2 CW"]}
    assert effects == [cancel("p1"), unwatch("p1")]


def test_evaluate_group_removes_presumed_down_consumers() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 PA", "p2/2 CW")})

    s, effects = run(s, evaluate())

    assert view(s) == {GID: ["p0/0 CA", "p2/2 CW"]}
    assert effects == [act("p0", 0), unwatch("p1")]


def test_evaluate_group_removes_dead_and_disconnected() -> None:
    s = state({GID: grp("p0/0 CA", "p1/1 DW", "p2/2 CW", "p3/3 CW")})

    s, effects = run(s, evaluate(dead=("p2",)))

    assert view(s) == {GID: ["p0/0 CA", "p3/3 CW"]}
    assert effects == [cancel("p1"), unwatch("p1"), unwatch("p2")]


def test_evaluate_group_deletes_emptied_group() -> None:
    s = state({GID: grp("p0/0 DA")})

    s, effects = run(s, evaluate())

    assert view(s) == {}
    assert effects == [cancel("p0"), unwatch("p0")]


def test_evaluate_group_steps_down_active_no_longer_chosen() -> None:
    s = state({GID: grp("p0/0 CW", "p1/1 CA", "p2/2 CW", index=1)})

    s, effects = run(s, evaluate(dead=("p0",)))

    assert view(s) == {GID: ["p1/1 CD", "p2/2 CW"]}
    assert effects == [step("p1", 1), unwatch("p0")]


def test_evaluate_group_activates_chosen_when_active_removed() -> None:
    s = state({GID: grp("p0/0 DA", "p1/1 CW", index=1)})

    s, effects = run(s, evaluate())

    assert view(s) == {GID: ["p1/1 CA"]}
    assert effects == [act("p1", 1), cancel("p0"), unwatch("p0")]


def test_evaluate_group_unwatches_connections_it_empties() -> None:
    s = state({GID: grp("p0/0 CA", "p1/1 DW", "p2/2 CW")})

    s, effects = run(s, evaluate())

    assert s.connections() == {"p0", "p2"}
    assert s.group_ids_of("p1") == ()
    assert unwatch("p1") in effects


# --- Decisions (docs/coordinator.md) and regressions ---------------------------------------------


def test_recover_timer_keeps_its_deadline_but_waits_at_least_the_minimum() -> None:
    # Decision D1: RabbitMQ re-arms 10 s if the loss is under 10 s old, the full timeout if
    # it is older than the timeout, and crashes in between.
    def delay(elapsed: float, settings: CoordinatorSettings | None = None) -> float:
        lost_consumer = csr("p1/0 DW", disconnected_at=1000.0)
        s = state({GID: Group(SIMPLE, (csr("p0/1 CA"), lost_consumer))}, settings)
        effects = run(s, Recover(now=1000.0 + elapsed))[1]
        (rearmed,) = [e for e in effects if isinstance(e, StartTimer)]
        assert rearmed.key == DisconnectedTimeout("p1")
        return rearmed.delay

    assert delay(0.0) == 60.0
    assert delay(30.0) == 30.0
    assert delay(55.0) == 10.0
    assert delay(600.0) == 10.0
    assert delay(-5.0) == 60.0  # a clock behind the one that recorded the loss
    assert delay(0.0, CoordinatorSettings(disconnected_timeout=5.0)) == 5.0
    assert delay(4.0, CoordinatorSettings(disconnected_timeout=5.0)) == 5.0


def test_recover_resends_current_consumer_updates() -> None:
    # Decision D2: an update decided just before a crash may never have been sent.
    s = state(
        {
            G0: grp("p0/0 CA", "p1/0 CW"),
            G1: grp("p0/1 CW", "p1/1 CD", index=0),
            G2: Group(SIMPLE, (csr("p2/0 DA", disconnected_at=1000.0), csr("p0/2"))),
        }
    )

    after, reply, effects = apply(s, Recover(now=1000.0))

    assert after == s
    assert reply == OK
    assert effects == [
        watch("p0"),
        watch("p1"),
        watch("p2"),
        act("p0", 0, G0),
        step("p1", 1, G1),
        timer("p2", 60.0),
    ]


def test_presumed_down_active_back_keeps_the_group_live_if_both_old_actives_crash() -> None:
    # Decision D3. RabbitMQ sets p0 and p1 waiting and waits for their answers; if both
    # crash before answering, p2 waits forever (removing a waiting consumer activates no
    # one). Here p1 stays active, so its removal activates p2.
    s = state({GID: grp("p0/0 PA", "p1/0 CA", "p2/0 CW")})
    s, _ = run(s, ConnectionReconnected("p0"))

    s, effects = run(s, ConnectionDown("p0"))
    assert view(s) == {GID: ["p1/0 CA", "p2/0 CW"]}
    assert effects == [unwatch("p0")]

    s, effects = run(s, ConnectionDown("p1"))
    assert view(s) == {GID: ["p2/0 CA"]}
    assert effects == [act("p2", 0), unwatch("p1")]


def test_presumed_down_active_back_leaves_no_consumer_of_its_connection_behind() -> None:
    # Decision D3: RabbitMQ leaves the connection's presumed-down waiting consumers
    # presumed down when another connection's disconnected active blocks the group.
    s = state({GID: grp("p0/0 PA", "p0/1 PW", "p1/2 DA", "p2/3 CW")})

    s, effects = run(s, ConnectionReconnected("p0"))

    assert view(s) == {GID: ["p1/2 DA", "p0/0 CW", "p0/1 CW", "p2/3 CW"]}
    assert effects == [step("p0", 0)]


def test_presumed_down_active_back_alone_is_stepped_down_then_activated() -> None:
    s = state({GID: grp("p0/0 PA", "p1/1 DW")})

    s, effects = run(s, ConnectionReconnected("p0"))

    assert view(s) == {GID: ["p0/0 CA", "p1/1 DW"]}
    assert effects == [step("p0", 0), act("p0", 0)]


def test_activate_without_pending_step_down_steps_down_an_active_no_longer_chosen() -> None:
    # Decision D4: RabbitMQ would activate p1 and silently set p0 waiting; p0 was never
    # told, so both would consume.
    s = state({GID: grp("p0/0 CA", "p1/1 CW", index=1)})

    s, effects = run(s, activate())

    assert view(s) == {GID: ["p0/0 CD", "p1/1 CW"]}
    assert effects == [step("p0", 0)]


def test_stale_timer_after_reconnect_does_not_hide_a_later_connection_down() -> None:
    # Regression for RabbitMQ's v8 index gap (reference 2.9, sequence 2): the stale timer
    # dropped the connection from the index, so its later DOWN was ignored and a ghost
    # active consumer blocked the group. There is no index here to drift.
    s = state({GID: grp("p0/0 CA", "p1/1 CW")})
    s, _ = run(s, lost("p0"))
    s, _ = run(s, ConnectionReconnected("p0"))

    s, effects = run(s, DisconnectedTimeout("p0"))  # the timer raced its cancel
    assert view(s) == {GID: ["p0/0 CA", "p1/1 CW"]}
    assert effects == []

    s, effects = run(s, ConnectionDown("p0"))
    assert view(s) == {GID: ["p1/1 CA"]}
    assert effects == [act("p1", 1), unwatch("p0")]


def test_presumed_down_connection_is_checked_when_its_node_comes_back() -> None:
    # Regression for RabbitMQ's v8 index gap (reference 2.9, sequence 1): after a
    # partition longer than the timeout, node-up did not check the connection.
    s = state({GID: Group(SIMPLE, (csr("p0/0 CA", "n1"), csr("p1/1", "n0")))})
    s, _ = run(s, lost("p0"))
    s, effects = run(s, DisconnectedTimeout("p0"))
    assert view(s) == {GID: ["p0/0 PA", "p1/1 CA"]}
    assert effects == [act("p1", 1)]

    assert run(s, NodeReconnected("n1"))[1] == [check("p0")]
    back, effects = run(s, ConnectionReconnected("p0"))
    assert view(back) == {GID: ["p1/1 CA", "p0/0 CW"]}
    assert effects == [step("p0", 0)]
    gone, effects = run(s, ConnectionDown("p0"))
    assert view(gone) == {GID: ["p1/1 CA"]}
    assert effects == [unwatch("p0")]


def test_connection_lost_leaves_presumed_down_consumers_presumed_down() -> None:
    # A presumed-down active consumer must not count as active again.
    s = state({GID: grp("p0/0 PA", "p1/1 CA")})

    after, effects = run(s, lost("p0"))

    assert after == s
    assert effects == []


def test_connection_lost_again_starts_the_timer_only_if_it_disconnects_consumers() -> None:
    s = state({GID: grp("p0/0 CA", "p1/1 CW")})
    s, effects = run(s, lost("p0", now=1.0))
    assert effects == lost_effects("p0")

    after, effects = run(s, lost("p0", now=2.0))

    assert after == s
    assert effects == []


def test_update_settings_applies_to_the_next_timer() -> None:
    s = state({GID: grp("p0/0 CA", "p1/1 CW")})

    s, effects = run(s, UpdateSettings(disconnected_timeout=2.0))
    assert effects == []
    assert s.settings == CoordinatorSettings(disconnected_timeout=2.0, recovery_min_delay=10.0)

    assert run(s, lost("p0"))[1] == lost_effects("p0", 2.0)


def test_register_again_replies_the_stored_status_and_changes_nothing() -> None:
    # RabbitMQ replies {ok, false} to its active consumer registering again (reference 2.2).
    simple = state({GID: grp("p0/0 CA", "p1/1 CW")})
    partitioned = state({GID: grp("p0/0 CA", "p1/1 CW", index=0)})

    assert apply(simple, register("p0", 0)) == (simple, Registered(active=True), [])
    assert apply(simple, register("p1", 1)) == (simple, Registered(active=False), [])
    assert apply(partitioned, register("p1", 1, index=0)) == (
        partitioned,
        Registered(active=False),
        [],
    )


def test_unregister_unknown_consumer_is_refused_and_changes_nothing() -> None:
    s = state({GID: grp("p0/0 CA")})

    for command in (unregister("p0", 1), unregister("p0", 0, G1)):
        outcome = apply(s, command)
        assert isinstance(outcome.reply, Refused)
        assert outcome.reply.reason is Refusal.CONSUMER_NOT_FOUND
        assert "nothing to do" in outcome.reply.message
        assert outcome.state is s
        assert outcome.effects == []


def test_activate_unknown_group_is_refused() -> None:
    s = state({GID: grp("p0/0 CA")})

    outcome = apply(s, activate(G1))

    assert isinstance(outcome.reply, Refused)
    assert outcome.reply.reason is Refusal.GROUP_NOT_FOUND
    assert "Register a consumer to create it" in outcome.reply.message
    assert outcome.state is s
    assert outcome.effects == []


def test_unknown_command_is_refused_and_changes_nothing() -> None:
    s = state({GID: grp("p0/0 CA")})

    outcome = apply(s, "register please")  # type: ignore[arg-type]

    assert isinstance(outcome.reply, Refused)
    assert outcome.reply.reason is Refusal.UNKNOWN_COMMAND
    assert "RegisterConsumer" in outcome.reply.message
    assert outcome.state is s
    assert outcome.effects == []


def test_commands_check_their_values_on_construction() -> None:
    with pytest.raises(ValueError, match="partition_index must be -1"):
        register("p0", 0, index=-2)
    with pytest.raises(ValueError, match="connection must be a non-empty string"):
        register("", 0)
    with pytest.raises(ValueError, match="subscription_id must be 0 or more"):
        register("p0", -1)
    with pytest.raises(ValueError, match="now must be finite"):
        ConnectionLost("p0", float("nan"))
    with pytest.raises(ValueError, match="disconnected_timeout must be a finite number"):
        UpdateSettings(disconnected_timeout=0.0)
    with pytest.raises(ValueError, match="must be a tuple of strings"):
        PurgeStaleConnections(nodes=["n1"])  # type: ignore[arg-type]


_PLAIN = (str, int, float, bool)


def _is_plain(annotation: object) -> bool:
    if annotation in _PLAIN:
        return True
    if typing.get_origin(annotation) is tuple:
        return all(a is Ellipsis or _is_plain(a) for a in typing.get_args(annotation))
    return False


def test_commands_hold_only_plain_values() -> None:
    # A command log stores them; replaying must rebuild them exactly.
    for command_type in typing.get_args(Command):
        hints = typing.get_type_hints(command_type)
        for f in dataclasses.fields(command_type):
            assert _is_plain(hints[f.name]), f"{command_type.__name__}.{f.name}: {hints[f.name]}"
        assert command_type.__dataclass_params__.frozen  # type: ignore[attr-defined]
        assert "__slots__" in vars(command_type)


def test_state_groups_cannot_be_changed_in_place() -> None:
    s, _ = run(state(), register("p0", 0))

    assert isinstance(s.groups, types.MappingProxyType)
    with pytest.raises(TypeError):
        s.groups[G1] = grp("p1/0 CA")  # type: ignore[index]


def test_list_groups_lists_groups_by_key_with_status_labels() -> None:
    other = GroupId("other", "s", "app")
    s = state(
        {
            G1: grp("p0/0 PW", "p1/0 CA", index=1),
            G0: grp("p0/1 DA"),
            other: grp("p2/0 DD", "p3/0 CW"),
        }
    )

    listed = list_groups(s, namespace="/")

    assert [(g.group, g.partition_index) for g in listed] == [(G0, SIMPLE), (G1, 1)]
    assert [c.label for g in listed for c in g.consumers] == [
        "active (disconnected)",
        "waiting (presumed down)",
        "active (connected)",
    ]
    assert [g.group for g in list_groups(s)] == [G0, G1, other]
    assert [c.label for c in list_groups(s, namespace="other")[0].consumers] == [
        "deactivating (disconnected)",
        "waiting (connected)",
    ]


# --- D11: an answer names the consumer that answers -------------------------------------------


def answer(connection: str, sub: int = 0, gid: GroupId = GID) -> ActivateConsumer:
    return ActivateConsumer(gid.namespace, gid.stream, gid.name, connection, sub)


def test_late_answer_of_another_consumer_leaves_the_pending_step_down_pending() -> None:
    s = state({GID: grp("p/0 CD", "q/0 CW", index=1)})
    s2, reply, effects = apply(s, answer("q", 0))  # q was never told to step down
    assert (s2, reply, effects) == (s, OK, [])
    s3, effects = run(s, answer("p", 0))  # the pending one answers: hand over
    assert view(s3) == {GID: ["p/0 CW", "q/0 CA"]}
    assert effects == [act("q", 0)]


def test_anonymous_answer_still_counts_for_the_pending_step_down() -> None:
    s, effects = run(state({GID: grp("p/0 CD", "q/0 CW", index=1)}), activate())
    assert view(s) == {GID: ["p/0 CW", "q/0 CA"]}
    assert effects == [act("q", 0)]


def test_activate_names_both_connection_and_subscription_or_neither() -> None:
    with pytest.raises(ValueError, match="together"):
        ActivateConsumer("/", "s", "g", "p")


# --- D12: a deactivating consumer whose connection is lost blocks its group -----------------


def stepping_down_x_lost() -> CoordinatorState:
    """The trigger: x is active in a partitioned group; z registers, so x is told to step
    down (1 mod 2 chooses z); x's connection is lost before its answer is in. x may still
    be processing: its messages come from the producer, not through the coordinator."""
    s, effects = run(state(), register("x", 0, index=1))
    assert effects == [watch("x"), act("x", 0)]
    s, effects = run(s, register("z", 0, index=1))
    assert view(s) == {GID: ["x/0 CD", "z/0 CW"]}
    assert effects == [watch("z"), step("x", 0)]

    s, effects = run(s, lost("x", now=1000.0))

    assert view(s) == {GID: ["x/0 DD", "z/0 CW"]}
    assert effects == lost_effects("x")  # z is not activated (RabbitMQ v6 activates it here)
    return s


def test_lost_deactivating_consumer_blocks_its_group_until_its_timer() -> None:
    s = stepping_down_x_lost()

    # Nothing moves while x is disconnected: another consumer's answer (D11), a newcomer,
    # a waiting consumer leaving.
    assert apply(s, answer("z", 0)) == (s, OK, [])
    joined = apply(s, register("w", 0, index=1))
    assert joined.reply == Registered(active=False)
    assert view(joined.state) == {GID: ["x/0 DD", "z/0 CW", "w/0 CW"]}
    assert joined.effects == [watch("w")]
    left, effects = run(joined.state, unregister("w"))
    assert left == s
    assert effects == [unwatch("w")]

    # Its timer fires: x is presumed down and ignored, and the group chooses z.
    s, effects = run(s, DisconnectedTimeout("x"))
    assert view(s) == {GID: ["x/0 PW", "z/0 CA"]}
    assert effects == [act("z", 0)]

    # x back later is not told anything: it stopped when it was cut off, and its group
    # no longer waits for it.
    s, effects = run(s, ConnectionReconnected("x"))
    assert view(s) == {GID: ["x/0 CW", "z/0 CA"]}
    assert effects == []


def test_lost_deactivating_consumer_back_is_told_again_and_its_answer_hands_over() -> None:
    s = stepping_down_x_lost()

    # Back in time: connected and still deactivating. It may never have got the
    # step-down, so it is told again, and the group waits for its answer.
    s, effects = run(s, ConnectionReconnected("x"))
    assert view(s) == {GID: ["x/0 CD", "z/0 CW"]}
    assert effects == [step("x", 0), cancel("x")]

    assert apply(s, answer("z", 0)) == (s, OK, [])  # not z's step-down (D11)
    raced, effects = run(s, DisconnectedTimeout("x"))  # the timer raced its cancel
    assert raced == s
    assert effects == []

    s, effects = run(s, answer("x", 0))  # x finished and answers, over its new stream
    assert view(s) == {GID: ["x/0 CW", "z/0 CA"]}
    assert effects == [act("z", 0)]


def test_lost_deactivating_consumer_leaving_hands_over() -> None:
    s = stepping_down_x_lost()
    handed_over = {GID: ["z/0 CA"]}

    for command in (
        ConnectionDown("x"),
        unregister("x"),
        PurgeStaleConnections(connections=("x",)),
        evaluate(),
    ):
        after, effects = run(s, command)
        assert view(after) == handed_over, command
        assert effects == [act("z", 0), cancel("x"), unwatch("x")], command

    # An answer that is applied while x is disconnected (its own, sent before the loss,
    # or an operator's anonymous unblock) counts for the step-down: x waits, z starts.
    for command in (answer("x", 0), activate()):
        after, effects = run(s, command)
        assert view(after) == {GID: ["x/0 DW", "z/0 CA"]}, command
        assert effects == [act("z", 0)], command


def test_lost_deactivating_consumer_blocks_a_simple_group() -> None:
    # A simple group never steps its active consumer down itself; the state is built by
    # hand, as in the port of 46.
    s = state({GID: grp("x/0 CD", "z/0 CW")})
    s, effects = run(s, lost("x"))
    assert view(s) == {GID: ["x/0 DD", "z/0 CW"]}
    assert effects == lost_effects("x")

    joined = apply(s, register("w", 0))
    assert joined.reply == Registered(active=False)
    assert view(joined.state) == {GID: ["x/0 DD", "z/0 CW", "w/0 CW"]}
    s, effects = run(joined.state, unregister("z"))
    assert view(s) == {GID: ["x/0 DD", "w/0 CW"]}
    assert effects == [unwatch("z")]

    back, effects = run(s, ConnectionReconnected("x"))
    assert view(back) == {GID: ["x/0 CD", "w/0 CW"]}
    assert effects == [step("x", 0), cancel("x")]

    s, effects = run(s, DisconnectedTimeout("x"))
    assert view(s) == {GID: ["x/0 PW", "w/0 CA"]}
    assert effects == [act("w", 0)]


def test_recover_keeps_a_lost_deactivating_consumer_blocking_until_its_timer() -> None:
    s = stepping_down_x_lost()

    after, effects = run(s, Recover(now=1030.0))

    # Nothing is sent to x (it has no connection; it is told again when it comes back)
    # nor to z; x's timer keeps its deadline (D1).
    assert after == s
    assert effects == [watch("x"), watch("z"), timer("x", 30.0)]
    assert run(s, answer("z", 0))[0] == s  # still blocked

    back, effects = run(s, ConnectionReconnected("x"))
    assert view(back) == {GID: ["x/0 CD", "z/0 CW"]}
    assert effects == [step("x", 0), cancel("x")]

    s, effects = run(s, DisconnectedTimeout("x"))  # the re-armed timer
    assert view(s) == {GID: ["x/0 PW", "z/0 CA"]}
    assert effects == [act("z", 0)]


def test_joins_during_a_pending_step_down_are_coalesced_into_one_hand_over() -> None:
    """Issue 6's "rebalance work is queued and coalesced per group": a partitioned group
    has at most one step-down outstanding, and the consumer activated when it is answered
    is the one the rule chooses from the membership *then*. Three joins while the active
    consumer finishes cause one hand-over, straight to the final choice, not a chain of
    activations and step-downs through every intermediate membership."""
    s = state()
    s, _ = run(s, register("a", 0, index=3))

    s, effects = run(s, register("b", 0, index=3))  # chosen: 3 mod 2 = 1, b
    assert effects == [watch("b"), step("a", 0)]
    s, effects = run(s, register("c", 0, index=3))  # chosen: 3 mod 3 = 0, a again
    assert effects == [watch("c")], "a is stepping down already: nothing more to do"
    s, effects = run(s, register("d", 0, index=3))  # chosen: 3 mod 4 = 3, d
    assert effects == [watch("d"), step("a", 0)], "the same step-down, repeated (cheap)"
    assert view(s) == {GID: ["a/0 CD", "b/0 CW", "c/0 CW", "d/0 CW"]}

    s, effects = run(s, activate())

    assert effects == [act("d", 0)], "one activation, of the final choice"
    assert view(s) == {GID: ["a/0 CW", "b/0 CW", "c/0 CW", "d/0 CA"]}
