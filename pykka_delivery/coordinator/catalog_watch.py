"""The producers of the coordinator's stream catalog, and who watches which streams.

A partitioned stream has any number of producers (service replicas). Each registers in
the catalog: its name (unique within the stream), its transport node's address and the
partitions it serves. Producers and group members watch a stream name pattern
(``"orders.*"``) and are sent every matching stream with its producers after each change,
so they follow producers that come and go, and streams created or grown, without polling.

Rules (the `CoordinatorActor` drives this bookkeeping and sends the listings; the service
directory, directory.py, follows the same ones):

* A producer belongs to the connection that registered it, identified by
  ``(connection, registration_id)``; registering the same identity again replaces it (a
  producer that grew registers again with its new count).
* A name is held by one connection at a time. Another *connected* connection's
  registration of it is refused (``PRODUCER_CONFLICT``); a lost one's (not presumed down
  yet) is taken over: a crashed producer restarting under its name does not wait for the
  coordinator's ``disconnected_timeout``.
* Producers leave when deregistered, when their connection says goodbye, when it is lost
  for longer than ``disconnected_timeout``, and when another connection takes their name.
* A watch belongs to a connection too; a watcher is sent the whole listing of its pattern
  when it watches, when its stream re-attaches and after every change of a matching
  stream (created, grown, a producer added, changed or gone).
* Nothing here is stored: clients register and watch again as their streams reopen.

Pure: no clock, no threads, no I/O; mutable, owned by one actor.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pykka_delivery.coordinator._watches import Watches
from pykka_delivery.coordinator.commands import Refusal, Refused
from pykka_delivery.coordinator.state import StreamId
from pykka_delivery.coordinator.stream_rules import NAME_RULE, name_problem

__all__ = [
    "CatalogStream",
    "ProducerCatalog",
    "StreamPattern",
    "StreamProducer",
    "check_stream_pattern",
    "matches",
]

# A stream name's characters, the wildcards, and '!' / '^' (negation inside [...]).
_PATTERN = re.compile(r"[A-Za-z0-9._\-*?\[\]!^]+")
# Outside sets no '[' or ']'; a set is '[' then at least one character, then ']'.
_SETS = re.compile(r"(?:[^\[\]]|\[[^\[\]]+\])*")
_PATTERN_RULE = (
    f"give a stream name ({NAME_RULE}) or one with the wildcards '*', '?' and '[...]', "
    "e.g. 'orders.*'"
)


def check_stream_pattern(pattern: str) -> str:
    """``pattern`` if it is a valid stream name pattern.

    Raises:
        ValueError: it is empty, has other characters than a stream name's and the
            wildcards, or an unclosed ``[``; the message names the fix.
    """
    if not isinstance(pattern, str) or not _PATTERN.fullmatch(pattern):
        msg = f"stream pattern {pattern!r} is not valid: {_PATTERN_RULE}"
        raise ValueError(msg)
    if not _SETS.fullmatch(pattern):
        msg = (
            f"stream pattern {pattern!r} has a '[' without its ']' (or one inside "
            f"another): write a set as '[abc]' or '[!abc]' ({_PATTERN_RULE})"
        )
        raise ValueError(msg)
    return pattern


def matches(pattern: str, name: str) -> bool:
    """Whether stream ``name`` matches ``pattern`` (`fnmatch.fnmatchcase`: case-sensitive;
    ``"orders.*"`` matches ``"orders.eu"``, not ``"ordersx"``)."""
    return fnmatch.fnmatchcase(name, pattern)


@dataclass(frozen=True, slots=True)
class StreamProducer:
    """One producer of a stream as the catalog lists it.

    Attributes:
        name: the producer's name, unique within its stream (e.g. ``"clicks-web-1"``).
        address: its transport node's ``"host:port"``.
        partitions: it serves partitions 0 .. partitions-1 (its count; may lag the
            catalog's during a growth).
        connection: the registering connection.
        registration_id: its id within that connection.
        node: the ``Hello``'s node label of that connection.
    """

    name: str
    address: str
    partitions: int
    connection: str = ""
    registration_id: int = 0
    node: str = ""

    def __post_init__(self) -> None:
        problem = name_problem("producer", self.name)
        if problem:
            msg = f"{problem} (give each producer replica its own name, e.g. 'clicks-web-1')"
            raise ValueError(msg)
        if not self.address:
            msg = "producer address is empty: give its transport node's 'host:port'"
            raise ValueError(msg)
        if type(self.partitions) is not int or self.partitions < 1:
            msg = (
                f"producer partitions must be a whole number of 1 or more, got {self.partitions!r}"
            )
            raise ValueError(msg)
        if self.registration_id < 0:
            msg = f"registration_id must be 0 or more, got {self.registration_id}"
            raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class CatalogStream:
    """A stream of the catalog with its producers."""

    namespace: str
    name: str
    partitions: int  # the catalog's count
    producers: tuple[StreamProducer, ...] = ()  # sorted by name


@dataclass(frozen=True, slots=True, order=True)
class StreamPattern:
    """A watch: a stream name ``pattern`` within a ``namespace``."""

    namespace: str
    pattern: str

    def __post_init__(self) -> None:
        check_stream_pattern(self.pattern)

    def covers(self, stream: StreamId) -> bool:
        return stream.namespace == self.namespace and matches(self.pattern, stream.name)


class ProducerCatalog:
    """Producers per stream, and watches per stream pattern."""

    __slots__ = ("_producers", "_watches")

    def __init__(self) -> None:
        # Per stream, producers by name.
        self._producers: dict[StreamId, dict[str, StreamProducer]] = {}
        self._watches: Watches[StreamPattern] = Watches()

    # --- producers

    def producers(self, stream: StreamId) -> tuple[StreamProducer, ...]:
        """The producers of ``stream``, sorted by name."""
        by_name = self._producers.get(stream, {})
        return tuple(by_name[name] for name in sorted(by_name))

    def has_producers(self, connection: str) -> bool:
        return any(p.connection == connection for s in self._producers.values() for p in s.values())

    def register(
        self,
        stream: StreamId,
        producer: StreamProducer,
        streams: Mapping[StreamId, int],
        connected: Callable[[str], bool],
    ) -> Refused | bool:
        """Add or replace ``producer`` of ``stream``; ``streams``: the catalog's counts,
        ``connected``: whether a connection has a stream attached now.

        Returns:
            Whether the producers of ``stream`` changed, or the refusal: the catalog has
            no such stream, another connected connection holds the name, or the producer
            serves more partitions than the stream has.
        """
        count = streams.get(stream)
        if count is None:
            msg = f"the catalog has no {stream}: create it first (create_stream)"
            return Refused(Refusal.STREAM_NOT_FOUND, msg)
        if producer.partitions > count:
            msg = (
                f"producer {producer.name!r} serves {producer.partitions} partitions but "
                f"{stream} has {count}: grow the stream first (create_stream)"
            )
            return Refused(Refusal.INVALID_REQUEST, msg)
        by_name = self._producers.setdefault(stream, {})
        holder = by_name.get(producer.name)
        if (
            holder is not None
            and holder.connection != producer.connection
            and connected(holder.connection)
        ):
            msg = (
                f"producer {producer.name!r} of {stream} is registered by another connected "
                f"client ({holder.address}): give each producer replica its own name"
            )
            return Refused(Refusal.PRODUCER_CONFLICT, msg)
        if holder == producer:
            return False
        # The same registration under another name (renamed) leaves its old name.
        identity = (producer.connection, producer.registration_id)
        for name, other in list(by_name.items()):
            if (other.connection, other.registration_id) == identity:
                del by_name[name]
        by_name[producer.name] = producer  # a lost connection's holder is taken over
        return True

    def deregister(self, stream: StreamId, connection: str, registration_id: int) -> bool:
        """Remove a producer. Returns whether the producers of ``stream`` changed."""
        by_name = self._producers.get(stream)
        if not by_name:
            return False
        mine = [
            name
            for name, p in by_name.items()
            if p.connection == connection and p.registration_id == registration_id
        ]
        for name in mine:
            del by_name[name]
        if not by_name:
            del self._producers[stream]
        return bool(mine)

    def drop_producers(self, connection: str) -> list[StreamId]:
        """Remove every producer of ``connection``. Returns the streams that changed."""
        changed = []
        for stream in list(self._producers):
            by_name = self._producers[stream]
            mine = [name for name, p in by_name.items() if p.connection == connection]
            if not mine:
                continue
            for name in mine:
                del by_name[name]
            if not by_name:
                del self._producers[stream]
            changed.append(stream)
        return sorted(changed)

    # --- watches

    def watch(self, pattern: StreamPattern, connection: str) -> None:
        self._watches.watch(pattern, connection)

    def unwatch(self, pattern: StreamPattern, connection: str) -> None:
        self._watches.unwatch(pattern, connection)

    def drop_watches(self, connection: str) -> None:
        self._watches.drop(connection)

    def watched_by(self, connection: str) -> list[StreamPattern]:
        """The patterns ``connection`` watches, sorted."""
        return sorted(self._watches.watched_by(connection))

    def concerned(self, stream: StreamId) -> list[tuple[str, StreamPattern]]:
        """The watches a change of ``stream`` concerns, as (connection, pattern), sorted."""
        return sorted(
            (connection, pattern)
            for pattern in self._watches.watched()
            if pattern.covers(stream)
            for connection in self._watches.watchers(pattern)
        )

    def listing(
        self, pattern: StreamPattern, streams: Mapping[StreamId, int]
    ) -> tuple[CatalogStream, ...]:
        """The streams of ``streams`` (the catalog's counts) ``pattern`` covers, sorted by
        name, each with its producers."""
        return tuple(
            CatalogStream(sid.namespace, sid.name, count, self.producers(sid))
            for sid, count in sorted(streams.items())
            if pattern.covers(sid)
        )
