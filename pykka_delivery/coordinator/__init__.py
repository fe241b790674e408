"""The single-active-consumer coordinator: a pure state machine (this package's cores).

`apply(state, command)` returns the new state, a reply and the effects for the shell; see
`machine` for the theory of operation and docs/coordinator.md for the rules and where they
differ from RabbitMQ's. The command names are the coordinator's own: its
`RegisterConsumer` adds a consumer to a group, unlike the delivery protocol's
`pykka_delivery.actors.messages.RegisterConsumer`.
"""

from pykka_delivery.coordinator.commands import (
    OK,
    ActivateConsumer,
    Command,
    ConnectionDown,
    ConnectionLost,
    ConnectionReconnected,
    DisconnectedTimeout,
    EvaluateGroup,
    NodeReconnected,
    Ok,
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
    CancelTimer,
    CheckConnection,
    Effect,
    SendConsumerUpdate,
    StartTimer,
    UnwatchConnection,
    WatchConnection,
)
from pykka_delivery.coordinator.machine import Outcome, apply, initial_state, replay
from pykka_delivery.coordinator.queries import (
    GroupInfo,
    list_groups,
    list_nodes,
    settings_change,
)
from pykka_delivery.coordinator.state import (
    SIMPLE,
    Activity,
    Connectivity,
    Consumer,
    CoordinatorSettings,
    CoordinatorState,
    Group,
    GroupId,
)

__all__ = [
    "OK",
    "SIMPLE",
    "ActivateConsumer",
    "Activity",
    "CancelTimer",
    "CheckConnection",
    "Command",
    "ConnectionDown",
    "ConnectionLost",
    "ConnectionReconnected",
    "Connectivity",
    "Consumer",
    "CoordinatorSettings",
    "CoordinatorState",
    "DisconnectedTimeout",
    "Effect",
    "EvaluateGroup",
    "Group",
    "GroupId",
    "GroupInfo",
    "NodeReconnected",
    "Ok",
    "Outcome",
    "PurgeStaleConnections",
    "Recover",
    "Refusal",
    "Refused",
    "RegisterConsumer",
    "Registered",
    "Reply",
    "SendConsumerUpdate",
    "StartTimer",
    "UnregisterConsumer",
    "UnwatchConnection",
    "UpdateSettings",
    "WatchConnection",
    "apply",
    "initial_state",
    "list_groups",
    "list_nodes",
    "replay",
    "settings_change",
]
