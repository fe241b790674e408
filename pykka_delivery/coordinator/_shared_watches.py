"""One client watch shared by several listeners.

A `CoordinatorClient` keeps one callback per watched service key or stream pattern
(watching again replaces it), while one process may run several listeners of the same
key on one client (two consumers of one service, a producer and members of one stream).
`shared_watch` gives each listener its own subscription: the first listener of a (client,
kind, name) watches through the client, each later one is called at once with the last
value, and the last one to leave unwatches. The hubs are keyed weakly by client and never
hold it, so a client nobody uses any more is collected with its hub.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any

from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.errors import DeliveryError, LocalProtocolError

__all__ = ["shared_watch"]

logger = logging.getLogger("pykka_delivery.coordinator")

Listener = Callable[[Any], None]


class _Watch:
    __slots__ = ("last", "listeners")

    def __init__(self) -> None:
        self.listeners: list[Listener] = []
        self.last: Any = None


class _Hub:
    """One client's shared watches, by name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watches: dict[Hashable, _Watch] = {}

    def add(self, name: Hashable, listener: Listener, start: Callable[[Listener], None]) -> None:
        with self._lock:
            watch = self._watches.get(name)
            first = watch is None
            if watch is None:
                watch = self._watches[name] = _Watch()
            watch.listeners.append(listener)
            last = watch.last
        if first:
            try:
                # Not under the lock: the first value may arrive (on the client's thread,
                # which then takes it) before the reply.
                start(lambda value: self._fan_out(name, value))
            except BaseException:
                self.remove(name, listener, None)
                raise
        elif last is not None:
            _call(listener, last)

    def remove(
        self, name: Hashable, listener: Listener, unwatch: Callable[[], None] | None
    ) -> None:
        with self._lock:
            watch = self._watches.get(name)
            if watch is None or listener not in watch.listeners:
                return
            watch.listeners.remove(listener)
            if watch.listeners:
                return
            del self._watches[name]
        if unwatch is not None:
            with contextlib.suppress(DeliveryError):  # closed, unreachable: the watch goes with it
                unwatch()

    def _fan_out(self, name: Hashable, value: Any) -> None:
        with self._lock:
            watch = self._watches.get(name)
            if watch is None:
                return
            watch.last = value
            listeners = list(watch.listeners)
        for listener in listeners:
            _call(listener, value)


def _call(listener: Listener, value: Any) -> None:
    try:
        listener(value)
    except Exception:
        logger.exception("A watch listener failed; it gets the next value again")


_hubs: weakref.WeakKeyDictionary[CoordinatorClient, _Hub] = weakref.WeakKeyDictionary()
_hubs_lock = threading.Lock()


def shared_watch(
    client: CoordinatorClient,
    name: Hashable,
    listener: Listener,
    start: Callable[[Listener], None],
    unwatch: Callable[[], None],
) -> Callable[[], None]:
    """Call ``listener`` with every value of the watch ``name`` of ``client``; ``start``
    makes the client's watch (given the callback), ``unwatch`` ends it once nobody
    listens. Returns the function that stops this listener (from any thread but the
    client's, where the client's watch is then left in place, harmless).

    Raises:
        What ``start`` raised (the listener is not kept).
    """
    with _hubs_lock:
        hub = _hubs.get(client)
        if hub is None:
            hub = _hubs[client] = _Hub()
    hub.add(name, listener, start)

    def stop() -> None:
        try:
            hub.remove(name, listener, unwatch)
        except LocalProtocolError:
            hub.remove(name, listener, None)

    return stop
