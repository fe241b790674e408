"""Commands the coordinator applies, and its replies.

Commands are frozen, slotted records of plain values (str, int, float, tuples of str), so
a command log can store them and replaying the log rebuilds the state exactly. Time comes
in as data (``now``, wall-clock seconds), never from a clock. Each command checks its own
values on construction (`ValueError` naming the field); `machine.apply` then either applies
it or refuses it with a `Refused` reply, leaving the state unchanged. Don't subclass these.

Who sends what:

* a consumer's connection: `RegisterConsumer`, `UnregisterConsumer`, `ActivateConsumer`
  (its answer to a step-down), `ConnectionReconnected` (its answer to `CheckConnection`);
* the shell's liveness tracking: `ConnectionDown`, `ConnectionLost`, `NodeReconnected`,
  and `DisconnectedTimeout` when a `StartTimer` fires;
* the shell's periodic sweep and operators: `PurgeStaleConnections`, `EvaluateGroup`,
  `ActivateConsumer` (as a last-resort unblock), `UpdateSettings`;
* the shell after a restart, once the log is replayed: `Recover`;
* producers, group members and operators: `CreateStream` (the stream catalog).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from pykka_delivery.coordinator.state import SIMPLE, CoordinatorSettings, GroupId, StreamId
from pykka_delivery.coordinator.stream_rules import NAME_RULE, name_problem, partitions_problem

__all__ = [
    "OK",
    "ActivateConsumer",
    "Command",
    "ConnectionDown",
    "ConnectionLost",
    "ConnectionReconnected",
    "CreateStream",
    "DisconnectedTimeout",
    "EvaluateGroup",
    "NodeReconnected",
    "Ok",
    "PurgeStaleConnections",
    "Recover",
    "Refusal",
    "Refused",
    "RegisterConsumer",
    "Registered",
    "Reply",
    "UnregisterConsumer",
    "UpdateSettings",
]


def _require(condition: bool, msg: str) -> None:
    if not condition:
        raise ValueError(msg)


def _check_names(command: object, *names: str) -> None:
    for name in names:
        value = getattr(command, name)
        _require(
            isinstance(value, str) and value != "",
            f"{type(command).__name__}.{name} must be a non-empty string, got {value!r}",
        )


def _check_now(command: object, now: float) -> None:
    _require(
        math.isfinite(now),
        f"{type(command).__name__}.now must be finite wall-clock seconds, got {now!r}",
    )


class _GroupCommand:
    """Mixin: the `GroupId` of a command that names a group."""

    __slots__ = ()
    namespace: str
    stream: str
    name: str

    @property
    def group_id(self) -> GroupId:
        return GroupId(self.namespace, self.stream, self.name)


# --- from a consumer's connection --------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RegisterConsumer(_GroupCommand):
    """Add a consumer to a group, creating the group if needed.

    ``partition_index`` is `SIMPLE` (-1) for a plain stream, or the partition's index in
    its super stream; a group keeps the index it was created with. Replies `Registered`,
    or `Refused` (``PARTITION_INDEX_CONFLICT``). Registering the same
    ``(connection, subscription_id)`` again changes nothing and replies its status.
    """

    namespace: str
    stream: str
    name: str
    connection: str
    subscription_id: int
    node: str
    partition_index: int = SIMPLE
    owner: str = ""

    def __post_init__(self) -> None:
        _check_names(self, "namespace", "stream", "name", "connection", "node")
        _require(
            self.subscription_id >= 0,
            f"RegisterConsumer.subscription_id must be 0 or more, got {self.subscription_id}",
        )
        _require(
            self.partition_index >= SIMPLE,
            f"RegisterConsumer.partition_index must be -1 (simple group) or a partition "
            f"index (0 or more), got {self.partition_index}",
        )


@dataclass(frozen=True, slots=True)
class UnregisterConsumer(_GroupCommand):
    """Remove a consumer from its group. Replies `Ok`, or `Refused`
    (``CONSUMER_NOT_FOUND``: nothing to do, it is already gone)."""

    namespace: str
    stream: str
    name: str
    connection: str
    subscription_id: int

    def __post_init__(self) -> None:
        _check_names(self, "namespace", "stream", "name", "connection")


@dataclass(frozen=True, slots=True)
class ActivateConsumer(_GroupCommand):
    """A consumer told to step down has finished: choose the group's active consumer.

    ``connection`` and ``subscription_id`` name the consumer that answers (our clients
    always do): an answer from any consumer but the one whose step-down is pending is a
    late one and changes nothing, so the consumer still finishing is never joined by the
    next one. Left empty, the command names only the group, as in RabbitMQ: any pending
    step-down counts as answered (an operator's last-resort unblock). Replies `Ok`, or
    `Refused` (``GROUP_NOT_FOUND``).

    ``epoch`` is the fencing epoch of the step-down answered (our clients send the one
    their step-down named): an answer naming an epoch below the pending step-down's is
    a late answer to an earlier activation and changes nothing. 0 (unknown: an older
    client, an operator) is not checked.
    """

    namespace: str
    stream: str
    name: str
    connection: str = ""
    subscription_id: int = -1
    epoch: int = 0

    def __post_init__(self) -> None:
        _check_names(self, "namespace", "stream", "name")
        _require(
            isinstance(self.connection, str) and isinstance(self.subscription_id, int),
            "ActivateConsumer.connection must be a string and subscription_id an int",
        )
        _require(
            (self.connection == "") == (self.subscription_id == -1),
            "ActivateConsumer: give connection and subscription_id together (the answering "
            f"consumer), or neither (an operator's unblock); got {self.connection!r}, "
            f"{self.subscription_id!r}",
        )
        _require(
            type(self.epoch) is int and self.epoch >= 0,
            f"ActivateConsumer.epoch must be a whole number of 0 (unknown) or more, "
            f"got {self.epoch!r}",
        )


@dataclass(frozen=True, slots=True)
class ConnectionReconnected:
    """The connection is alive (its answer to `CheckConnection`, or it came back): its
    consumers are connected again and their groups re-evaluated. Replies `Ok`."""

    connection: str

    def __post_init__(self) -> None:
        _check_names(self, "connection")


# --- from the shell's liveness tracking ----------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectionDown:
    """The connection is gone for good (closed or crashed): remove its consumers.
    Replies `Ok`, also for a connection with no consumers."""

    connection: str

    def __post_init__(self) -> None:
        _check_names(self, "connection")


@dataclass(frozen=True, slots=True)
class ConnectionLost:
    """The connection cannot be reached (it may still be alive): its consumers become
    disconnected and its disconnected timer starts. ``now`` is wall-clock seconds.
    Replies `Ok`."""

    connection: str
    now: float

    def __post_init__(self) -> None:
        _check_names(self, "connection")
        _check_now(self, self.now)


@dataclass(frozen=True, slots=True)
class DisconnectedTimeout:
    """The disconnected timer of ``connection`` fired: its disconnected consumers are
    presumed down. Also the key of that timer in `StartTimer` / `CancelTimer`. Replies
    `Ok`; a timer that fires after the connection came back changes nothing."""

    connection: str

    def __post_init__(self) -> None:
        _check_names(self, "connection")


@dataclass(frozen=True, slots=True)
class NodeReconnected:
    """The link to ``node`` is back: ask each of its connections whether it is alive
    (`CheckConnection`). Changes no state. Replies `Ok`."""

    node: str

    def __post_init__(self) -> None:
        _check_names(self, "node")


# --- from the shell's sweep and operators ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class PurgeStaleConnections:
    """Remove every consumer of the given connections and of every connection on the
    given nodes, as if each connection went down. The shell finds them (for example nodes
    that left the cluster). Replies `Ok`."""

    nodes: tuple[str, ...] = ()
    connections: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("nodes", "connections"):
            values = getattr(self, name)
            _require(
                isinstance(values, tuple) and all(isinstance(v, str) for v in values),
                f"PurgeStaleConnections.{name} must be a tuple of strings, got {values!r}",
            )


@dataclass(frozen=True, slots=True)
class EvaluateGroup(_GroupCommand):
    """Operator clean-up of a stuck group: drop every consumer that is disconnected,
    presumed down, or on one of ``dead_connections``, then choose the active consumer
    again. Replies `Ok`, or `Refused` (``GROUP_NOT_FOUND``)."""

    namespace: str
    stream: str
    name: str
    dead_connections: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_names(self, "namespace", "stream", "name")
        _require(
            isinstance(self.dead_connections, tuple)
            and all(isinstance(v, str) for v in self.dead_connections),
            f"EvaluateGroup.dead_connections must be a tuple of strings, "
            f"got {self.dead_connections!r}",
        )


_DEFAULT_SETTINGS = CoordinatorSettings()


@dataclass(frozen=True, slots=True)
class UpdateSettings:
    """Replace the settings wholesale (fields and defaults as `CoordinatorSettings`).
    Running timers keep their delay; streams above a lowered ``max_partitions`` keep
    their count (only creation and growth are checked). Replies `Ok`."""

    disconnected_timeout: float = _DEFAULT_SETTINGS.disconnected_timeout
    recovery_min_delay: float = _DEFAULT_SETTINGS.recovery_min_delay
    max_partitions: int = _DEFAULT_SETTINGS.max_partitions
    partition_assignment: str = _DEFAULT_SETTINGS.partition_assignment

    def __post_init__(self) -> None:
        self.settings()  # validates

    @classmethod
    def of(cls, settings: CoordinatorSettings) -> UpdateSettings:
        return cls(
            settings.disconnected_timeout,
            settings.recovery_min_delay,
            settings.max_partitions,
            settings.partition_assignment,
        )

    def settings(self) -> CoordinatorSettings:
        return CoordinatorSettings(
            self.disconnected_timeout,
            self.recovery_min_delay,
            self.max_partitions,
            self.partition_assignment,
        )


# --- the stream catalog ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CreateStream:
    """Create stream ``name`` of ``namespace`` with ``partitions`` partitions, or grow it.

    The same count again changes nothing (so a producer and each group member may all ask
    for it); a larger count grows the stream (keys move as docs/partitions.md, "Growth",
    says); a smaller one is refused (``PARTITIONS_SHRINK``): counts never shrink. A count
    above the settings' ``max_partitions`` is refused (``PARTITIONS_OVER_LIMIT``).
    Replies `Ok`.

    ``name`` and ``partitions`` follow the catalog's rules (`stream_rules`, which a
    declared stream's `pykka_delivery.partitions.config.StreamConfig` follows too);
    ``namespace`` may be empty, else it follows the same rule as names.
    """

    namespace: str
    name: str
    partitions: int

    def __post_init__(self) -> None:
        _require(
            isinstance(self.namespace, str),
            f"CreateStream.namespace must be a string, got {self.namespace!r}",
        )
        if self.namespace and name_problem("namespace", self.namespace):
            msg = (
                f"CreateStream.namespace {self.namespace!r} is not valid: leave it empty, "
                f"or {NAME_RULE}"
            )
            raise ValueError(msg)
        problem = name_problem("stream", self.name) or partitions_problem(self.partitions)
        if problem:
            raise ValueError(f"CreateStream: {problem}")

    @property
    def stream_id(self) -> StreamId:
        return StreamId(self.namespace, self.name)


@dataclass(frozen=True, slots=True)
class Recover:
    """The coordinator restarted and replayed its log: re-issue what a running coordinator
    keeps outside its state (watches, timers, the last consumer updates). Changes no
    state. ``now`` is wall-clock seconds. Replies `Ok`."""

    now: float

    def __post_init__(self) -> None:
        _check_now(self, self.now)


Command = (
    RegisterConsumer
    | UnregisterConsumer
    | ActivateConsumer
    | ConnectionReconnected
    | ConnectionDown
    | ConnectionLost
    | DisconnectedTimeout
    | NodeReconnected
    | PurgeStaleConnections
    | EvaluateGroup
    | UpdateSettings
    | Recover
    | CreateStream
)


# --- replies ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok:
    """The command was applied (use the `OK` instance)."""


OK = Ok()


@dataclass(frozen=True, slots=True)
class Registered:
    """`RegisterConsumer` applied; ``active`` tells whether the consumer is the group's
    active one now, and ``epoch`` the fencing epoch of that activation (0 when it waits,
    or from an older coordinator; not compared, as `SendConsumerUpdate.epoch`). Delivery
    starts only with the `SendConsumerUpdate` that follows."""

    active: bool
    epoch: int = field(default=0, compare=False)


class Refusal(enum.Enum):
    """Why a command was refused."""

    PARTITION_INDEX_CONFLICT = "partition_index_conflict"
    GROUP_NOT_FOUND = "group_not_found"
    CONSUMER_NOT_FOUND = "consumer_not_found"
    UNKNOWN_COMMAND = "unknown_command"
    PARTITIONS_SHRINK = "partitions_shrink"
    PARTITIONS_OVER_LIMIT = "partitions_over_limit"
    # The stream catalog's producers (catalog_watch.py; not the machine's commands).
    STREAM_NOT_FOUND = "stream_not_found"
    PRODUCER_CONFLICT = "producer_conflict"
    INVALID_REQUEST = "invalid_request"


@dataclass(frozen=True, slots=True)
class Refused:
    """The command was refused and changed nothing; ``message`` names the problem and
    the fix."""

    reason: Refusal
    message: str


Reply = Ok | Registered | Refused
