"""A `CoordinatorClient`'s side of lag as data: the positions it reports, and the lag it
asks for (see coordinator/lag.py for the theory of operation).

`PositionReports` keeps, between two reports, the latest position per key given to
`report_positions`, and the sources (`add_position_source`) read at each report. Every
``report_interval`` the client's thread reads the sources and puts one batch on the
current stream; between streams nothing is sent (the sources are read again at the next
report, the positions given are kept until they are sent). Reporters therefore do no work
per message: a source reads counters its producer or consumer keeps anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Any

from pykka_delivery.coordinator import lag_wire
from pykka_delivery.coordinator._client_requests import Requests
from pykka_delivery.coordinator.lag import ConsumerPosition, LagInfo, Position, ProducerPosition
from pykka_delivery.coordinator.service_settings import CoordinatorClientSettings

__all__ = ["LagClient", "PositionReports", "PositionSource"]

logger = logging.getLogger("pykka_delivery.coordinator.client")

PositionSource = Callable[[], Iterable[Position]]
"""Called on the client's thread at each report for the positions it has now."""


def _key(position: Position) -> tuple[Any, ...]:
    return (type(position), *position.key)


class PositionReports:
    """The positions one client sends, coalesced per key, one batch per interval.

    A report is scheduled only while there are sources or positions to send, so an idle
    client sends nothing.
    """

    def __init__(
        self,
        settings: CoordinatorClientSettings,
        requests: Requests,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._interval = settings.report_interval
        self._requests = requests
        self._loop = loop
        self._lock = threading.Lock()  # callers' threads and the client's
        self._given: dict[tuple[Any, ...], Position] = {}
        self._sources: list[PositionSource] = []
        self._scheduled = False

    def give(self, positions: Iterable[Position]) -> None:
        """Keep ``positions`` for the next report (any thread; never blocks)."""
        checked = {}
        for position in positions:
            if not isinstance(position, ProducerPosition | ConsumerPosition):
                msg = (
                    f"report_positions takes ProducerPosition and ConsumerPosition values, "
                    f"got {type(position).__name__}"
                )
                raise TypeError(msg)
            checked[_key(position)] = position
        with self._lock:
            self._given.update(checked)
            self._schedule()

    def add_source(self, source: PositionSource) -> None:
        with self._lock:
            self._sources.append(source)
            self._schedule()

    def remove_source(self, source: PositionSource) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._sources.remove(source)

    def _schedule(self) -> None:
        """With the lock held: have the client's thread report in an interval, unless it
        will already."""
        if self._scheduled:
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the client is
            self._loop.call_soon_threadsafe(self._loop.call_later, self._interval, self._report)
            self._scheduled = True

    def _report(self) -> None:
        """On the client's thread: read the sources and send one batch."""
        outbox = self._requests.outbox
        given: dict[tuple[Any, ...], Position] = {}
        if outbox is not None and not self._requests.stopping:  # else: next time
            with self._lock:
                given, self._given = self._given, {}
                sources = tuple(self._sources)
            positions = dict(given)
            for source in sources:
                try:
                    positions.update((_key(p), p) for p in source())
                except Exception:
                    logger.exception(
                        "Position source %r failed; its positions are not sent", source
                    )
            for message in lag_wire.positions_messages(list(positions.values())):
                outbox.put_nowait(message)
        with self._lock:
            self._scheduled = False
            if (self._sources or self._given) and not self._requests.stopping:
                self._loop.call_later(self._interval, self._report)
                self._scheduled = True


class LagClient(ABC):
    """The lag methods of `CoordinatorClient` (its base class: they are documented and
    called as the client's own)."""

    _reports: PositionReports

    @abstractmethod
    def _query(self, what: str, rpc: str, request: Any, timeout: float | None) -> Any:
        """CoordinatorClient's unary query (see there)."""

    def report_positions(self, positions: Iterable[Position]) -> None:
        """Report ``positions`` (`ProducerPosition`, `ConsumerPosition`) to the
        coordinator with the next batch, within ``report_interval``; a later position of
        the same key replaces one not sent yet. Never blocks (any thread). The
        coordinator forgets a position not reported again within its ``lag_expiry``:
        report at least that often, or use `add_position_source`.

        Raises:
            TypeError: something else than a position.
        """
        self._reports.give(positions)

    def add_position_source(self, source: PositionSource) -> None:
        """Call ``source()`` at every report, every ``report_interval``, for positions to
        send. It runs on the client's thread: keep it quick, and call no blocking method
        of the client from it. An exception is logged (that report goes without its
        positions). `PartitionedProducer` and `CoordinatedConsumer` add one each."""
        self._reports.add_source(source)

    def remove_position_source(self, source: PositionSource) -> None:
        """Stop calling ``source`` (not added: nothing happens). The coordinator forgets
        its positions after its ``lag_expiry``, or at once when the client closes."""
        self._reports.remove_source(source)

    def lag(
        self,
        namespace: str | None = None,
        *,
        stream: str | None = None,
        group: str | None = None,
        timeout: float | None = None,
    ) -> tuple[LagInfo, ...]:
        """How far each group is behind each producer: one `LagInfo` per (namespace,
        stream, group, partition, producer), from the positions reported to the
        coordinator, sorted so. Filters (None: any): ``namespace``; ``stream`` (also
        matches its partitions' streams: ``"orders"`` matches ``"orders-3"``);
        ``group`` (``""``: the producers no consumer reported for yet).

        Raises:
            ConnectionRejected: wrong token; or ``code == "UNIMPLEMENTED"``: a coordinator
                older than this client, with no lag queries (upgrade it).
            DeliveryTimeout: no answer within ``timeout``.
            CoordinatorUnavailable: the service failed the query.
            ClosedError: the client is closed.
            LocalProtocolError: called on the client's thread (from a callback).
        """
        request = lag_wire.lag_request(namespace, stream, group)
        return lag_wire.lag_rows(self._query("lag", "Lag", request, timeout))
