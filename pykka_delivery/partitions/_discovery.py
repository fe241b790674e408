"""A stream's producers as the coordinator's catalog lists them, for one group's member.

For every partition the member consumes there is one `ProducerSet`: producer id ->
ref of each producer of the stream that serves that partition (a producer that has not
grown yet serves fewer). Each catalog listing pushed by the coordinator updates every
set, so a partition's `MergedConsumer` opens a session to a producer that joined and
closes the one of a producer that left, without a rebalance; a growth of the stream is
handed on (``on_partitions``) for the member to follow.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pykka_delivery.coordinator import CatalogStream, CoordinatorClient
from pykka_delivery.delivery.handles.producer_set import ProducerSet
from pykka_delivery.partitions._catalog_watches import watch_catalog
from pykka_delivery.partitions.catalog import producer_id
from pykka_delivery.protocol.messages import Ref

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

__all__ = ["StreamProducers"]


class StreamProducers:
    """The producers of ``stream`` for ``group``'s member, one `ProducerSet` per
    partition, following the catalog of ``namespace``.

    Raises:
        ConnectionRejected, DeliveryTimeout, ClosedError: the watch could not be made.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        stream: str,
        group: str,
        node: Node,
        *,
        namespace: str,
        on_partitions: Callable[[int], None],
        timeout: float | None = None,
    ) -> None:
        self.stream = stream
        self._group = group
        self._node = node
        self._on_partitions = on_partitions
        self._lock = threading.Lock()
        self._sets: dict[int, ProducerSet] = {}
        self._listed: CatalogStream | None = None
        # Refs built once per (producer id, address): a listing that changes nothing
        # else then leaves every set unchanged.
        self._refs: dict[str, tuple[str, Ref]] = {}
        self._stop = watch_catalog(
            client, stream, self._on_catalog, namespace=namespace, timeout=timeout
        )

    @property
    def partitions(self) -> int:
        """The stream's partition count in the last listing (0 before the first)."""
        listed = self._listed
        return 0 if listed is None else listed.partitions

    def names(self) -> tuple[str, ...]:
        """The producers listed last, by name."""
        listed = self._listed
        return () if listed is None else tuple(p.name for p in listed.producers)

    def for_partition(self, partition: int) -> ProducerSet:
        """The producers of ``partition`` (the same set on every call, kept up to date)."""
        with self._lock:
            producers = self._sets.get(partition)
            if producers is None:
                producers = self._sets[partition] = ProducerSet(self._listing(partition))
            return producers

    def close(self) -> None:
        """Stop following the catalog (the sets keep their last content)."""
        self._stop()

    def _on_catalog(self, streams: tuple[CatalogStream, ...]) -> None:
        """On the client's thread: every set follows the listing of this stream."""
        listed = next((s for s in streams if s.name == self.stream), None)
        if listed is None:
            return
        with self._lock:
            self._listed = listed
            updates = [(producers, self._listing(p)) for p, producers in self._sets.items()]
        for producers, listing in updates:
            producers.set(listing)
        self._on_partitions(listed.partitions)

    def _listing(self, partition: int) -> dict[str, Ref]:
        """With the lock held: producer id -> ref of every producer serving ``partition``."""
        listed = self._listed
        if listed is None:
            return {}
        listing: dict[str, Ref] = {}
        for producer in listed.producers:
            if partition >= producer.partitions:
                continue  # it has not grown to this partition yet
            pid = producer_id(self.stream, partition, self._group, producer.name)
            known = self._refs.get(pid)
            if known is None or known[0] != producer.address:
                known = (producer.address, self._node.ref(f"{producer.address}/{pid}"))
                self._refs[pid] = known
            listing[pid] = known[1]
        return listing
