"""The stream catalog's producers and watches, as methods of `CoordinatorClient`.

A producer registers in the catalog (stream, its name, its transport node's address, the
partitions it serves); producers and group members watch a stream name pattern and are
called with every matching stream and its producers now and after each change
(catalog_watch.py has the rules). Registrations and watches belong to the connection and
are sent again on every new stream (the coordinator does not store them), so they survive
reconnects, coordinator restarts and a fail-over to another replica.
"""

from __future__ import annotations

import concurrent.futures
import itertools
from abc import ABC, abstractmethod
from typing import Any

from pykka_delivery.coordinator import catalog_wire
from pykka_delivery.coordinator._client_requests import OnCatalog, Request, Requests
from pykka_delivery.coordinator.catalog_watch import StreamPattern, StreamProducer
from pykka_delivery.coordinator.state import StreamId
from pykka_delivery.coordinator.stream_rules import name_problem

__all__ = ["CatalogClient"]


def _stream(namespace: str, stream: str) -> StreamId:
    problem = name_problem("stream", stream)
    if problem:
        raise ValueError(problem)
    return StreamId(namespace, stream)


class CatalogClient(ABC):
    """The catalog methods of `CoordinatorClient` (its base class: they are documented and
    called as the client's own)."""

    connection_id: str
    _requests: Requests
    _registration_ids: itertools.count[int]

    @abstractmethod
    def _wait(self, request: Request, timeout: float | None) -> Any:
        """CoordinatorClient's blocking request (see there)."""

    def register_producer(
        self,
        stream: str,
        name: str,
        address: str,
        partitions: int,
        *,
        namespace: str = "",
        timeout: float | None = None,
        registration_id: int | None = None,
    ) -> int:
        """Register this connection's producer ``name`` of ``stream`` in the catalog: its
        transport node's ``address`` (``"host:port"``) and the partitions it serves
        (0 .. ``partitions``-1). Watchers of the stream are sent the new listing. Given
        the ``registration_id`` of an earlier registration, replace it (a producer that
        grew registers again with its new count). The registration stays while this
        connection lives, and is sent again on every new stream.

        A name held by another client whose connection is lost (not presumed down yet) is
        taken over: a crashed producer restarting under its name does not wait for the
        coordinator's ``disconnected_timeout``.

        Returns:
            The registration id, for `deregister_producer` (and to register again).

        Raises:
            ValueError: ``stream``, ``name`` or ``address`` is empty or not valid, or
                ``partitions`` is below 1 (checked here, before anything is sent).
            CoordinatorRefused: ``"stream_not_found"``: the catalog has no such stream
                (create it first: `create_stream`); ``"producer_conflict"``: another
                connected client has a producer of that name in that stream (give each
                producer replica its own name); ``"invalid_request"``: more partitions
                than the stream has (grow it first).
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        if registration_id is None:
            registration_id = next(self._registration_ids)
        sid = _stream(namespace, stream)
        producer = StreamProducer(name, address, partitions, self.connection_id, registration_id)
        message = catalog_wire.register_producer_message(
            next(self._requests.request_ids), sid, producer
        )
        self._wait(Request(message, concurrent.futures.Future()), timeout)
        return registration_id

    def deregister_producer(
        self,
        stream: str,
        registration_id: int,
        *,
        namespace: str = "",
        timeout: float | None = None,
    ) -> None:
        """Remove this connection's producer ``registration_id`` of ``stream`` (done also
        if it is not there); watchers of the stream are sent the new listing.

        Raises:
            ValueError: ``stream`` is not a valid name.
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        message = catalog_wire.deregister_producer_message(
            next(self._requests.request_ids), _stream(namespace, stream), registration_id
        )
        self._wait(Request(message, concurrent.futures.Future()), timeout)

    def watch_streams(
        self,
        pattern: str,
        on_catalog: OnCatalog,
        *,
        namespace: str = "",
        timeout: float | None = None,
    ) -> None:
        """Call ``on_catalog`` with every stream of ``namespace`` whose name matches
        ``pattern`` (a name, or one with the wildcards ``*``, ``?``, ``[...]``:
        ``"orders.*"``), sorted by name, each a `CatalogStream` with its producers: now
        (before this returns or right after), after each change of a matching stream
        (created, grown, a producer registered, changed or gone), and again after a
        reconnect; the last call is the truth. Streams without producers are listed too.
        It runs on the client's thread: keep it quick, never block. Watching the same
        pattern again replaces the callback.

        Raises:
            ValueError: ``pattern`` is not valid (the message names the fix).
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        watch = StreamPattern(namespace, pattern)
        message = catalog_wire.watch_streams_message(next(self._requests.request_ids), watch)
        self._wait(Request(message, concurrent.futures.Future(), on_catalog=on_catalog), timeout)

    def unwatch_streams(
        self, pattern: str, *, namespace: str = "", timeout: float | None = None
    ) -> None:
        """Stop the calls of the callback `watch_streams` gave for ``pattern``.

        Raises:
            ValueError: ``pattern`` is not valid.
            ConnectionRejected, DeliveryTimeout, ClosedError, LocalProtocolError: see
                `activate`.
        """
        watch = StreamPattern(namespace, pattern)
        message = catalog_wire.unwatch_streams_message(next(self._requests.request_ids), watch)
        self._wait(Request(message, concurrent.futures.Future()), timeout)
