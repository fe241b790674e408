"""Where a partitioned stream lives in the coordinator: the group key of each partition
(`partition_stream`), the producer id of each (group, partition) (`producer_id`), and the
stream's partition count in the coordinator's stream catalog (`catalog_partitions`).

`PartitionedProducer` and `GroupMember` both build their names and read their partition
counts here, so a producer and the members of its groups always agree.
"""

from __future__ import annotations

from pykka_delivery.coordinator.client import CoordinatorClient, CoordinatorRefused
from pykka_delivery.coordinator.commands import Refusal

# The coordinator's lag query matches partitions' streams too, so the rule lives there.
from pykka_delivery.coordinator.stream_rules import partition_stream

__all__ = [
    "DEFAULT_NAMESPACE",
    "catalog_partitions",
    "consumer_id",
    "partition_stream",
    "producer_id",
]

DEFAULT_NAMESPACE = "default"
"""The coordinator namespace of a `GroupMember` (and its producer's positions) not given
one."""


def catalog_partitions(
    client: CoordinatorClient,
    stream: str,
    *,
    namespace: str = "",
    create_with: int | None = None,
    timeout: float | None = None,
) -> int:
    """The partition count of ``stream`` in the coordinator's stream catalog.

    With ``create_with``, a stream the catalog does not have is created with that many
    partitions first. A stream it has keeps its count (``create_with`` neither grows
    nor shrinks it: growing is ``client.create_stream`` with the new count, and a running
    producer or member keeps its count until it grows, with ``grow_from_catalog``).

    Raises:
        KeyError: the catalog has no such stream and ``create_with`` is None.
        ValueError: a bad name or ``create_with``.
        CoordinatorRefused: ``create_with`` is above the coordinator's ``max_partitions``.
        ConnectionRejected, DeliveryTimeout, CoordinatorUnavailable, ClosedError: the
            coordinator could not be asked.
    """
    partitions = client.stream_partitions(stream, namespace=namespace, timeout=timeout)
    if partitions is not None:
        return partitions
    if create_with is None:
        msg = (
            f"the coordinator has no stream {stream!r} in namespace {namespace!r}: create "
            f"it (client.create_stream({stream!r}, partitions, namespace={namespace!r}), "
            f"or pass create_with=partitions)"
        )
        raise KeyError(msg)
    try:
        client.create_stream(stream, create_with, namespace=namespace, timeout=timeout)
    except CoordinatorRefused as refused:
        # Someone created it meanwhile with more partitions: use theirs.
        if refused.refusal is not Refusal.PARTITIONS_SHRINK:
            raise
    partitions = client.stream_partitions(stream, namespace=namespace, timeout=timeout)
    if partitions is None:  # cannot happen: streams are never deleted
        msg = f"stream {stream!r} in namespace {namespace!r} vanished after its creation"
        raise KeyError(msg)
    return partitions


def producer_id(stream: str, partition: int, group: str, producer: str = "") -> str:
    """The producer id of group ``group``'s stream of partition ``partition``: also its
    name on the producer's transport node.

    ``"<stream>-<partition>:<group>"`` for a producer without a name (the one producer of
    a stream wired by address), ``"<stream>-<partition>:<group>@<producer>"`` for producer
    ``producer`` of the stream's catalog: every replica of a stream has its own ids, and
    a replica that restarts under its name has the same ones (its durable queue resumes).
    A name has no ``@`` or ``:``, so distinct (stream, partition, group, producer) never
    share an id."""
    base = f"{partition_stream(stream, partition)}:{group}"
    return f"{base}@{producer}" if producer else base


def consumer_id(stream: str, partition: int, group: str) -> str:
    """The consumer id of group ``group`` on partition ``partition`` in a deduplication
    store, ``"<stream>-<partition>:<group>"``: one per (group, partition), whichever
    member holds it, with one position per producer id inside (the group's progress on
    that partition, per producer)."""
    return producer_id(stream, partition, group)
