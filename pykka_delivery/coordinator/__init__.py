"""The single-active-consumer coordinator: a pure state machine and its shell.

The core: `apply(state, command)` returns the new state, a reply and the effects; see
`machine` for the theory of operation and docs/coordinator.md for the rules and where they
differ from RabbitMQ's. The command names are the coordinator's own: its
`RegisterConsumer` adds a consumer to a group, unlike the delivery protocol's
`pykka_delivery.delivery.messages.RegisterConsumer`.

The shell: `CoordinatorActor` runs the machine, carries out its effects (consumer updates
to connection sinks, timers) and appends every state-changing command to a `CommandLog`
(`SqliteCommandLog` for one durable file) before carrying out its effects. It also keeps
the service directory (`ServiceDirectory`) that work pulling across processes uses as its
registry and where plain producers are found (`announce_producer`, `DirectoryProducers`),
and the stream catalog (`CreateStream`, `list_streams`): partitioned streams created and
grown at run time, with the producers of each stream (`StreamProducer`, `CatalogStream`;
`CoordinatorClient.register_producer`, `watch_streams`). Lag as data:
clients report positions (`ProducerPosition`, `ConsumerPosition`) and ask for the lag
(`CoordinatorClient.lag`, `LagInfo`).
"""

from pykka_delivery.coordinator.activations import (
    ActivationChange,
    ActivationEvent,
    ConsumerId,
    Handover,
    HandoverReason,
    activation_changes,
)
from pykka_delivery.coordinator.actor import (
    DEFAULT_MAX_BATCH,
    DEFAULT_SWEEP_INTERVAL,
    Attach,
    ConnectionSink,
    CoordinatorActor,
    CoordinatorStats,
    Detach,
    Execute,
    GetStatistics,
    ListGroups,
    ListStreams,
)
from pykka_delivery.coordinator.catalog_watch import (
    CatalogStream,
    StreamProducer,
    check_stream_pattern,
    matches,
)
from pykka_delivery.coordinator.client import (
    ConnectionRejected,
    CoordinatorClient,
    CoordinatorRefused,
    CoordinatorUnavailable,
)
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
from pykka_delivery.coordinator.coordinated_consumer import (
    ActivationInterval,
    CoordinatedConsumer,
)
from pykka_delivery.coordinator.directory import ServiceDirectory, ServiceEntry, ServiceKey
from pykka_delivery.coordinator.effects import (
    CancelTimer,
    CheckConnection,
    Effect,
    SendConsumerUpdate,
    StartTimer,
    UnwatchConnection,
    WatchConnection,
)
from pykka_delivery.coordinator.lag import (
    ConsumerPosition,
    LagInfo,
    Position,
    ProducerPosition,
)
from pykka_delivery.coordinator.machine import Outcome, apply, initial_state, replay
from pykka_delivery.coordinator.producer_directory import DirectoryProducers, announce_producer
from pykka_delivery.coordinator.queries import (
    GroupInfo,
    StreamInfo,
    list_groups,
    list_nodes,
    list_streams,
    settings_change,
)
from pykka_delivery.coordinator.replica import CoordinatorReplica, ReplicaSettings
from pykka_delivery.coordinator.service import (
    SERVICE_NAME,
    CoordinatorServer,
    CoordinatorServerStats,
)
from pykka_delivery.coordinator.service_settings import (
    LEADER_METADATA_KEY,
    CoordinatorClientSettings,
    CoordinatorServerSettings,
    coordinator_addresses,
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
    StreamId,
)
from pykka_delivery.coordinator.stats import HANDOVER_BUCKETS, HandoverHistogram
from pykka_delivery.coordinator.store import (
    DEFAULT_SNAPSHOT_EVERY,
    CommandLog,
    CommandLogError,
    MemoryCommandLog,
    SqliteCommandLog,
)

__all__ = [
    "DEFAULT_MAX_BATCH",
    "DEFAULT_SNAPSHOT_EVERY",
    "DEFAULT_SWEEP_INTERVAL",
    "HANDOVER_BUCKETS",
    "LEADER_METADATA_KEY",
    "OK",
    "SERVICE_NAME",
    "SIMPLE",
    "ActivateConsumer",
    "ActivationChange",
    "ActivationEvent",
    "ActivationInterval",
    "Activity",
    "Attach",
    "CancelTimer",
    "CatalogStream",
    "CheckConnection",
    "Command",
    "CommandLog",
    "CommandLogError",
    "ConnectionDown",
    "ConnectionLost",
    "ConnectionReconnected",
    "ConnectionRejected",
    "ConnectionSink",
    "Connectivity",
    "Consumer",
    "ConsumerId",
    "ConsumerPosition",
    "CoordinatedConsumer",
    "CoordinatorActor",
    "CoordinatorClient",
    "CoordinatorClientSettings",
    "CoordinatorRefused",
    "CoordinatorReplica",
    "CoordinatorServer",
    "CoordinatorServerSettings",
    "CoordinatorServerStats",
    "CoordinatorSettings",
    "CoordinatorState",
    "CoordinatorStats",
    "CoordinatorUnavailable",
    "CreateStream",
    "Detach",
    "DirectoryProducers",
    "DisconnectedTimeout",
    "Effect",
    "EvaluateGroup",
    "Execute",
    "GetStatistics",
    "Group",
    "GroupId",
    "GroupInfo",
    "Handover",
    "HandoverHistogram",
    "HandoverReason",
    "LagInfo",
    "ListGroups",
    "ListStreams",
    "MemoryCommandLog",
    "NodeReconnected",
    "Ok",
    "Outcome",
    "Position",
    "ProducerPosition",
    "PurgeStaleConnections",
    "Recover",
    "Refusal",
    "Refused",
    "RegisterConsumer",
    "Registered",
    "ReplicaSettings",
    "Reply",
    "SendConsumerUpdate",
    "ServiceDirectory",
    "ServiceEntry",
    "ServiceKey",
    "SqliteCommandLog",
    "StartTimer",
    "StreamId",
    "StreamInfo",
    "StreamProducer",
    "UnregisterConsumer",
    "UnwatchConnection",
    "UpdateSettings",
    "WatchConnection",
    "activation_changes",
    "announce_producer",
    "apply",
    "check_stream_pattern",
    "coordinator_addresses",
    "initial_state",
    "list_groups",
    "list_nodes",
    "list_streams",
    "matches",
    "replay",
    "settings_change",
]
