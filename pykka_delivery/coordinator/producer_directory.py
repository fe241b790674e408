"""Plain producers found through the coordinator's service directory.

A producer process announces ``host:port/producer_id`` under a service key
(`announce_producer`); a consumer process follows the key's listing as a `ProducerSet`
(`DirectoryProducers`), which a `CoordinatedConsumer` consumes as one merged stream. Nobody
is handed a producer's address: the coordinator's is enough.

A `CoordinatorClient` keeps one callback per watched key (watching again replaces it), so
the watches of one client are shared (`_shared_watches`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol

from pykka_delivery.coordinator._shared_watches import shared_watch
from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.directory import ServiceEntry
from pykka_delivery.delivery.handles.producer_set import ProducerSet
from pykka_delivery.protocol.messages import Ref

__all__ = ["DirectoryProducers", "announce_producer"]

logger = logging.getLogger("pykka_delivery.coordinator")

Listing = tuple[ServiceEntry, ...]
ListingListener = Callable[[Listing], None]


class _Node(Protocol):
    """What is used of a transport `Node`: its address and refs to remote names."""

    @property
    def address(self) -> str: ...

    def ref(self, path: str) -> Ref: ...


def announce_producer(
    client: CoordinatorClient,
    key: str,
    node: _Node,
    producer_id: str,
    *,
    namespace: str = "",
    timeout: float | None = None,
) -> int:
    """Register the producer exposed on ``node`` under ``producer_id``
    (``self_ref_factory=node.expose(producer_id)``) as ``host:port/producer_id`` under
    service ``key``, where `DirectoryProducers` finds it. The entry leaves with
    ``client.deregister_service(key, registration_id)`` or with the client's connection.

    Returns:
        The registration id.

    Raises:
        ValueError: ``key`` or ``producer_id`` is empty, or ``producer_id`` has a ``/``.
        ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
            `CoordinatorClient.register_service`.
    """
    if not producer_id or "/" in producer_id:
        msg = (
            f"announce_producer: producer id {producer_id!r} must be a non-empty name "
            "without '/': give the id the producer is exposed under on the node"
        )
        raise ValueError(msg)
    return client.register_service(
        key, f"{node.address}/{producer_id}", namespace=namespace, timeout=timeout
    )


class DirectoryProducers:
    """A `ProducerSet` (``.producers``) kept equal to the directory's listing of ``key``:
    each entry ``host:port/name`` is producer ``name`` at ``node.ref(address)``; a ref is
    reused while its entry's address is unchanged, so a listing that changes nothing
    leaves the set unchanged.

    Args:
        client: the coordinator client that watches the key (shared with others).
        key: the service key producers are announced under (`announce_producer`).
        node: the transport node the consumer reaches the producers through.
        namespace: the key's namespace.
        timeout: for the watch request (the client's request timeout when None).

    Raises:
        ValueError: ``key`` is empty.
        ConnectionRejected, DeliveryTimeout, ClosedError: the watch could not be made.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        key: str,
        node: _Node,
        *,
        namespace: str = "",
        timeout: float | None = None,
    ) -> None:
        if not key:
            msg = "DirectoryProducers: the service key is empty: name the producers' service"
            raise ValueError(msg)
        self.producers = ProducerSet()
        """The producers of ``key`` now; give it to `CoordinatedConsumer` as ``producer``."""
        self._node = node
        self._lock = threading.Lock()
        self._refs: dict[str, tuple[str, Ref]] = {}  # producer id -> (address, ref)
        self._closed = False
        self._stop = _watch_service(client, key, self._on_listing, namespace, timeout)

    def __repr__(self) -> str:
        return f"DirectoryProducers({self.producers!r})"

    def close(self) -> None:
        """Stop following the listing (the set keeps its last producers); call it from
        any thread but the client's."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._stop()

    def __enter__(self) -> DirectoryProducers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _on_listing(self, entries: Listing) -> None:
        with self._lock:
            if self._closed:
                return
            refs: dict[str, tuple[str, Ref]] = {}
            for entry in entries:
                producer_id = entry.address.rpartition("/")[2]
                if not producer_id or "/" not in entry.address:
                    logger.warning("%r: ignoring %r, not host:port/name", self, entry.address)
                    continue
                old = self._refs.get(producer_id)
                if old is not None and old[0] == entry.address:
                    refs[producer_id] = old
                else:
                    refs[producer_id] = (entry.address, self._node.ref(entry.address))
            self._refs = refs
            # Set under the lock so two listings can never be applied out of order.
            self.producers.set({p: ref for p, (_, ref) in refs.items()})


def _watch_service(
    client: CoordinatorClient,
    key: str,
    listener: ListingListener,
    namespace: str,
    timeout: float | None,
) -> Callable[[], None]:
    """Call ``listener`` with the listing of ``key`` now and after each change (one client
    watch shared by every listener of the key); returns the function that stops it."""
    return shared_watch(
        client,
        ("service", namespace, key),
        listener,
        lambda callback: client.watch_service(key, callback, namespace=namespace, timeout=timeout),
        lambda: client.unwatch_service(key, namespace=namespace),
    )
