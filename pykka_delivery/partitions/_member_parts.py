"""What a `GroupMember` hands each partition's `CoordinatedConsumer`: the producer's ref,
the deduplication store factory and the hooks, each bound to the partition."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING

from pykka_delivery.coordinator.coordinated_consumer import ActivationInterval
from pykka_delivery.delivery.handles.producer_set import ProducerSet
from pykka_delivery.delivery.stores.backends import is_postgres_url
from pykka_delivery.delivery.stores.dedup import DedupStore, SqliteDedupSettings, SqliteDedupStore
from pykka_delivery.partitions.catalog import consumer_id, producer_id
from pykka_delivery.protocol.messages import Ref

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

__all__ = ["DedupSource", "dedup_factory", "for_partition", "producer_ref"]

DedupSource = str | os.PathLike[str] | Callable[[int], DedupStore]
"""An SQLite file shared by the group's members, a ``postgresql://`` URL (a database
shared by members on any host), or a factory: partition -> a new store."""


def producer_ref(
    producer: str | Callable[[int], Ref | ProducerSet],
    node: Node | None,
    stream: str,
    group: str,
    p: int,
) -> Ref | ProducerSet:
    """Group ``group``'s producer of partition ``p``: at the node address ``producer``
    (reached through ``node``), or ``producer(p)`` (a ref, or the set of the stream's
    producers found in the catalog)."""
    if not isinstance(producer, str):
        return producer(p)
    assert node is not None
    return node.ref(f"{producer}/{producer_id(stream, p, group)}")


def dedup_factory(
    source: DedupSource | None,
    settings: SqliteDedupSettings | None,
    stream: str,
    group: str,
    p: int,
) -> Callable[[], DedupStore] | None:
    """A new store per activation of partition ``p``, None without deduplication. A URL
    opens a ``PostgresDedupStore`` with ``settings``' ``flush_every`` and ``lock_timeout``
    (a factory gives it other settings)."""
    if source is None:
        return None
    if callable(source):
        return lambda: source(p)
    store_id = consumer_id(stream, p, group)
    if is_postgres_url(source):
        from pykka_delivery.delivery.stores.dedup_postgres import (  # noqa: PLC0415
            PostgresDedupSettings,  # the [postgres] extra, for a URL only
            PostgresDedupStore,
        )

        sqlite = settings or SqliteDedupSettings()
        shared = PostgresDedupSettings(
            flush_every=sqlite.flush_every, lock_timeout=sqlite.lock_timeout
        )
        url = source
        return lambda: PostgresDedupStore(url, store_id, shared)
    return lambda: SqliteDedupStore(source, store_id, settings)


def for_partition(
    hook: Callable[[int], None] | None, p: int
) -> Callable[[ActivationInterval], None] | None:
    """A member's hook, called with the partition's index, as a consumer's hook."""
    return None if hook is None else lambda _interval: hook(p)
