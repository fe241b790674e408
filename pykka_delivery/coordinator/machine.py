"""The single-active-consumer coordinator's state machine, pure: commands in, effects out.

Theory of operation (a port of RabbitMQ's ``rabbit_stream_sac_coordinator``; see
docs/coordinator.md):

* Consumers register in groups keyed by (namespace, stream, consumer name). Each group has
  at most one consumer that counts as active (active or deactivating, not presumed down).
* Simple group: the first registered becomes active; when the active consumer leaves, the
  first eligible (connected) consumer takes over at once.
* Partitioned group (a partition of a super stream): the active consumer is the
  partition's target in the sticky assignment of all the partitions of its consumer group
  (the default, D14; `sticky`), or ``eligible[partition_index % len(eligible)]`` (the
  "modulo" setting, RabbitMQ's rule). When that changes, the current active one
  is told to step down (``SendConsumerUpdate(active=False)``) and becomes deactivating; the
  new one is activated only when the step-down is answered with `ActivateConsumer`, so two
  consumers never consume at once.
* A lost connection makes its consumers disconnected and starts a timer. A disconnected
  active or deactivating consumer blocks its group: it may still be consuming, since the
  messages do not travel through the coordinator (decision D12: RabbitMQ v6 lets a lost
  deactivating consumer go at once). When the timer fires its consumers are presumed down
  and ignored; the group chooses another active consumer. When the connection comes
  back, a presumed-down active consumer and a deactivating one are told to step down.
* Each activation takes its group's next fencing epoch (`Group.activated`), above every
  epoch the group's key had, even before the group was removed (`epoch_floor`); updates
  and answers name it, and an answer naming an older epoch than the pending step-down's
  changes nothing.
* Nothing here reads a clock, sends, or keeps an index that could drift from the groups:
  which groups a connection is in is derived from the groups each time.

This module owns every transition: only it builds new `Group` and `CoordinatorState`
records. The rules are the four helpers of the reference's section 2.1:
`_activate_chosen`, `_rebalance` (``maybe_rebalance_group``), `_after_removal`
(``handle_consumer_removal``) and `_chosen` (``evaluate_active_consumer``), plus
`_follow_targets` for the sticky rule's siblings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from types import MappingProxyType
from typing import Any, NamedTuple

from pykka_delivery.coordinator.bookkeeping import with_bookkeeping
from pykka_delivery.coordinator.commands import (
    OK,
    ActivateConsumer,
    Command,
    ConnectionDown,
    ConnectionLost,
    ConnectionReconnected,
    CreateStream,
    DisconnectedTimeout,
    EvaluateGroup,
    NodeReconnected,
    PurgeStaleConnections,
    Recover,
    Refusal,
    Refused,
    RegisterConsumer,
    Registered,
    Reply,
    UnregisterConsumer,
    UpdateSettings,
)
from pykka_delivery.coordinator.effects import (
    CheckConnection,
    Effect,
    StartTimer,
    WatchConnection,
    activate,
    step_down,
)
from pykka_delivery.coordinator.state import (
    Activity,
    Connectivity,
    Consumer,
    CoordinatorSettings,
    CoordinatorState,
    Group,
    GroupId,
    changed_group_ids,
)
from pykka_delivery.coordinator.sticky import off_target, sticky_choice

__all__ = ["Outcome", "apply", "initial_state", "replay"]

_ACTIVE = Activity.ACTIVE
_WAITING = Activity.WAITING
_DEACTIVATING = Activity.DEACTIVATING
_CONNECTED = Connectivity.CONNECTED
_DISCONNECTED = Connectivity.DISCONNECTED
_PRESUMED_DOWN = Connectivity.PRESUMED_DOWN


class Outcome(NamedTuple):
    """What `apply` returns: the new state, the reply to the command's sender, and the
    effects for the shell to carry out in order."""

    state: CoordinatorState
    reply: Reply
    effects: list[Effect]


def initial_state(settings: CoordinatorSettings | None = None) -> CoordinatorState:
    """A coordinator with no groups."""
    return CoordinatorState(settings=settings or CoordinatorSettings())


def apply(state: CoordinatorState, command: Command) -> Outcome:
    """Apply ``command`` to ``state``.

    Never raises for a domain problem: a refused command (or an unknown one) gives a
    `Refused` reply, ``state`` itself and no effects. Effects list watches of new
    connections first, then consumer updates and timers in group order, then cancelled
    timers and unwatches.
    """
    handler = _HANDLERS.get(type(command))
    if handler is None:
        names = ", ".join(cls.__name__ for cls in _HANDLERS)
        msg = f"unknown command {type(command).__name__}: apply() takes one of {names}"
        return Outcome(state, Refused(Refusal.UNKNOWN_COMMAND, msg), [])
    new_state, reply, effects = handler(state, command)
    if isinstance(reply, Refused):
        return Outcome(state, reply, [])
    if isinstance(command, Recover):
        return Outcome(new_state, reply, effects)
    changed = changed_group_ids(state.groups, new_state.groups)
    if changed and new_state.settings.sticky:
        new_state = _follow_targets(new_state, changed, effects)
    return Outcome(new_state, reply, with_bookkeeping(state, new_state, command, effects, changed))


def replay(commands: Iterable[Command], state: CoordinatorState | None = None) -> CoordinatorState:
    """The state after applying ``commands`` in order (from an empty coordinator by
    default), effects discarded: how a command log is read back."""
    state = initial_state() if state is None else state
    for command in commands:
        state = apply(state, command).state
    return state


# --- the selection rules (reference 2.1) ------------------------------------------------------

_Changed = tuple[Group, list[Effect]]


def _chosen(state: CoordinatorState, gid: GroupId, group: Group) -> Consumer | None:
    """`Group.chosen`, or for a partitioned group under the sticky rule (the default,
    D14) `sticky.sticky_choice` over its siblings in ``state``."""
    if group.is_partitioned and state.settings.sticky:
        return sticky_choice(state, gid, group)
    return group.chosen()


def _activate_chosen(state: CoordinatorState, gid: GroupId, group: Group) -> _Changed:
    """No consumer counts as active: make the chosen one active and tell it."""
    chosen = _chosen(state, gid, group)
    if chosen is None or not chosen.is_connected:
        return group, []
    group, chosen = group.activated(chosen)
    return group, [activate(gid, chosen)]


def _rebalance(state: CoordinatorState, gid: GroupId, group: Group) -> _Changed:
    """Bring the group in line with its rule (``maybe_rebalance_group``).

    A simple group keeps its active consumer (moved to the front, so it stays the first
    eligible one). A partitioned group whose active consumer is no longer the chosen one
    tells it to step down; the chosen one waits for the answer. With no active consumer,
    the chosen one is activated. A disconnected active or deactivating consumer (DA, DD)
    is always the chosen one: its group waits, and it is sent nothing.
    """
    if not group.consumers:
        return group, []
    current = group.active()
    if current is None:
        return _activate_chosen(state, gid, group)
    if not group.is_partitioned:
        return group.moved_to_front(current), []
    chosen = _chosen(state, gid, group)
    if chosen is None or chosen.key == current.key:
        return group, []
    # A consumer already deactivating is told again (RabbitMQ does too): cheap, and it
    # repairs a lost step-down.
    return (
        group.updated(current.with_status(activity=_DEACTIVATING)),
        [step_down(gid, current)],
    )


def _after_removal(
    state: CoordinatorState, gid: GroupId, group: Group, active_removed: bool
) -> _Changed:
    """Consumers left the group (``handle_consumer_removal``).

    A simple group only reacts when its active consumer left. A partitioned group also
    re-checks its rule when another consumer left, since ``len(eligible)`` changed.
    """
    if not group.consumers:
        return group, []
    if not active_removed and (not group.is_partitioned or group.active() is None):
        return group, []
    return _rebalance(state, gid, group)


# --- handlers: (state, command) -> (state, reply, effects) ------------------------------------

_Result = tuple[CoordinatorState, Reply, list[Effect]]


def _register(state: CoordinatorState, command: RegisterConsumer) -> _Result:
    gid = command.group_id
    group = state.groups.get(gid)
    if group is not None and group.partition_index != command.partition_index:
        return state, _partition_conflict(gid, group, command), []
    if group is None:
        # Above every epoch a removed group reached: a stale consumer of one never
        # outranks this group's consumers.
        group = Group(command.partition_index, last_epoch=state.epoch_floor)
    existing = group.find(command.connection, command.subscription_id)
    if existing is not None:
        # A retried registration: idempotent, replies the stored status (reference 2.2
        # replies a would-be status in simple groups and rebalances in partitioned ones).
        active = existing.counts_as_active
        return state, Registered(active, existing.epoch if active else 0), []
    newcomer = Consumer(command.connection, command.subscription_id, command.node, command.owner)
    if not group.consumers or (not group.is_partitioned and group.active() is None):
        # The group's first consumer, or a simple group where nobody counts as active.
        group = replace(group, consumers=(*group.consumers, newcomer))
        group, newcomer = group.activated(newcomer)
        effects: list[Effect] = [activate(gid, newcomer)]
    else:
        # It waits. A partitioned group re-checks its rule with the newcomer counted, so
        # the newcomer is never activated on registration, only after a step-down.
        group = replace(group, consumers=(*group.consumers, newcomer))
        group, effects = _rebalance(state, gid, group) if group.is_partitioned else (group, [])
    stored = group.find(command.connection, command.subscription_id)
    active = stored is not None and stored.counts_as_active
    epoch = stored.epoch if stored is not None and active else 0
    return _with_group(state, gid, group), Registered(active, epoch), effects


def _partition_conflict(gid: GroupId, group: Group, command: RegisterConsumer) -> Refused:
    kind = "a partition of a super stream" if group.is_partitioned else "a simple group"
    msg = (
        f"{gid} is {kind} with partition index {group.partition_index}; connection "
        f"{command.connection!r} asked to register subscription {command.subscription_id} "
        f"with partition index {command.partition_index}. A group's partition index is "
        f"fixed by its first consumer: register with partition index "
        f"{group.partition_index}, or use another consumer name."
    )
    return Refused(Refusal.PARTITION_INDEX_CONFLICT, msg)


def _unregister(state: CoordinatorState, command: UnregisterConsumer) -> _Result:
    gid = command.group_id
    key = (command.connection, command.subscription_id)
    group = state.groups.get(gid)
    if group is None or group.find(*key) is None:
        where = "the group does not exist" if group is None else "it is not in the group"
        msg = (
            f"no consumer (connection {command.connection!r}, subscription "
            f"{command.subscription_id}) in {gid}: {where}. It was never registered or "
            f"was already removed (unregistered, connection down, purged): nothing to do."
        )
        return state, Refused(Refusal.CONSUMER_NOT_FOUND, msg), []
    group, removed = group.without(lambda c: c.key == key)
    group, effects = _after_removal(state, gid, group, removed[0].counts_as_active)
    return _with_group(state, gid, group), OK, effects


def _activate(state: CoordinatorState, command: ActivateConsumer) -> _Result:
    gid = command.group_id
    group = state.groups.get(gid)
    if group is None:
        msg = (
            f"cannot activate a consumer in {gid}: the group does not exist (its last "
            f"consumer left). Register a consumer to create it."
        )
        return state, Refused(Refusal.GROUP_NOT_FOUND, msg), []
    if group.disconnected_active() is not None:
        # Blocked: the disconnected active consumer may come back (reference 2.4).
        return state, OK, []
    pending = group.deactivating()
    if pending is None:
        # No step-down pending: a late or repeated answer, or an operator's unblock.
        # Re-checking the rule never switches actives without a step-down.
        group, effects = _rebalance(state, gid, group)
        return _with_group(state, gid, group), OK, effects
    if command.connection and pending.key != (command.connection, command.subscription_id):
        # D11: the answer of an earlier step-down; the pending one is still finishing.
        return state, OK, []
    if 0 < command.epoch < pending.epoch:
        # The same consumer's answer to the step-down of an earlier activation: the
        # current one may still be finishing (an answer without an epoch is not checked).
        return state, OK, []
    # The step-down was answered: every connected consumer waits, the chosen one becomes
    # active and is told so, even when it is the one that just stepped down (#16975).
    # A pending consumer whose connection is lost (DD, D12) waits too, disconnected: its
    # own answer (a request applied after the loss) says it stopped, and an anonymous
    # one is an operator's unblock of a consumer known to be gone.
    group = group.mapped(
        lambda c: c.with_status(activity=_WAITING) if c.is_connected or c.key == pending.key else c
    )
    group, effects = _activate_chosen(state, gid, group)
    return _with_group(state, gid, group), OK, effects


def _connection_down(state: CoordinatorState, command: ConnectionDown) -> _Result:
    state, effects = _remove_connections(state, frozenset({command.connection}))
    return state, OK, effects


def _connection_lost(state: CoordinatorState, command: ConnectionLost) -> _Result:
    connection = command.connection

    def lose(c: Consumer) -> Consumer:
        if c.connection != connection or not c.is_connected:
            return c  # presumed-down consumers stay so: a PA must not count as active again
        # Every activity is kept: CA->DA, CW->DW, and CD->DD (decision D12). A deactivating
        # consumer may still be finishing (maybe it never got its step-down), and its
        # messages do not go through us: it blocks its group until it comes back, its
        # timer fires, or it leaves. RabbitMQ v6 (PR #15353) makes it DW and rebalances
        # at once, safe there only because a disconnected consumer gets no messages.
        return replace(c, connectivity=_DISCONNECTED, disconnected_at=command.now)

    def change(state: CoordinatorState, gid: GroupId, group: Group) -> _Changed:
        return group.mapped(lose), []

    new_state, reply, effects = _for_groups_of(state, connection, change)
    if new_state != state:
        timeout = state.settings.disconnected_timeout
        effects.append(StartTimer(DisconnectedTimeout(connection), timeout))
        # Crashed or cut off? A process found gone is handed over at once (`ConnectionDown`).
        effects.append(CheckConnection(connection))
    return new_state, reply, effects


def _disconnected_timeout(state: CoordinatorState, command: DisconnectedTimeout) -> _Result:
    connection = command.connection

    def presume(c: Consumer) -> Consumer:
        if c.connection != connection or not c.is_disconnected:
            return c  # connected again: the timer is stale
        # DA->PA, DW->PW, DD->PW: a presumed-down deactivating consumer is no longer
        # waited for (D12), and it is not told to step down again if it returns.
        activity = _WAITING if c.activity is _DEACTIVATING else c.activity
        return c.with_status(_PRESUMED_DOWN, activity)

    return _for_groups_of(
        state, connection, lambda st, gid, g: _rebalance_if_changed(st, gid, g, presume)
    )


def _connection_reconnected(state: CoordinatorState, command: ConnectionReconnected) -> _Result:
    connection = command.connection

    def reconnect(state: CoordinatorState, gid: GroupId, group: Group) -> _Changed:
        # A presumed-down active consumer may have kept consuming while its group chose
        # another one: tell it to step down. A deactivating one (DD, D12) is connected
        # and still deactivating: it may not have got its step-down, so it is told again,
        # and its group waits for its answer. The rest of the connection's consumers are
        # connected again as they were, and the group's rule is re-checked.
        told: list[Effect] = []

        def back(c: Consumer) -> Consumer:
            if c.connection != connection:
                return c
            if c.connectivity is _PRESUMED_DOWN and c.activity is _ACTIVE:
                told.append(step_down(gid, c))
                return c.with_status(_CONNECTED, _WAITING)
            if c.is_disconnected and c.activity is _DEACTIVATING:
                told.append(step_down(gid, c))
            return c.with_status(_CONNECTED)

        group, effects = _rebalance(state, gid, group.mapped(back))
        # The re-check may tell the same consumer to step down: once is enough.
        return group, told + [e for e in effects if e not in told]

    return _for_groups_of(state, connection, reconnect)


def _node_reconnected(state: CoordinatorState, command: NodeReconnected) -> _Result:
    connections = {
        c.connection for g in state.groups.values() for c in g.consumers if c.node == command.node
    }
    return state, OK, [CheckConnection(c) for c in sorted(connections)]


def _purge(state: CoordinatorState, command: PurgeStaleConnections) -> _Result:
    nodes = set(command.nodes)
    stale = set(command.connections) | {
        c.connection for g in state.groups.values() for c in g.consumers if c.node in nodes
    }
    # All at once, per group: removing them one connection at a time could activate a
    # consumer of a connection purged next (RabbitMQ PR #13671).
    state, effects = _remove_connections(state, frozenset(stale))
    return state, OK, effects


def _evaluate(state: CoordinatorState, command: EvaluateGroup) -> _Result:
    gid = command.group_id
    group = state.groups.get(gid)
    if group is None:
        msg = f"cannot evaluate {gid}: the group does not exist. List the groups for its key."
        return state, Refused(Refusal.GROUP_NOT_FOUND, msg), []
    dead = set(command.dead_connections)
    group, _ = group.without(lambda c: not c.is_connected or c.connection in dead)
    group, effects = _rebalance(state, gid, group)
    return _with_group(state, gid, group), OK, effects


def _update_settings(state: CoordinatorState, command: UpdateSettings) -> _Result:
    return replace(state, settings=command.settings()), OK, []


def _create_stream(state: CoordinatorState, command: CreateStream) -> _Result:
    """Create or grow a stream of the catalog; the same count again changes nothing (and
    is therefore not logged: the shell logs only commands that change the state)."""
    sid = command.stream_id
    current = state.streams.get(sid)
    limit = state.settings.max_partitions
    if current is not None and command.partitions < current:
        msg = (
            f"{sid} has {current} partitions; asked for {command.partitions}. Partition "
            f"counts never shrink (keys would move, and messages on the dropped partitions "
            f"would be orphaned): ask for {current} or more, or use another stream name."
        )
        return state, Refused(Refusal.PARTITIONS_SHRINK, msg), []
    if command.partitions == current:
        return state, OK, []
    if command.partitions > limit:
        msg = (
            f"cannot give {sid} {command.partitions} partitions: the coordinator allows at "
            f"most {limit} (CoordinatorSettings.max_partitions). Ask for fewer, or raise "
            f"max_partitions in the coordinator's settings."
        )
        return state, Refused(Refusal.PARTITIONS_OVER_LIMIT, msg), []
    streams = dict(state.streams)
    streams[sid] = command.partitions
    return replace(state, streams=MappingProxyType(streams)), OK, []


def _recover(state: CoordinatorState, command: Recover) -> _Result:
    effects: list[Effect] = [WatchConnection(c) for c in sorted(state.connections())]
    # A consumer update decided just before the restart may never have been sent. Sending
    # the current one again is harmless and unblocks a group whose update was lost. A
    # disconnected consumer is sent nothing: a DD is told again when it reconnects, and
    # it keeps blocking its group until then or until its re-armed timer fires (D12).
    for gid in sorted(state.groups):
        for c in state.groups[gid].consumers:
            if c.is_connected and c.activity is _ACTIVE:
                effects.append(activate(gid, c))
            elif c.is_connected and c.activity is _DEACTIVATING:
                effects.append(step_down(gid, c))
    settings = state.settings
    lost_at: dict[str, float] = {}
    for g in state.groups.values():
        for c in g.consumers:
            if c.is_disconnected:
                lost_at[c.connection] = max(
                    lost_at.get(c.connection, c.disconnected_at), c.disconnected_at
                )
    for connection in sorted(lost_at):
        elapsed = max(0.0, command.now - lost_at[connection])
        # The timer keeps its deadline but fires no sooner than recovery_min_delay after the
        # restart (RabbitMQ has no rule between 10 s and the timeout; reference 1.6).
        delay = max(
            min(settings.recovery_min_delay, settings.disconnected_timeout),
            settings.disconnected_timeout - elapsed,
        )
        effects.append(StartTimer(DisconnectedTimeout(connection), delay))
    return state, OK, effects


_HANDLERS: dict[type, Callable[[CoordinatorState, Any], _Result]] = {
    RegisterConsumer: _register,
    UnregisterConsumer: _unregister,
    ActivateConsumer: _activate,
    ConnectionReconnected: _connection_reconnected,
    ConnectionDown: _connection_down,
    ConnectionLost: _connection_lost,
    DisconnectedTimeout: _disconnected_timeout,
    NodeReconnected: _node_reconnected,
    PurgeStaleConnections: _purge,
    EvaluateGroup: _evaluate,
    UpdateSettings: _update_settings,
    Recover: _recover,
    CreateStream: _create_stream,
}


# --- plumbing ------------------------------------------------------------------------------------


def _with_group(state: CoordinatorState, gid: GroupId, group: Group) -> CoordinatorState:
    """``state`` with ``group`` stored under ``gid``; an empty group is deleted."""
    # A proxy's copy copies the dict's table; dict() would hash every GroupId again.
    old = state.groups
    groups = old.copy() if isinstance(old, MappingProxyType) else dict(old)
    if group.consumers:
        groups[gid] = group
        return replace(state, groups=MappingProxyType(groups))
    groups.pop(gid, None)
    # Its epochs are kept as the floor of every group created later (CoordinatorState).
    floor = max(state.epoch_floor, group.last_epoch)
    return replace(state, groups=MappingProxyType(groups), epoch_floor=floor)


def _for_groups_of(
    state: CoordinatorState,
    connection: str,
    change: Callable[[CoordinatorState, GroupId, Group], _Changed],
) -> _Result:
    """Apply ``change`` to each group where ``connection`` has consumers, in key order."""
    effects: list[Effect] = []
    for gid in state.group_ids_of(connection):
        group, changes = change(state, gid, state.groups[gid])
        state = _with_group(state, gid, group)
        effects += changes
    return state, OK, effects


def _rebalance_if_changed(
    state: CoordinatorState, gid: GroupId, group: Group, change: Callable[[Consumer], Consumer]
) -> _Changed:
    changed = group.mapped(change)
    if changed == group:
        return group, []
    return _rebalance(state, gid, changed)


def _follow_targets(
    after: CoordinatorState, changed: set[GroupId], effects: list[Effect]
) -> CoordinatorState:
    """Under the sticky rule, a change in one partition's group can move the target of a
    sibling the command did not touch: step those active consumers down (adds to
    ``effects``, and their keys to ``changed``), so that every partition follows the
    assignment."""
    for gid in off_target(after, changed):
        changed.add(gid)
        group, changes = _rebalance(after, gid, after.groups[gid])
        after = _with_group(after, gid, group)
        effects += changes
    return after


def _remove_connections(
    state: CoordinatorState, connections: frozenset[str]
) -> tuple[CoordinatorState, list[Effect]]:
    """Remove every consumer of ``connections`` (connections down, or a purge)."""
    effects: list[Effect] = []
    for gid in sorted(state.groups):
        group, removed = state.groups[gid].without(lambda c: c.connection in connections)
        if removed:
            active_removed = any(c.counts_as_active for c in removed)
            group, changes = _after_removal(state, gid, group, active_removed)
            state = _with_group(state, gid, group)
            effects += changes
    return state, effects
