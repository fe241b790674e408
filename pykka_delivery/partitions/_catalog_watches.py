"""Several listeners on one catalog watch of a client, and a thread that follows growth.

A `CoordinatorClient` keeps one callback per watched pattern (watching a pattern again
replaces it), while one process may run a producer and several members of one stream on
one client, each wanting the stream's listing: `watch_catalog` shares the client's watch
among them (`coordinator._shared_watches`).

`GrowthFollower` runs what a pushed growth asks for (`PartitionedProducer.grow`,
`GroupMember.grow`) on a thread of its own: listings arrive on the client's thread,
which must never block, and a growth waits for the coordinator or for confirmations.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from pykka_delivery.coordinator import CatalogStream, CoordinatorClient
from pykka_delivery.coordinator._shared_watches import shared_watch
from pykka_delivery.errors import ClosedError, DeliveryError
from pykka_delivery.retry import Backoff

__all__ = ["CatalogListener", "GrowthFollower", "watch_catalog"]

logger = logging.getLogger("pykka_delivery.partitions")

CatalogListener = Callable[[tuple[CatalogStream, ...]], None]
"""Called with every stream matching the pattern, on the client's thread: must not block."""


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
    return shared_watch(
        client,
        ("catalog", namespace, pattern),
        listener,
        lambda callback: client.watch_streams(
            pattern, callback, namespace=namespace, timeout=timeout
        ),
        lambda: client.unwatch_streams(pattern, namespace=namespace),
    )


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
