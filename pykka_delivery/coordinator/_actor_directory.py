"""The `CoordinatorActor`'s registries that belong to connections and are not stored: the
service directory (directory.py) and the producers of the stream catalog with its
watches (catalog_watch.py).

Both follow one set of rules, kept here once: entries belong to their connection and
leave with its goodbye at once, or ``disconnected_timeout`` after it was lost unless it
attaches again (`_lose_entries_later`, `_drop_entries`); a watcher is sent its listing
when it watches, when it attaches (`_send_watched`) and after each change; a sink that
fails on a listing makes its connection lost.

A mixin of the actor (it holds the state this reads); here so that the actor's module
keeps to its messages, its commands and their effects.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any

from pykka_delivery.coordinator.actor_messages import (
    ConnectionSink,
    DeregisterProducer,
    DeregisterService,
    RegisterProducer,
    RegisterService,
    UnwatchService,
    UnwatchStreams,
    WatchService,
    WatchStreams,
)
from pykka_delivery.coordinator.catalog_watch import ProducerCatalog, StreamPattern
from pykka_delivery.coordinator.commands import OK, Command, ConnectionLost, Refused, Reply
from pykka_delivery.coordinator.directory import ServiceDirectory, ServiceKey
from pykka_delivery.coordinator.state import CoordinatorState, StreamId
from pykka_delivery.delivery.timers import Timers

__all__ = ["DIRECTORY_MESSAGES", "Directories"]

logger = logging.getLogger("pykka_delivery.coordinator")

DIRECTORY_MESSAGES = frozenset(
    {
        RegisterService,
        DeregisterService,
        WatchService,
        UnwatchService,
        RegisterProducer,
        DeregisterProducer,
        WatchStreams,
        UnwatchStreams,
    }
)
"""The actor's messages handled here (`Directories._on_directory`)."""

_SERVICES = "services:"  # the timer key prefix of a lost connection's entries


class Directories(ABC):
    """The service directory and the catalog's producers (see the module docstring)."""

    _state: CoordinatorState
    _sinks: dict[str, ConnectionSink]
    _timers: Timers
    _follow_ups: deque[Command]
    _clock: Callable[[], float]
    _directory: ServiceDirectory
    _catalog: ProducerCatalog

    # Given by the actor (`CoordinatorActor`), which this mix-in is part of.

    @abstractmethod
    def _drain(self) -> None:
        """Apply the follow-up commands queued (a failed sink's `ConnectionLost`)."""

    @abstractmethod
    def _count(self, **increments: int) -> None:
        """Add to the server statistics' counters."""

    @abstractmethod
    def _lose_sink(self, connection: str) -> None:
        """Forget ``connection``'s sink (it failed or its stream ended)."""

    # --- requests

    def _on_directory(self, message: Any) -> Reply:
        kind = type(message)
        directory, catalog = self._directory, self._catalog
        if kind is RegisterService:
            if directory.register(message.key, message.entry):
                self._listing_changed(message.key)
        elif kind is DeregisterService:
            if directory.deregister(message.key, message.connection, message.registration_id):
                self._listing_changed(message.key)
        elif kind is WatchService:
            directory.watch(message.key, message.connection)
            self._send_listing(message.connection, message.key)
        elif kind is UnwatchService:
            directory.unwatch(message.key, message.connection)
        elif kind is RegisterProducer:
            outcome = catalog.register(
                message.stream, message.producer, self._state.streams, self._sinks.__contains__
            )
            if isinstance(outcome, Refused):
                logger.info("Refused RegisterProducer: %s", outcome.message)
                return outcome
            if outcome:
                self._stream_changed(message.stream)
        elif kind is DeregisterProducer:
            if catalog.deregister(message.stream, message.connection, message.registration_id):
                self._stream_changed(message.stream)
        elif kind is WatchStreams:
            catalog.watch(message.pattern, message.connection)
            self._send_catalog(message.connection, message.pattern)
        else:
            catalog.unwatch(message.pattern, message.connection)
        self._drain()
        return OK

    # --- connections

    def _has_entries(self, connection: str) -> bool:
        return self._directory.has_entries(connection) or self._catalog.has_producers(connection)

    def _lose_entries_later(self, connection: str) -> None:
        """``connection`` was lost: its entries stay for the grace its consumers get."""
        if self._has_entries(connection):
            self._timers.start(_SERVICES + connection, self._state.settings.disconnected_timeout)

    def _on_entries_timer(self, key: str) -> bool:
        """Whether timer ``key`` was a lost connection's entries' (then handled)."""
        if not key.startswith(_SERVICES):
            return False
        self._timers.cancel(key)
        connection = key.removeprefix(_SERVICES)
        if connection not in self._sinks:
            logger.info("Connection %r still lost: its entries and producers leave", connection)
            self._drop_entries(connection)
        return True

    def _send_watched(self, connection: str) -> None:
        """``connection`` attached: keep its entries, send it what it watches."""
        self._timers.cancel(_SERVICES + connection)
        for key in self._directory.watched_by(connection):
            self._send_listing(connection, key)
        for pattern in self._catalog.watched_by(connection):
            self._send_catalog(connection, pattern)
        self._drain()

    def _drop_watches(self, connection: str) -> None:
        self._directory.drop_watches(connection)
        self._catalog.drop_watches(connection)

    def _drop_entries(self, connection: str) -> None:
        for key in self._directory.drop_entries(connection):
            self._listing_changed(key)
        for stream in self._catalog.drop_producers(connection):
            self._stream_changed(stream)
        self._drain()

    # --- listings

    def _listing_changed(self, key: ServiceKey) -> None:
        for connection in sorted(self._directory.watchers(key)):
            self._send_listing(connection, key)

    def _stream_changed(self, stream: StreamId) -> None:
        """``stream`` was created or grown, or its producers changed: tell its watchers."""
        for connection, pattern in self._catalog.concerned(stream):
            self._send_catalog(connection, pattern)

    def _send_listing(self, connection: str, key: ServiceKey) -> None:
        listing = self._directory.listing(key)
        self._send_to(connection, "a listing", lambda sink: sink.send_listing(key, listing))

    def _send_catalog(self, connection: str, pattern: StreamPattern) -> None:
        streams = self._catalog.listing(pattern, self._state.streams)
        self._send_to(connection, "a catalog", lambda sink: sink.send_catalog(pattern, streams))

    def _send_to(self, connection: str, what: str, send: Callable[[ConnectionSink], None]) -> None:
        sink = self._sinks.get(connection)
        if sink is None:
            return  # sent when it attaches again
        try:
            send(sink)
        except Exception:
            self._count(sink_failures=1)
            logger.warning(
                "Sink of connection %r failed on %s: treating the connection as lost",
                connection,
                what,
                exc_info=True,
            )
            self._lose_sink(connection)
            self._follow_ups.append(ConnectionLost(connection, now=self._clock()))
            return
        self._count(listings_sent=1)
