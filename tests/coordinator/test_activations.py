"""`activation_changes`: what each command did to who is active, read from the states the
pure machine returns (no actor, no clock).

A change prints as ``"<connection>/<subscription> <event> (<reason>)"`` through ``seen``,
so each test asserts the whole list a command produced, in order.
"""

from __future__ import annotations

from pykka_delivery.coordinator import (
    SIMPLE,
    ActivateConsumer,
    Command,
    ConnectionDown,
    ConnectionLost,
    ConnectionReconnected,
    ConsumerId,
    CoordinatorSettings,
    CoordinatorState,
    CreateStream,
    DisconnectedTimeout,
    EvaluateGroup,
    PurgeStaleConnections,
    RegisterConsumer,
    UnregisterConsumer,
    activation_changes,
    apply,
    initial_state,
)
from pykka_delivery.coordinator.activations import ActivationChange

NS, STREAM, NAME = "ns", "orders", "app"


def register(connection: str, partition: int = SIMPLE) -> RegisterConsumer:
    return RegisterConsumer(
        NS, STREAM, NAME, connection, 0, "node", partition, f"owner-{connection}"
    )


def run(state: CoordinatorState, *commands: Command) -> CoordinatorState:
    for command in commands:
        state = apply(state, command).state
    return state


def changes_of(
    state: CoordinatorState, command: Command
) -> tuple[CoordinatorState, list[ActivationChange]]:
    after = apply(state, command).state
    return after, activation_changes(state, after, command)


def seen(changes: list[ActivationChange]) -> list[str]:
    return [
        f"{c.consumer.connection}/{c.consumer.subscription_id} {c.event.value} ({c.reason.value})"
        for c in changes
    ]


def test_the_first_registration_activates_with_reason_registered_and_replaces_nobody() -> None:
    _, changes = changes_of(initial_state(), register("a"))

    assert seen(changes) == ["a/0 activated (registered)"]
    assert changes[0].replaced is None
    assert changes[0].consumer == ConsumerId("a", 0, "owner-a")
    assert changes[0].partition_index == SIMPLE


def test_a_waiting_registration_changes_nobody() -> None:
    state = run(initial_state(), register("a"))

    _, changes = changes_of(state, register("b"))

    assert changes == []


def test_unregistering_the_active_deactivates_it_then_activates_the_next() -> None:
    state = run(initial_state(), register("a"), register("b"))

    _, changes = changes_of(state, UnregisterConsumer(NS, STREAM, NAME, "a", 0))

    assert seen(changes) == ["a/0 deactivated (unregistered)", "b/0 activated (unregistered)"]
    assert changes[1].replaced == ConsumerId("a", 0, "owner-a")


def test_a_partitioned_rebalance_steps_down_then_the_answer_hands_over() -> None:
    # Modulo placement: the second consumer of one partition takes it over (a step-down).
    state = run(initial_state(CoordinatorSettings(partition_assignment="modulo")), register("a", 1))

    state, joined = changes_of(state, register("b", 1))
    _, answered = changes_of(state, ActivateConsumer(NS, STREAM, NAME, "a", 0))

    assert seen(joined) == ["a/0 stepping_down (rebalanced)"]
    assert seen(answered) == ["a/0 deactivated (stepped_down)", "b/0 activated (stepped_down)"]


def test_a_lost_active_connection_is_disconnected_then_presumed_down_hands_over() -> None:
    state = run(initial_state(), register("a"), register("b"))

    state, lost = changes_of(state, ConnectionLost("a", now=100.0))
    _, timed_out = changes_of(state, DisconnectedTimeout("a"))

    assert seen(lost) == ["a/0 disconnected (connection_lost)"]
    assert seen(timed_out) == ["a/0 deactivated (presumed_down)", "b/0 activated (presumed_down)"]


def test_a_disconnected_active_that_returns_is_reconnected() -> None:
    state = run(initial_state(), register("a"), ConnectionLost("a", now=1.0))

    _, changes = changes_of(state, ConnectionReconnected("a"))

    assert seen(changes) == ["a/0 reconnected (reconnected)"]


def test_a_presumed_down_active_that_returns_is_told_to_step_down() -> None:
    state = run(
        initial_state(),
        register("a"),
        register("b"),
        ConnectionLost("a", now=1.0),
        DisconnectedTimeout("a"),
    )

    _, changes = changes_of(state, ConnectionReconnected("a"))

    assert seen(changes) == ["a/0 stepping_down (reconnected)"]


def test_a_presumed_down_active_alone_is_activated_again_when_it_returns() -> None:
    state = run(
        initial_state(), register("a"), ConnectionLost("a", now=1.0), DisconnectedTimeout("a")
    )

    _, changes = changes_of(state, ConnectionReconnected("a"))

    assert seen(changes) == ["a/0 activated (reconnected)"]


def test_a_goodbye_of_the_active_connection_hands_over_with_reason_connection_closed() -> None:
    state = run(initial_state(), register("a"), register("b"))

    _, changes = changes_of(state, ConnectionDown("a"))

    assert seen(changes) == [
        "a/0 deactivated (connection_closed)",
        "b/0 activated (connection_closed)",
    ]


def test_a_purge_and_an_evaluation_name_their_reason() -> None:
    state = run(initial_state(), register("a"), register("b"))
    lost = run(state, ConnectionLost("a", now=1.0))

    _, purged = changes_of(state, PurgeStaleConnections(connections=("a",)))
    _, evaluated = changes_of(lost, EvaluateGroup(NS, STREAM, NAME))

    assert seen(purged) == ["a/0 deactivated (purged)", "b/0 activated (purged)"]
    assert seen(evaluated) == ["a/0 deactivated (evaluated)", "b/0 activated (evaluated)"]


def test_a_command_that_touches_no_group_changes_nobody() -> None:
    state = run(initial_state(), register("a"))

    _, changes = changes_of(state, CreateStream(NS, STREAM, 4))

    assert changes == []
