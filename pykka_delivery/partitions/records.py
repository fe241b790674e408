"""The frozen records of partitioned streams: the settings and statistics of a
`PartitionedProducer` and of a `GroupMember`, and the `GroupDelivery` a member's handler
is called with. Importable from `pykka_delivery.partitions` and from the modules of the
classes they belong to (``producer``, ``group``)."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

from pykka_delivery._fields import check_field_types
from pykka_delivery.delivery.core.producer import ProducerStats
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.stores.dedup import DedupStore, SqliteDedupSettings
from pykka_delivery.delivery.stores.dedup_tx import transactional
from pykka_delivery.delivery.stores.durable_sqlite import SqliteQueueSettings
from pykka_delivery.partitions.envelope import Key

__all__ = [
    "GroupDelivery",
    "GroupMemberSettings",
    "GroupMemberStats",
    "PartitionedProducerSettings",
    "PartitionedProducerStats",
]


# --- the producer ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionedProducerSettings:
    """Settings of a `PartitionedProducer`.

    Attributes:
        producer: the settings of every (group, partition) `Producer`; None (the
            default): `ProducerControllerSettings` defaults.
        run_length: unkeyed messages sent to one partition before the round robin moves
            on (`Spreader`); 1 to 1,000,000. Default 1 (the most even spread).
        durable_queue: the settings of the `SqliteDurableQueue` opened per (group,
            partition) when a path is given; None (the default): `SqliteQueueSettings`
            defaults.

    A producer with a ``name`` in the coordinator's catalog also uses:

    Attributes:
        registration_timeout: how long its registration in the catalog (and each
            re-registration after a growth) may wait for the coordinator. Default 30.
        leave_timeout: how long `PartitionedProducer.close` waits for every group to
            confirm what was sent before it leaves the catalog (a graceful leave drains).
            Default 30; 0 leaves at once.
        grow_timeout: each attempt to follow a growth the catalog pushed
            (`PartitionedProducer.grow`'s ``timeout``). Default 60.
        name_wait: how long a producer whose name another connection still holds waits
            for it (a killed predecessor, until the coordinator sees its connection end),
            trying again, before the ``"producer_conflict"`` refusal is raised. Default
            10; 0 raises at once.
        retry_backoff_min / retry_backoff_max: the waits before a failed attempt to
            grow is tried again, doubling. Defaults 1 and 30.

    Durations are seconds, above 0 (``leave_timeout`` and ``name_wait`` 0 or more), at
    most 3600.
    """

    producer: ProducerControllerSettings | None = None
    run_length: int = 1
    durable_queue: SqliteQueueSettings | None = None
    registration_timeout: float = 30.0
    leave_timeout: float = 30.0
    grow_timeout: float = 60.0
    name_wait: float = 10.0
    retry_backoff_min: float = 1.0
    retry_backoff_max: float = 30.0

    def __post_init__(self) -> None:
        check_field_types(self)
        if type(self.run_length) is not int or not 1 <= self.run_length <= 1_000_000:
            msg = (
                f"PartitionedProducerSettings.run_length must be a whole number from 1 to "
                f"1000000, got {self.run_length!r}"
            )
            raise ValueError(msg)
        _check_seconds(
            "PartitionedProducerSettings",
            self,
            (
                ("registration_timeout", 0.0, True),
                ("leave_timeout", 0.0, False),
                ("grow_timeout", 0.0, True),
                ("name_wait", 0.0, False),
                ("retry_backoff_min", 0.0, True),
                ("retry_backoff_max", self.retry_backoff_min, False),
            ),
        )


@dataclass(frozen=True, slots=True)
class PartitionedProducerStats:
    """Counters of a `PartitionedProducer`, as a frozen snapshot.

    Attributes:
        sent: messages accepted per partition (each went to every group).
        producers: each (group, partition) producer's counters, keyed by its producer id.
    """

    sent: tuple[int, ...]
    producers: dict[str, ProducerStats]


# --- the group member --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GroupDelivery:
    """One message of a partitioned stream, handed to a group member's handler.

    Attributes:
        stream: the stream's name.
        partition: the partition it came from.
        group: the consumer group.
        key: its key as sent (bytes or str), or None for an unkeyed message.
        message: the message.
        producer_id: the stream of (group, partition) it belongs to,
            ``producer_id(stream, partition, group)``.
        seq_nr: its number in that stream (consecutive, from 1).
        dedup_store: the partition's deduplication store in this activation (the
            member's ``dedup_store``), None without one.
    """

    stream: str
    partition: int
    group: str
    key: Key
    message: Any
    producer_id: str
    seq_nr: int
    dedup_store: DedupStore | None = field(default=None, compare=False, repr=False)

    def transaction(self, conn: Any) -> contextlib.AbstractContextManager[Any]:
        """``with delivery.transaction(conn): apply(conn, delivery.message)``: the effect
        and the partition's position commit together on the application's connection, so
        the handler's effect is applied exactly once across crashes and hand-overs (the
        member's ``dedup_store`` must make `SqliteTxDedupStore`\\ s or other
        `TxDedupStore`\\ s). A message applied before is rolled back and the block ends
        normally; the member confirms it when the handler returns.

        Raises:
            TypeError: the member has no transactional deduplication store.
        """
        return transactional(self.dedup_store, "GroupDelivery").transaction(conn, self)


@dataclass(frozen=True, slots=True)
class GroupMemberSettings:
    """Settings of a `GroupMember`. Durations are seconds.

    Attributes:
        consumer: the settings of each partition's consumer (window, retries, dedup
            store retries); None (the default): `ConsumerControllerSettings` defaults.
        close_grace: how long `close` lets the handler calls in progress finish before it
            leaves the group (Runnel's grace period). Default 10; 0 to 3600.
        retry_backoff_min: the wait before a failed handler is called again with the same
            delivery; doubled after each further failure. Default 0.1; above 0.
        retry_backoff_max: the longest wait between two calls. Default 5; at least
            ``retry_backoff_min``, at most 3600.
        registration_timeout: how long the registration of each partition may wait for
            the coordinator's answer. Default 30; above 0, at most 3600.
        close_timeout: how long `close` waits, after leaving the group, for each
            partition's thread to end (a handler still running past ``close_grace`` is
            not waited for longer). Default 10; 0 to 3600.
        dedup: the settings of the `SqliteDedupStore` opened per activation when the
            store is given as a path; None (the default): `SqliteDedupSettings` defaults.
    """

    consumer: ConsumerControllerSettings | None = None
    close_grace: float = 10.0
    retry_backoff_min: float = 0.1
    retry_backoff_max: float = 5.0
    registration_timeout: float = 30.0
    close_timeout: float = 10.0
    dedup: SqliteDedupSettings | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        _check_seconds(
            "GroupMemberSettings",
            self,
            (
                ("close_grace", 0.0, False),
                ("retry_backoff_min", 0.0, True),
                ("retry_backoff_max", self.retry_backoff_min, False),
                ("registration_timeout", 0.0, True),
                ("close_timeout", 0.0, False),
            ),
        )


def _check_seconds(
    kind: str, settings: object, fields: tuple[tuple[str, float, bool], ...]
) -> None:
    """Each field a number of seconds above (``strict``) or at least its low bound, at
    most 3600."""
    for name, low, strict in fields:
        value = getattr(settings, name)
        ok = (
            isinstance(value, int | float)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and (value > low if strict else value >= low)
            and value <= 3600
        )
        if not ok:
            bound = "above" if strict else "at least"
            msg = (
                f"{kind}.{name} must be a number of seconds {bound} {low} and at most 3600, "
                f"got {value!r}"
            )
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class GroupMemberStats:
    """Counters of a `GroupMember`, as a frozen snapshot.

    Attributes:
        handled: per partition, deliveries handled and confirmed by this member.
        handler_failures: handler calls that raised (each retried).
        activations: per partition, how many times this member became its consumer.
        owned: the partitions this member consumes now.
    """

    handled: tuple[int, ...]
    handler_failures: int
    activations: tuple[int, ...]
    owned: frozenset[int]
