"""The messages of the `CoordinatorActor`, and `ConnectionSink`, its way to a client.

`Execute` is asked (the reply comes back when the command is stored) or told with a
``reply_to`` callback: the actor stores the commands of consecutive told `Execute`
messages with one append (a group commit) and then calls each callback with its reply,
in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from pykka_delivery.coordinator.catalog_watch import CatalogStream, StreamPattern, StreamProducer
from pykka_delivery.coordinator.commands import Command, Reply
from pykka_delivery.coordinator.directory import ServiceEntry, ServiceKey
from pykka_delivery.coordinator.effects import SendConsumerUpdate
from pykka_delivery.coordinator.state import StreamId

if TYPE_CHECKING:
    from pykka_delivery.coordinator.probe import Prober

__all__ = [
    "Attach",
    "ConnectionSink",
    "DeregisterProducer",
    "DeregisterService",
    "Detach",
    "Execute",
    "GetStatistics",
    "ListGroups",
    "ListStreams",
    "RegisterProducer",
    "RegisterService",
    "ReplyTo",
    "UnwatchService",
    "UnwatchStreams",
    "WatchService",
    "WatchStreams",
]


ReplyTo = Callable[[Reply | Exception], None]
"""How a told `Execute` is answered: with the `Reply`, or the exception that kept its
command from being stored. Must not block (it runs in the actor's thread)."""


class ConnectionSink(Protocol):
    """The coordinator's way to one client connection (the gRPC service implements it)."""

    def send_update(self, update: SendConsumerUpdate) -> None:
        """Queue ``update`` for the connection. Must not block; called from any thread.
        An exception makes the coordinator treat the connection as lost."""
        ...

    def send_listing(self, key: ServiceKey, entries: tuple[ServiceEntry, ...]) -> None:
        """Queue the listing of a watched service key, as `send_update`."""
        ...

    def send_catalog(self, pattern: StreamPattern, streams: tuple[CatalogStream, ...]) -> None:
        """Queue the streams matching a watched stream pattern, as `send_update`."""
        ...


# --- messages --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Execute:
    """Apply ``command``.

    Without ``reply_to``, ask it: the machine's `Reply` (`Ok`, `Registered` or
    `Refused`), once the command is stored (the store's error, raised, if it could not
    be). With ``reply_to``, tell it: the actor calls ``reply_to`` once, from its own
    thread, with the reply or with the exception that kept the command from being stored
    (`LogFencedError`: another coordinator leads; `pykka.ActorDeadError`: the actor
    stopped first). Consecutive told `Execute` messages are stored together, with one append
    (group commit), and answered in order after their effects were carried out.
    """

    command: Command
    reply_to: ReplyTo | None = None


@dataclass(frozen=True, slots=True)
class Attach:
    """The stream of ``connection`` is open (new or re-opened): updates for it go to
    ``sink`` from now on, replacing an older sink. ``probe_address``: the transport node
    of its process (its ``Hello``), asked by ``prober`` when the stream is lost without a
    goodbye (probe.py); "" or no prober: not probed. Ask: None."""

    connection: str
    sink: ConnectionSink
    probe_address: str = ""
    prober: Prober | None = None


@dataclass(frozen=True, slots=True)
class Detach:
    """The stream of ``connection`` through ``sink`` ended. Ignored unless ``sink`` is the
    connection's current sink. ``lost``: it broke (`ConnectionLost`, the consumers wait for
    the connection to come back); otherwise the client said goodbye (`ConnectionDown`, its
    consumers leave). Ask: None."""

    connection: str
    sink: ConnectionSink
    lost: bool


@dataclass(frozen=True, slots=True)
class RegisterService:
    """Add (or replace) ``entry`` under ``key``; it belongs to ``entry.connection``.
    Ask: `OK`."""

    key: ServiceKey
    entry: ServiceEntry


@dataclass(frozen=True, slots=True)
class DeregisterService:
    """Remove ``connection``'s entry ``registration_id`` under ``key``. Ask: `OK`."""

    key: ServiceKey
    connection: str
    registration_id: int


@dataclass(frozen=True, slots=True)
class WatchService:
    """Send ``connection`` the listing of ``key`` now and after each change. Ask: `OK`."""

    key: ServiceKey
    connection: str


@dataclass(frozen=True, slots=True)
class UnwatchService:
    """Stop sending ``connection`` the listing of ``key``. Ask: `OK`."""

    key: ServiceKey
    connection: str


@dataclass(frozen=True, slots=True)
class RegisterProducer:
    """Add (or replace) ``producer`` of ``stream``; it belongs to ``producer.connection``.
    Ask: `OK`, or `Refused` (``STREAM_NOT_FOUND``, ``PRODUCER_CONFLICT``,
    ``INVALID_REQUEST``: see `ProducerCatalog.register`)."""

    stream: StreamId
    producer: StreamProducer


@dataclass(frozen=True, slots=True)
class DeregisterProducer:
    """Remove ``connection``'s producer ``registration_id`` of ``stream``. Ask: `OK`."""

    stream: StreamId
    connection: str
    registration_id: int


@dataclass(frozen=True, slots=True)
class WatchStreams:
    """Send ``connection`` the streams ``pattern`` covers now and after each change of
    one. Ask: `OK`."""

    pattern: StreamPattern
    connection: str


@dataclass(frozen=True, slots=True)
class UnwatchStreams:
    """Stop sending ``connection`` the streams of ``pattern``. Ask: `OK`."""

    pattern: StreamPattern
    connection: str


@dataclass(frozen=True, slots=True)
class ListGroups:
    """Ask: every group (of ``namespace``, if given) with its consumers, a tuple of
    `GroupInfo` sorted by group key."""

    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class ListStreams:
    """Ask: every stream of the catalog (of ``namespace``, if given) with its partition
    count, a tuple of `StreamInfo` sorted by stream key. Streams are created and grown
    with ``Execute(CreateStream(...))``."""

    namespace: str | None = None


@dataclass(frozen=True, slots=True)
class GetStatistics:
    """Ask: the actor's `CoordinatorStats` (what `CoordinatorActor.statistics` returns)."""
