"""Fencing epochs in the coordinator machine: each activation of a group takes the group's
next epoch, updates and answers name it, and it survives replay, snapshots and the
removal of its group (docs/coordinator.md, "Fencing epochs")."""

from __future__ import annotations

from pykka_delivery.coordinator import (
    ActivateConsumer,
    Command,
    ConnectionLost,
    ConnectionReconnected,
    CoordinatorClientSettings,
    CoordinatorSettings,
    CoordinatorState,
    DisconnectedTimeout,
    GroupId,
    Recover,
    RegisterConsumer,
    SendConsumerUpdate,
    UnregisterConsumer,
    UpdateSettings,
    apply,
    initial_state,
    replay,
    wire,
)
from pykka_delivery.coordinator.commands import Refused, Registered
from pykka_delivery.coordinator.effects import Effect
from pykka_delivery.coordinator.store import (
    decode_command,
    decode_state,
    encode_command,
    encode_state,
)

GID = GroupId("ns", "orders", "app")
PARTITION = GroupId("ns", "orders-1", "app")
MODULO = CoordinatorSettings(partition_assignment="modulo")
"""RabbitMQ's placement: a second consumer of one partition takes it over (a step-down)."""


def register(connection: str, gid: GroupId = GID, index: int = -1) -> RegisterConsumer:
    return RegisterConsumer(
        gid.namespace, gid.stream, gid.name, connection, 0, "n-" + connection, index
    )


def unregister(connection: str, gid: GroupId = GID) -> UnregisterConsumer:
    return UnregisterConsumer(gid.namespace, gid.stream, gid.name, connection, 0)


def answer(connection: str, epoch: int, gid: GroupId = GID) -> ActivateConsumer:
    return ActivateConsumer(gid.namespace, gid.stream, gid.name, connection, 0, epoch)


def run(state: CoordinatorState, *commands: Command) -> tuple[CoordinatorState, list[Effect]]:
    """Apply commands that must succeed; the state and the last one's effects."""
    effects: list[Effect] = []
    for command in commands:
        outcome = apply(state, command)
        assert not isinstance(outcome.reply, Refused), outcome.reply
        state, effects = outcome.state, outcome.effects
    return state, effects


def updates(effects: list[Effect]) -> list[tuple[str, bool, int]]:
    """Each consumer update as (connection, active, epoch)."""
    return [(e.connection, e.active, e.epoch) for e in effects if isinstance(e, SendConsumerUpdate)]


def epoch_of(state: CoordinatorState, connection: str, gid: GroupId = GID) -> int:
    consumer = state.groups[gid].find(connection, 0)
    assert consumer is not None
    return consumer.epoch


def test_a_groups_first_activation_takes_epoch_1_and_the_registration_reply_names_it() -> None:
    outcome = apply(initial_state(), register("a"))

    assert outcome.reply == Registered(active=True)
    assert isinstance(outcome.reply, Registered) and outcome.reply.epoch == 1
    assert updates(outcome.effects) == [("a", True, 1)]


def test_a_waiting_consumers_registration_reply_names_no_epoch() -> None:
    state, _ = run(initial_state(), register("a"))

    outcome = apply(state, register("b"))

    assert isinstance(outcome.reply, Registered) and (
        outcome.reply.active,
        outcome.reply.epoch,
    ) == (False, 0)


def test_a_retried_registration_of_the_active_consumer_replies_its_epoch() -> None:
    state, _ = run(initial_state(), register("a"))

    outcome = apply(state, register("a"))

    assert isinstance(outcome.reply, Registered) and outcome.reply.epoch == 1


def test_the_next_active_consumer_of_a_group_takes_the_next_epoch() -> None:
    state, _ = run(initial_state(), register("a"), register("b"))

    state, effects = run(state, unregister("a"))

    assert updates(effects) == [("b", True, 2)]
    assert state.groups[GID].last_epoch == 2


def test_a_step_down_names_the_epoch_it_ends_and_its_answer_activates_the_next_epoch() -> None:
    state, _ = run(initial_state(MODULO), register("a", PARTITION, 1))
    state, effects = run(state, register("b", PARTITION, 1))  # b is now the chosen one
    assert updates(effects) == [("a", False, 1)]

    state, effects = run(state, answer("a", 1, PARTITION))

    assert updates(effects) == [("b", True, 2)]


def test_an_answer_naming_an_older_epoch_than_the_pending_step_down_changes_nothing() -> None:
    """a stepped down from epoch 1, was made active again (epoch 2) and is told to step
    down again: its late answer to the first step-down must not hand over while it may
    still be finishing epoch 2."""
    state, _ = run(initial_state(MODULO), register("a", PARTITION, 1), register("b", PARTITION, 1))
    state, _ = run(state, unregister("b", PARTITION))  # a's step-down is still pending (epoch 1)
    state, effects = run(state, answer("a", 1, PARTITION))
    assert updates(effects) == [("a", True, 2)]
    state, effects = run(state, register("b", PARTITION, 1))
    assert updates(effects) == [("a", False, 2)]

    outcome = apply(state, answer("a", 1, PARTITION))

    assert outcome.state is state
    assert outcome.effects == []


def test_an_answer_without_an_epoch_is_not_checked() -> None:
    state, _ = run(initial_state(MODULO), register("a", PARTITION, 1), register("b", PARTITION, 1))

    state, effects = run(state, answer("a", 0, PARTITION))

    assert updates(effects) == [("b", True, 2)]


def test_a_presumed_down_consumer_that_comes_back_is_told_to_step_down_from_its_old_epoch() -> None:
    state, _ = run(initial_state(), register("a"), register("b"))
    state, effects = run(state, ConnectionLost("a", 1000.0), DisconnectedTimeout("a"))
    assert updates(effects) == [("b", True, 2)]

    state, effects = run(state, ConnectionReconnected("a"))

    assert updates(effects) == [("a", False, 1)]
    assert epoch_of(state, "b") == 2


def test_a_lost_active_consumer_that_comes_back_in_time_keeps_its_epoch() -> None:
    state, _ = run(initial_state(), register("a"), register("b"), ConnectionLost("a", 1000.0))

    state, effects = run(state, ConnectionReconnected("a"))

    assert updates(effects) == []
    assert epoch_of(state, "a") == 1
    assert state.groups[GID].last_epoch == 1


def test_recover_resends_the_current_epochs_without_taking_new_ones() -> None:
    state, _ = run(initial_state(), register("a"), register("b"), unregister("a"))

    again, effects = run(state, Recover(2000.0))

    assert updates(effects) == [("b", True, 2)]
    assert again == state


def test_a_group_created_again_starts_above_every_epoch_a_removed_group_reached() -> None:
    """A consumer of the removed group may still be around (purged while partitioned):
    the new group's first consumer must outrank it."""
    state, _ = run(initial_state(), register("a"), register("b"), unregister("a"), unregister("b"))
    assert GID not in state.groups
    assert state.epoch_floor == 2

    state, effects = run(state, register("c"))

    assert updates(effects) == [("c", True, 3)]


def test_other_groups_keep_their_own_counters() -> None:
    state, _ = run(initial_state(), register("a"), register("b"), unregister("a"))

    state, effects = run(state, register("x", PARTITION, 1))

    assert updates(effects) == [("x", True, 1)]


def test_replaying_the_commands_gives_the_same_epochs() -> None:
    commands: list[Command] = [
        register("a"),
        register("b"),
        unregister("a"),
        unregister("b"),
        register("c"),
        register("d", PARTITION, 1),
        register("e", PARTITION, 1),
        answer("d", 3, PARTITION),
    ]
    state = initial_state(MODULO)
    for command in commands:
        state = apply(state, command).state

    again = replay(commands, initial_state(MODULO))

    assert again == state
    # The partition's group was created after a removal: it starts above the floor too.
    assert (again.epoch_floor, epoch_of(again, "c"), epoch_of(again, "e", PARTITION)) == (2, 3, 4)


def test_a_snapshot_keeps_the_epochs_and_the_floor() -> None:
    state, _ = run(
        initial_state(),
        register("a"),
        register("b"),
        unregister("a"),
        unregister("b"),
        register("c"),
    )

    loaded = decode_state(encode_state(state))

    assert loaded == state
    assert (loaded.epoch_floor, loaded.groups[GID].last_epoch, epoch_of(loaded, "c")) == (2, 3, 3)


def test_a_snapshot_written_before_epochs_loads_with_epochs_0_and_the_next_activation_takes_1() -> (
    None
):
    state, _ = run(initial_state(), register("a"), register("b"))
    old = encode_state(state)
    del old["epoch_floor"]
    for item in old["groups"]:
        del item["value"]["last_epoch"]
        for consumer in item["value"]["consumers"]:
            del consumer["epoch"]

    loaded = decode_state(old)
    assert (loaded.epoch_floor, loaded.groups[GID].last_epoch, epoch_of(loaded, "a")) == (0, 0, 0)
    _, effects = run(loaded, unregister("a"))

    assert updates(effects) == [("b", True, 1)]


def test_an_answer_with_a_negative_epoch_is_refused_naming_the_field() -> None:
    try:
        ActivateConsumer("ns", "orders", "app", "a", 0, -1)
    except ValueError as error:
        assert "ActivateConsumer.epoch" in str(error)
    else:
        raise AssertionError("a negative epoch was accepted")


def test_an_answer_on_the_wire_carries_its_epoch_and_an_anonymous_one_too() -> None:
    named = wire.command_of(wire.activate_message(1, GID, 0, 5), "conn", "node", "")
    anonymous = wire.command_of(wire.activate_message(2, GID, None, 6), "conn", "node", "")

    assert named == ActivateConsumer("ns", "orders", "app", "conn", 0, 5)
    assert anonymous == ActivateConsumer("ns", "orders", "app", epoch=6)


def test_an_old_clients_answer_without_an_epoch_reads_as_unknown() -> None:
    message = wire.activate_message(1, GID, 0)

    assert message.activate.epoch == 0
    assert wire.command_of(message, "conn", "node", "") == ActivateConsumer(
        "ns", "orders", "app", "conn", 0
    )


def test_an_update_and_a_registration_reply_carry_their_epoch_on_the_wire() -> None:
    update = wire.update_message(SendConsumerUpdate("conn", 3, GID, False, 9)).update
    reply = wire.reply_of(wire.reply_message(1, Registered(True, 4)).reply)

    assert (update.subscription_id, update.active, update.epoch) == (3, False, 9)
    assert isinstance(reply, Registered) and (reply.active, reply.epoch) == (True, 4)


def test_the_default_disconnected_timeout_is_above_a_clients_own_detection_of_a_break() -> None:
    """A blip the client detects and reconnects from must cost no hand-over (D13)."""
    client = CoordinatorClientSettings()
    detection = client.keepalive_time + client.keepalive_timeout

    assert CoordinatorSettings().disconnected_timeout == 20.0
    assert CoordinatorSettings().disconnected_timeout > detection + client.reconnect_backoff_min
    assert UpdateSettings().settings() == CoordinatorSettings()


def test_an_answer_with_its_epoch_is_stored_in_the_log_and_read_back() -> None:
    decoded = decode_command(*encode_command(answer("a", 7)))
    written_before_epochs = '{"namespace":"ns","stream":"orders","name":"app"}'

    assert decoded == answer("a", 7)
    assert isinstance(decoded, ActivateConsumer) and decoded.epoch == 7
    assert decode_command("ActivateConsumer", written_before_epochs) == ActivateConsumer(
        "ns", "orders", "app"
    )
