"""Several listeners on one catalog watch of a client, and a thread that follows growth.

A `CoordinatorClient` keeps one callback per watched pattern (watching a pattern again
replaces it), while one process may run a producer and several members of one stream on
one client, each wanting the stream's listing. `watch_catalog` gives every listener its
own subscription: the first one of a (client, namespace, pattern) watches through the
client, each later one is called at once with the last listing, and the last one to
leave unwatches.

`GrowthFollower` runs what a pushed growth asks for (`PartitionedProducer.grow`,
`GroupMember.grow`) on a thread of its own: listings arrive on the client's thread,
which must never block, and a growth waits for the coordinator or for confirmations.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from pykka_delivery.coordinator import CatalogStream, CoordinatorClient
from pykka_delivery.errors import ClosedError, DeliveryError, LocalProtocolError
from pykka_delivery.retry import Backoff

__all__ = ["CatalogListener", "GrowthFollower", "watch_catalog"]

logger = logging.getLogger("pykka_delivery.partitions")

CatalogListener = Callable[[tuple[CatalogStream, ...]], None]
"""Called with every stream matching the pattern, on the client's thread: must not block."""


@dataclass(slots=True)
class _Watch:
    listeners: list[CatalogListener] = field(default_factory=list)
    last: tuple[CatalogStream, ...] | None = None


class _Hub:
    """One client's watches, per (namespace, pattern)."""

    def __init__(self, client: CoordinatorClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._watches: dict[tuple[str, str], _Watch] = {}

    def add(
        self, pattern: str, namespace: str, listener: CatalogListener, timeout: float | None
    ) -> None:
        key = (namespace, pattern)
        with self._lock:
            watch = self._watches.get(key)
            first = watch is None
            if watch is None:
                watch = self._watches[key] = _Watch()
            watch.listeners.append(listener)
            last = watch.last
        if first:
            try:
                # Not under the lock: the first listing may arrive (on the client's
                # thread, which then takes it) before the reply.
                self._client.watch_streams(
                    pattern,
                    lambda streams: self._fan_out(key, streams),
                    namespace=namespace,
                    timeout=timeout,
                )
            except BaseException:
                self.remove(pattern, namespace, listener, unwatch=False)
                raise
        elif last is not None:
            _call(listener, last)

    def remove(
        self, pattern: str, namespace: str, listener: CatalogListener, *, unwatch: bool = True
    ) -> None:
        key = (namespace, pattern)
        with self._lock:
            watch = self._watches.get(key)
            if watch is None or listener not in watch.listeners:
                return
            watch.listeners.remove(listener)
            if watch.listeners:
                return
            del self._watches[key]
        if unwatch:
            with contextlib.suppress(DeliveryError):  # closed, unreachable: the watch goes with it
                self._client.unwatch_streams(pattern, namespace=namespace)

    def _fan_out(self, key: tuple[str, str], streams: tuple[CatalogStream, ...]) -> None:
        with self._lock:
            watch = self._watches.get(key)
            if watch is None:
                return
            watch.last = streams
            listeners = list(watch.listeners)
        for listener in listeners:
            _call(listener, streams)


def _call(listener: CatalogListener, streams: tuple[CatalogStream, ...]) -> None:
    try:
        listener(streams)
    except Exception:
        logger.exception("A catalog listener failed; it gets the next listing again")


_hubs: weakref.WeakKeyDictionary[CoordinatorClient, _Hub] = weakref.WeakKeyDictionary()
_hubs_lock = threading.Lock()


def watch_catalog(
    client: CoordinatorClient,
    pattern: str,
    listener: CatalogListener,
    *,
    namespace: str = "",
    timeout: float | None = None,
) -> Callable[[], None]:
    """Call ``listener`` with every stream of the catalog matching ``pattern`` now and
    after each change (see ``CoordinatorClient.watch_streams``); returns the function that
    stops it (not from the client's thread: it may unwatch, which waits for the
    coordinator).

    Raises:
        ValueError: a bad pattern.
        ConnectionRejected, DeliveryTimeout, ClosedError: the watch could not be made.
    """
    with _hubs_lock:
        hub = _hubs.get(client)
        if hub is None:
            hub = _hubs[client] = _Hub(client)
    hub.add(pattern, namespace, listener, timeout)

    def stop() -> None:
        try:
            hub.remove(pattern, namespace, listener)
        except LocalProtocolError:  # on the client's thread: the watch stays, harmless
            hub.remove(pattern, namespace, listener, unwatch=False)

    return stop


class GrowthFollower:
    """Grows something to the largest count asked for, on its own thread, trying again
    after a backoff while growing fails.

    Args:
        name: names the thread and the log lines.
        current: the count it has now.
        grow: grows it to the count given (raising `DeliveryError` to be tried again).
        backoff: the waits between attempts.
    """

    def __init__(
        self,
        name: str,
        current: Callable[[], int],
        grow: Callable[[int], object],
        backoff: Backoff,
    ) -> None:
        self._name = name
        self._current = current
        self._grow = grow
        self._backoff = backoff
        self._wanted = 0
        self._closed = False
        self._changed = threading.Condition()
        self.errors: list[BaseException] = []
        """Failed attempts, oldest first (each was tried again)."""
        self._thread = threading.Thread(target=self._run, name=f"grow-{name}", daemon=True)
        self._thread.start()

    def want(self, count: int) -> None:
        """Ask for ``count`` (a lower count than asked before changes nothing); never
        blocks."""
        with self._changed:
            if count > self._wanted:
                self._wanted = count
                self._changed.notify_all()

    def close(self, timeout: float | None = None) -> None:
        """Stop following (a growth in progress finishes first, up to ``timeout``)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        delays = self._backoff.delays()
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._closed or self._wanted > self._current())
                if self._closed:
                    return
                target = self._wanted
            try:
                self._grow(target)
                delays = self._backoff.delays()
            except ClosedError:
                return
            except (DeliveryError, ValueError) as error:
                self.errors.append(error)
                delay = next(delays)
                logger.warning(
                    "%s could not grow to %d partitions (%s); trying again in %.3g s",
                    self._name,
                    target,
                    error,
                    delay,
                )
                with self._changed:
                    if self._changed.wait_for(lambda: self._closed, delay):
                        return
