"""`CoordinatorServiceRegistry`: the coordinator's service directory as a `ServiceRegistry`,
so that work pulling spans processes.

In one process, workers and the work-pulling producer meet in a `LocalServiceRegistry`.
Across processes, each process gives its controllers a `CoordinatorServiceRegistry`
instead: a worker's consumer controller registers the address it is exposed at on its
transport `Node`, and the producer's subscription turns each listing back into refs on its
own node. The coordinator keeps the directory and decides when a worker's process is gone
(docs/coordinator.md, "Service directory").

Only refs a node exposes (`RemoteRef`) can be registered: an address is what crosses the
process boundary. Calls block until the coordinator answers (``request_timeout`` of the
client's settings); do not call them from the client's own callbacks.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.directory import ServiceEntry
from pykka_delivery.delivery.registry import Listener, Subscription
from pykka_delivery.protocol.messages import Ref
from pykka_delivery.transport.node import RemoteRef

__all__ = ["CoordinatorServiceRegistry"]

logger = logging.getLogger("pykka_delivery.coordinator.registry")


class _Subscription:
    __slots__ = ("_key", "_listener", "_registry")

    def __init__(self, registry: CoordinatorServiceRegistry, key: str, listener: Listener) -> None:
        self._registry = registry
        self._key = key
        self._listener = listener

    def cancel(self) -> None:
        self._registry._unsubscribe(self._key, self._listener)


class CoordinatorServiceRegistry:
    """A `ServiceRegistry` kept by the coordinator, for controllers in many processes.

    Args:
        client: this process's connection to the coordinator.
        ref_at: turns a registered address (``host:port/name``) into a ref on this process's
            node, usually ``node.ref``.
        namespace: the directory's namespace for the keys; default ``""``.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        ref_at: Callable[[str], Ref],
        *,
        namespace: str = "",
    ) -> None:
        self._client = client
        self._ref_at = ref_at
        self._namespace = namespace
        self._lock = threading.RLock()
        self._registrations: dict[tuple[str, str], int] = {}  # (key, address) -> id
        self._listeners: dict[str, list[Listener]] = {}
        self._listings: dict[str, frozenset[Ref]] = {}

    def register(self, key: str, ref: Ref) -> None:
        """Register ``ref``'s address under ``key`` (again: no change).

        Raises:
            TypeError: ``ref`` is not exposed on a node (not a `RemoteRef`): expose the
                controller with ``self_ref_factory=node.expose(name)``.
        """
        address = _address(ref)
        with self._lock:
            if (key, address) in self._registrations:
                return
            registration_id = self._client.register_service(key, address, namespace=self._namespace)
            self._registrations[(key, address)] = registration_id

    def deregister(self, key: str, ref: Ref) -> None:
        address = _address(ref)
        with self._lock:
            registration_id = self._registrations.pop((key, address), None)
            if registration_id is None:
                return
        self._client.deregister_service(key, registration_id, namespace=self._namespace)

    def subscribe(self, key: str, listener: Listener) -> Subscription:
        """Call ``listener`` with ``key``'s listing (refs on this node) as the coordinator
        sends it: at once, then after each change. Called on the client's thread."""
        with self._lock:
            listeners = self._listeners.setdefault(key, [])
            listeners.append(listener)
            first = len(listeners) == 1
            current = self._listings.get(key)
        if first:
            self._client.watch_service(
                key, lambda entries: self._on_listing(key, entries), namespace=self._namespace
            )
        elif current is not None:
            _call(listener, key, current)
        return _Subscription(self, key, listener)

    def listing(self, key: str) -> frozenset[Ref]:
        """The last listing the coordinator sent for a subscribed ``key`` (empty for one
        not subscribed)."""
        with self._lock:
            return self._listings.get(key, frozenset())

    def _on_listing(self, key: str, entries: tuple[ServiceEntry, ...]) -> None:
        refs = frozenset(self._ref_at(entry.address) for entry in entries)
        with self._lock:
            self._listings[key] = refs
            listeners = list(self._listeners.get(key, ()))
        for listener in listeners:
            _call(listener, key, refs)

    def _unsubscribe(self, key: str, listener: Listener) -> None:
        with self._lock:
            listeners = self._listeners.get(key, [])
            if listener in listeners:
                listeners.remove(listener)
            last = not listeners
            if last:
                self._listeners.pop(key, None)
                self._listings.pop(key, None)
        if last:
            self._client.unwatch_service(key, namespace=self._namespace)


def _address(ref: Ref) -> str:
    if not isinstance(ref, RemoteRef):
        msg = (
            f"{ref!r} is not exposed on a transport node, so other processes cannot reach "
            "it: start the controller with self_ref_factory=node.expose(name)"
        )
        raise TypeError(msg)
    return ref.path


def _call(listener: Listener, key: str, refs: frozenset[Ref]) -> None:
    try:
        listener(refs)
    except Exception:
        logger.exception("Listener of service key %r failed", key)
