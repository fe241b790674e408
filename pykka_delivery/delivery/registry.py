"""A service registry: where workers announce themselves under a service key (Akka's
``Receptionist``, reduced to what work pulling needs).

A `ConsumerController` started with a ``service_key`` registers its ref under that key and
deregisters it when it stops; a `WorkPullingProducerController` subscribes to the key and is
told the whole listing at once, then again after every change.

`ServiceRegistry` is the contract; `LocalServiceRegistry` keeps it in one process, and
`default_registry()` is the process-wide instance every controller uses unless given
another. A registry spanning processes (the coordinator acting as one) implements the same
four methods.

Rules every implementation keeps:

* A subscriber is told full listings, never deltas, so a listing that is lost or late is
  repaired by the next; it is told the current listing when it subscribes.
* Listings reach one subscriber in the order of the changes they follow.
* Listeners are called from whatever thread made the change (or the registry's own): they
  must be quick and must not block, typically one ``tell`` to an actor.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from pykka_delivery.protocol.messages import Ref

__all__ = [
    "Listener",
    "LocalServiceRegistry",
    "ServiceRegistry",
    "Subscription",
    "default_registry",
]

logger = logging.getLogger("pykka_delivery.registry")

Listener = Callable[[frozenset[Ref]], None]
"""Called with the refs registered under a key: at once on subscribing, then on each change."""


@runtime_checkable
class Subscription(Protocol):
    """What `ServiceRegistry.subscribe` returns: cancel it to stop the listings."""

    def cancel(self) -> None: ...


@runtime_checkable
class ServiceRegistry(Protocol):
    """Refs registered under service keys, with subscriptions to each key's listing."""

    def register(self, key: str, ref: Ref) -> None:
        """Register ``ref`` under ``key`` (again: no change)."""
        ...

    def deregister(self, key: str, ref: Ref) -> None:
        """Remove ``ref`` from ``key`` (not registered: no change)."""
        ...

    def subscribe(self, key: str, listener: Listener) -> Subscription:
        """Call ``listener`` with ``key``'s listing now and after every change."""
        ...

    def listing(self, key: str) -> frozenset[Ref]:
        """The refs registered under ``key`` now. An implementation may take the occasion
        to drop refs it finds dead, telling the subscribers. Controllers call it from their
        own thread on a timer: answer from what is known, without waiting on a network."""
        ...


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        msg = f"a service key must be a non-empty str, got {key!r}"
        raise ValueError(msg)


class _LocalSubscription:
    __slots__ = ("_key", "_listener", "_registry")

    def __init__(self, registry: LocalServiceRegistry, key: str, listener: Listener) -> None:
        self._registry = registry
        self._key = key
        self._listener = listener

    def cancel(self) -> None:
        """Stop the listings; a listing being delivered at this moment may still arrive."""
        self._registry._unsubscribe(self._key, self._listener)  # our own registry


class LocalServiceRegistry:
    """A `ServiceRegistry` for one process; thread-safe.

    pykka has no death watch: a registered actor that stops without deregistering (one that
    failed, say) stays listed until someone asks for the `listing`, which drops every ref
    whose ``is_alive()`` is False and tells the subscribers. The work-pulling controller
    asks on a timer (``WorkPullingSettings.dead_worker_check_interval``).

    Listeners are called with the registry's lock held, so that listings reach each
    subscriber in order; they may call the registry back (the lock is reentrant), but must
    not wait for another thread that does.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._refs: dict[str, dict[Ref, None]] = {}  # an ordered set per key
        self._listeners: dict[str, list[Listener]] = {}

    def register(self, key: str, ref: Ref) -> None:
        _check_key(key)
        with self._lock:
            refs = self._refs.setdefault(key, {})
            if ref in refs:
                return
            refs[ref] = None
            logger.debug("Registered %r under %r", ref, key)
            self._notify(key)

    def deregister(self, key: str, ref: Ref) -> None:
        _check_key(key)
        with self._lock:
            refs = self._refs.get(key)
            if refs is None or ref not in refs:
                return
            del refs[ref]
            logger.debug("Deregistered %r from %r", ref, key)
            self._notify(key)

    def subscribe(self, key: str, listener: Listener) -> Subscription:
        _check_key(key)
        with self._lock:
            self._listeners.setdefault(key, []).append(listener)
            self._call(listener, key, self._current(key))
        return _LocalSubscription(self, key, listener)

    def listing(self, key: str) -> frozenset[Ref]:
        _check_key(key)
        with self._lock:
            refs = self._refs.get(key, {})
            dead = [ref for ref in refs if _is_dead(ref)]
            for ref in dead:
                del refs[ref]
                logger.debug("Dropped %r from %r: it stopped without deregistering", ref, key)
            if dead:
                self._notify(key)
            return self._current(key)

    def _unsubscribe(self, key: str, listener: Listener) -> None:
        with self._lock:
            listeners = self._listeners.get(key, [])
            if listener in listeners:
                listeners.remove(listener)

    def _current(self, key: str) -> frozenset[Ref]:
        return frozenset(self._refs.get(key, ()))

    def _notify(self, key: str) -> None:
        current = self._current(key)
        for listener in list(self._listeners.get(key, ())):
            self._call(listener, key, current)

    @staticmethod
    def _call(listener: Listener, key: str, current: frozenset[Ref]) -> None:
        try:
            listener(current)
        except Exception:  # one broken subscriber must not keep the others uninformed
            logger.exception("Listener of service key %r failed", key)


def _is_dead(ref: Ref) -> bool:
    is_alive = getattr(ref, "is_alive", None)
    return is_alive is not None and not is_alive()


_default: LocalServiceRegistry | None = None
_default_lock = threading.Lock()


def default_registry() -> LocalServiceRegistry:
    """The process-wide registry: what controllers use when given none."""
    global _default  # noqa: PLW0603 - one lazily created instance per process
    with _default_lock:
        if _default is None:
            _default = LocalServiceRegistry()
        return _default
