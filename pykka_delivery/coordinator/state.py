"""The coordinator's state: groups of consumers, each consumer with a composite status.

Everything here is a frozen record; `machine.apply` builds new ones, nothing assigns. The
small predicates below (`Consumer.counts_as_active`, `Group.chosen`, ...) are the
selection rules of RabbitMQ's stream SAC coordinator (``rabbit_stream_sac_coordinator``;
docs/coordinator.md); the handlers in machine.py only combine them.

Status abbreviations used in comments and tests: the first letter is the connectivity
(C connected, D disconnected, P presumed down), the second the activity (A active,
W waiting, D deactivating). CA is the active consumer; CD was told to step down and has
not answered yet; DA is an active consumer whose connection was lost; DD a deactivating
one whose connection was lost (it may still be finishing: it blocks its group, D12).
"""

from __future__ import annotations

import enum
import itertools
import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from pykka_delivery._fields import check_field_types
from pykka_delivery.coordinator.assignment import PARTITION_ASSIGNMENTS

__all__ = [
    "SIMPLE",
    "Activity",
    "Connectivity",
    "Consumer",
    "CoordinatorSettings",
    "CoordinatorState",
    "Group",
    "GroupId",
    "StreamId",
    "active_of",
    "changed_group_ids",
]

SIMPLE = -1
"""Partition index of a simple group (a plain stream, not a partition of a super stream)."""


class Connectivity(enum.Enum):
    """What the coordinator knows of a consumer's connection."""

    CONNECTED = "connected"
    DISCONNECTED = "disconnected"  # lost; the disconnected timer runs
    PRESUMED_DOWN = "presumed_down"  # the timer fired; ignored when choosing an active


class Activity(enum.Enum):
    """A consumer's part in its group."""

    ACTIVE = "active"
    WAITING = "waiting"
    DEACTIVATING = "deactivating"  # told to step down, its answer (an activate) not yet in


@dataclass(frozen=True, slots=True, order=True)
class GroupId:
    """Key of a group: a consumer name on a stream (a partition stream for super streams)."""

    namespace: str
    stream: str
    name: str

    def __str__(self) -> str:
        return f"group {self.name!r} on stream {self.stream!r} in namespace {self.namespace!r}"


@dataclass(frozen=True, slots=True, order=True)
class StreamId:
    """Key of a stream in the coordinator's catalog: a stream name within a namespace."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"stream {self.name!r} in namespace {self.namespace!r}"


@dataclass(frozen=True, slots=True)
class Consumer:
    """One subscription in a group, identified by ``(connection, subscription_id)``.

    Attributes:
        connection: the connection that registered it; one connection carries many
            subscriptions, and liveness is tracked per connection.
        subscription_id: unique within the connection.
        node: the process (transport node) hosting the connection; node-level events
            (`NodeReconnected`, `PurgeStaleConnections`) reach every connection on it.
        owner: a label for listings (the connection's name).
        connectivity, activity: the composite status.
        disconnected_at: wall-clock seconds when the connection was last lost; read only
            while the consumer is disconnected, to re-arm its timer after a restart.
        epoch: the fencing epoch of its latest activation in its group (0: never
            active); current while it counts as active, and the one a step-down names.
    """

    connection: str
    subscription_id: int
    node: str
    owner: str = ""
    connectivity: Connectivity = Connectivity.CONNECTED
    activity: Activity = Activity.WAITING
    disconnected_at: float = 0.0
    epoch: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.connection, self.subscription_id)

    @property
    def is_connected(self) -> bool:
        return self.connectivity is Connectivity.CONNECTED

    @property
    def is_disconnected(self) -> bool:
        return self.connectivity is Connectivity.DISCONNECTED

    @property
    def counts_as_active(self) -> bool:
        """Active or deactivating, and not presumed down (RabbitMQ's ``is_active``).

        A group never has two such consumers. A presumed-down active consumer does not
        count: its group has chosen another one, and they are reconciled when it returns.
        """
        return self.activity is not Activity.WAITING and (
            self.connectivity is not Connectivity.PRESUMED_DOWN
        )

    @property
    def is_disconnected_active(self) -> bool:
        """A DA: it blocks every rebalancing of its group until it returns or goes."""
        return self.is_disconnected and self.activity is Activity.ACTIVE

    @property
    def blocks_its_group(self) -> bool:
        """A DA or a DD: disconnected and counting as active. It may still be consuming
        (its messages do not travel through the coordinator), so its group chooses nobody
        else until it returns, its timer presumes it down, or it leaves (decision D12 for
        the DD; RabbitMQ v6 turns a lost CD into DW instead)."""
        return self.is_disconnected and self.activity is not Activity.WAITING

    @property
    def label(self) -> str:
        """``"<activity> (<connectivity>)"``, e.g. ``"waiting (presumed down)"``."""
        return f"{self.activity.value} ({self.connectivity.value.replace('_', ' ')})"

    def with_status(
        self, connectivity: Connectivity | None = None, activity: Activity | None = None
    ) -> Consumer:
        return replace(
            self,
            connectivity=self.connectivity if connectivity is None else connectivity,
            activity=self.activity if activity is None else activity,
        )


def active_of(consumers: tuple[Consumer, ...]) -> Consumer | None:
    """The first of a group's ``consumers`` that counts as active (CA, CD or DA), if any:
    `Group.active`, and `queries.GroupInfo.active` of a listing."""
    return next((c for c in consumers if c.counts_as_active), None)


@dataclass(frozen=True, slots=True)
class Group:
    """The consumers of one group, in registration order, and its partition index.

    ``partition_index`` is `SIMPLE` (-1) for a simple group, or the partition's index
    (0 and up) in a super stream; it is fixed when the group is created. Order matters: a
    simple group's active consumer is the first eligible one, a partitioned group's is
    ``eligible[partition_index % len(eligible)]`` under the modulo rule (the sticky rule,
    the default, looks at the sibling groups too: coordinator/sticky.py).

    ``last_epoch`` is the fencing epoch of the group's latest activation: the next one
    takes ``last_epoch + 1`` (`activated`), so epochs only grow within a group.
    """

    partition_index: int
    consumers: tuple[Consumer, ...] = ()
    last_epoch: int = 0

    @property
    def is_partitioned(self) -> bool:
        return self.partition_index != SIMPLE

    def find(self, connection: str, subscription_id: int) -> Consumer | None:
        return next((c for c in self.consumers if c.key == (connection, subscription_id)), None)

    def has_connection(self, connection: str) -> bool:
        return any(c.connection == connection for c in self.consumers)

    def active(self) -> Consumer | None:
        """The first consumer that counts as active (CA, CD or DA), if any."""
        return active_of(self.consumers)

    def disconnected_active(self) -> Consumer | None:
        """The DA, if any."""
        return next((c for c in self.consumers if c.is_disconnected_active), None)

    def blocking(self) -> Consumer | None:
        """The DA or DD, if any: the group chooses nobody else while it is there."""
        return next((c for c in self.consumers if c.blocks_its_group), None)

    def deactivating(self) -> Consumer | None:
        """The consumer whose step-down is pending (CD, or DD while its connection is
        lost), if any. Its timer turns a DD into PW: a presumed-down consumer is no
        longer waited for."""
        return next(
            (
                c
                for c in self.consumers
                if c.activity is Activity.DEACTIVATING and c.counts_as_active
            ),
            None,
        )

    def eligible(self) -> tuple[Consumer, ...]:
        """The connected consumers, in order, whatever their activity."""
        return tuple(c for c in self.consumers if c.is_connected)

    def chosen(self) -> Consumer | None:
        """The consumer that should be active (RabbitMQ's ``evaluate_active_consumer``).

        A disconnected consumer that counts as active (DA, or DD: decision D12) is always
        chosen: it may still be consuming, and telling another consumer to start could
        make two active ones. Otherwise the first eligible consumer (simple group) or
        ``eligible[partition_index % len(eligible)]`` (the modulo rule; the machine asks
        `sticky.sticky_choice` instead under the sticky one).
        """
        blocking = self.blocking()
        if blocking is not None:
            return blocking
        eligible = self.eligible()
        if not eligible:
            return None
        if not self.is_partitioned:
            return eligible[0]
        return eligible[self.partition_index % len(eligible)]

    def activated(self, consumer: Consumer) -> tuple[Group, Consumer]:
        """This group with ``consumer`` made active under the group's next epoch, and
        the consumer as stored (the one to tell)."""
        epoch = self.last_epoch + 1
        now = replace(consumer, activity=Activity.ACTIVE, epoch=epoch)
        consumers = tuple(now if c.key == now.key else c for c in self.consumers)
        return replace(self, consumers=consumers, last_epoch=epoch), now

    def updated(self, consumer: Consumer) -> Group:
        """This group with the consumer of the same key replaced by ``consumer``."""
        return replace(
            self,
            consumers=tuple(consumer if c.key == consumer.key else c for c in self.consumers),
        )

    def mapped(self, change: Callable[[Consumer], Consumer]) -> Group:
        return replace(self, consumers=tuple(change(c) for c in self.consumers))

    def without(self, drop: Callable[[Consumer], bool]) -> tuple[Group, tuple[Consumer, ...]]:
        """This group without the consumers ``drop`` selects, and those consumers."""
        kept = tuple(c for c in self.consumers if not drop(c))
        dropped = tuple(c for c in self.consumers if drop(c))
        return replace(self, consumers=kept), dropped

    def moved_to_front(self, consumer: Consumer) -> Group:
        rest = tuple(c for c in self.consumers if c.key != consumer.key)
        return replace(self, consumers=(consumer, *rest))


def _require(condition: bool, msg: str) -> None:
    if not condition:
        raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class CoordinatorSettings:
    """Settings of the coordinator. Durations are seconds.

    Attributes:
        disconnected_timeout: how long the consumers of a lost connection stay
            disconnected (still members; a disconnected active consumer blocks its group)
            before they are presumed down and their groups choose other consumers.
            Default 20 s: above a client's own detection of a broken stream and its
            reconnect (``keepalive_time + keepalive_timeout`` = 15 s by default), so a
            blip costs no hand-over. The fencing epochs, not this timeout, keep a cut-off
            consumer's work from counting twice (docs/coordinator.md, D13).
        recovery_min_delay: after a restart (`Recover`), a re-armed disconnected timer
            fires no sooner than this, so connections have time to reach the restarted
            coordinator; capped at ``disconnected_timeout``. Default 10 s.
        max_partitions: the most partitions a stream of the catalog may have
            (`CreateStream` above it is refused). Default 1024, the default of
            `pykka_delivery.partitions.config.PartitionsSettings.max_partitions` (a
            test pins that they agree), for the same reason: each partition costs a
            producer per group and a group per consumer group.
        partition_assignment: how the partitions of a partitioned consumer group are
            shared by its members: ``"sticky"`` (default: a join or leave moves only as
            many partitions as balance needs, `assignment.sticky_assignment`) or
            ``"modulo"`` (RabbitMQ's rule, ``eligible[partition_index % len(eligible)]``,
            which moves about every partition). Decision D14 in docs/coordinator.md.
    """

    disconnected_timeout: float = 20.0
    recovery_min_delay: float = 10.0
    max_partitions: int = 1024
    partition_assignment: str = "sticky"

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("disconnected_timeout", "recovery_min_delay"):
            value = getattr(self, name)
            _require(
                math.isfinite(value) and value > 0,
                f"{name} must be a finite number of seconds above 0, got {value!r}",
            )
        _require(
            type(self.max_partitions) is int and self.max_partitions >= 1,
            f"max_partitions must be a whole number of 1 or more, got {self.max_partitions!r}",
        )
        _require(
            self.partition_assignment in PARTITION_ASSIGNMENTS,
            f"partition_assignment must be one of "
            f"{', '.join(map(repr, PARTITION_ASSIGNMENTS))}, got {self.partition_assignment!r}: "
            f"'sticky' moves the fewest partitions, 'modulo' is RabbitMQ's rule",
        )

    @property
    def sticky(self) -> bool:
        """Whether partitioned groups share their partitions by the sticky rule."""
        return self.partition_assignment == "sticky"


def changed_group_ids(
    before: Mapping[GroupId, Group], after: Mapping[GroupId, Group]
) -> set[GroupId]:
    """The keys whose group is not the same object in ``before`` and ``after`` (added,
    removed or replaced): the groups a command touched, since the machine keeps the
    records of the others as they were.

    Both are walked in order first, comparing by identity: a command's new map is a copy
    of the old one (same order, additions last), so usually no key is hashed (a GroupId's
    hash is a Python call, and this runs for every command)."""
    # The walks run in C (map, compress): this runs for every command, twice.
    if not all(map(operator.is_, before, after)):  # a removal shifted the order
        keys = before.keys() | after.keys()
        return {gid for gid in keys if before.get(gid) is not after.get(gid)}
    changed = set(itertools.compress(after, map(operator.is_not, before.values(), after.values())))
    # The shorter map's keys are the first of the longer: the rest came or went.
    longer = before if len(before) > len(after) else after
    changed.update(itertools.islice(longer, min(len(before), len(after)), None))
    return changed


def _no_groups() -> Mapping[GroupId, Group]:
    return MappingProxyType({})


def _no_streams() -> Mapping[StreamId, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class CoordinatorState:
    """Every group (none is empty: a group goes when its last consumer goes), the stream
    catalog (each stream created with `CreateStream` and its partition count, which never
    shrinks) and the settings. ``groups`` and ``streams`` are read-only mappings;
    `machine.apply` makes new ones.

    ``epoch_floor`` is the highest fencing epoch any removed group had reached: a group
    created (again) starts above it, so a stale consumer of a removed group never holds
    an epoch above the new group's (one number, not one per key: nothing to bound)."""

    groups: Mapping[GroupId, Group] = field(default_factory=_no_groups)
    settings: CoordinatorSettings = field(default_factory=CoordinatorSettings)
    streams: Mapping[StreamId, int] = field(default_factory=_no_streams)
    epoch_floor: int = 0

    def connections(self) -> frozenset[str]:
        """Every connection with at least one consumer."""
        return frozenset(c.connection for g in self.groups.values() for c in g.consumers)

    def group_ids_of(self, connection: str) -> tuple[GroupId, ...]:
        """The groups where ``connection`` has consumers, sorted.

        Derived from the groups on each call, never kept as a separate index: RabbitMQ's
        reverse index could drift from the groups (reference 2.9, "possible v8 gap").
        """
        return tuple(sorted(gid for gid, g in self.groups.items() if g.has_connection(connection)))

    def disconnected_connections(self) -> frozenset[str]:
        """Connections with at least one disconnected consumer (their timer runs)."""
        return frozenset(
            c.connection for g in self.groups.values() for c in g.consumers if c.is_disconnected
        )
