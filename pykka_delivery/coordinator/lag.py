"""Lag as data: the positions producers and consumers report, and the lag they add up to.

Theory of operation:

* Producers and consumers report their positions to the coordinator on the ``Connect``
  stream their `CoordinatorClient` holds, at most once per ``report_interval``. A
  producer reports `ProducerPosition` (last seq_nr sent, last confirmed, the age of its
  oldest unconfirmed message); a consumer reports `ConsumerPosition` (last seq_nr
  received, last confirmed) per producer it consumes from.
* The coordinator keeps the latest report per key in a `LagTable`, in memory only: a
  report is refreshed every interval, so nothing of it belongs in the command log. The
  rows of a connection go when it ends with a goodbye (`LagTable.forget`) and any row
  goes when it was not refreshed for ``lag_expiry`` seconds (a lost connection, a
  producer closed).
* A query joins them per (namespace, stream, group, partition, producer) into `LagInfo`
  rows (`LagTable.rows`): the producer's figures where it reported, the consumer's where
  they are newer (seq_nrs only grow, so the larger is the newer).
* `OldestUnconfirmed` measures the oldest unconfirmed message's age from marks left at
  each report, as the producer's stuck check does: nothing is recorded per message.

Nothing here reads a clock: ``now`` is an argument, so tests drive it with a fake clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from pykka_delivery.coordinator.stream_rules import on_stream

__all__ = [
    "ConsumerPosition",
    "LagInfo",
    "LagTable",
    "OldestUnconfirmed",
    "Position",
    "ProducerPosition",
    "matches",
]


@dataclass(frozen=True, slots=True)
class LagInfo:
    """How far one group is behind one producer on one stream (partition).

    Attributes:
        namespace: the coordinator namespace.
        stream: the stream (for a partitioned stream, the partition's: ``"orders-3"``).
        group: the consumer group; ``""`` while no consumer of the producer reported.
        partition_index: the partition's index; -1 for a stream that is not partitioned.
        producer_id: the producer's id.
        sent: the last seq_nr sent (the producer's report, or the consumer's last received
            if that is newer or the producer did not report).
        confirmed: the last seq_nr confirmed (the newer of the producer's and the
            consumer's reports).
        in_flight: messages sent and not confirmed, ``sent - confirmed``.
        oldest_unconfirmed_age: seconds since the oldest unconfirmed message was sent, as
            of the producer's last report (0 when nothing is in flight or the producer
            did not report); measured at the producer's reports, so it may be low by up
            to its ``report_interval``.
        reported_at: the coordinator's wall clock (`time.time`) when the newest of the
            row's reports arrived: how fresh the row is.
    """

    namespace: str
    stream: str
    group: str
    partition_index: int
    producer_id: str
    sent: int
    confirmed: int
    in_flight: int
    oldest_unconfirmed_age: float
    reported_at: float


def _check(kind: str, index: int, names: dict[str, str], counts: dict[str, int]) -> None:
    """Raise a `ValueError` naming the first bad field of a position (positions come from
    other processes: the service drops a bad one)."""
    problems = [f"{name} is empty" for name, value in names.items() if not value]
    problems += [
        f"{name} must be a whole number of 0 or more, got {value!r}"
        for name, value in counts.items()
        if type(value) is not int or value < 0
    ]
    if type(index) is not int or index < -1:
        problems.append(f"partition_index must be -1 (not partitioned) or more, got {index!r}")
    if problems:
        msg = f"{kind}: {problems[0]}"
        raise ValueError(msg)


@dataclass(frozen=True, slots=True)
class ProducerPosition:
    """Where a producer is, as it reports it.

    Attributes:
        namespace, stream, partition_index, producer_id: its key (see `LagInfo`).
        sent: the last seq_nr it sent.
        confirmed: the last seq_nr confirmed to it.
        oldest_unconfirmed_age: seconds since its oldest unconfirmed message was sent.
        group: the group it sends to, when it sends to one group only (a
            `PartitionedProducer`'s producers do); shown until that group's consumer
            reports. Default ``""``.

    Raises:
        ValueError: a name is empty or a figure is negative.
    """

    namespace: str
    stream: str
    partition_index: int
    producer_id: str
    sent: int
    confirmed: int
    oldest_unconfirmed_age: float = 0.0
    group: str = ""

    def __post_init__(self) -> None:
        _check(
            "ProducerPosition",
            self.partition_index,
            {"namespace": self.namespace, "stream": self.stream, "producer_id": self.producer_id},
            {"sent": self.sent, "confirmed": self.confirmed},
        )
        age = self.oldest_unconfirmed_age
        if not (isinstance(age, int | float) and math.isfinite(age) and age >= 0):
            msg = f"ProducerPosition: oldest_unconfirmed_age must be 0 seconds or more, got {age!r}"
            raise ValueError(msg)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.stream, self.producer_id)


@dataclass(frozen=True, slots=True)
class ConsumerPosition:
    """Where a group's consumer is in one producer's stream, as it reports it.

    Attributes:
        namespace, stream, group, partition_index, producer_id: its key (see `LagInfo`).
        received: the last seq_nr it received.
        confirmed: the last seq_nr it confirmed.

    Raises:
        ValueError: a name is empty or a figure is negative.
    """

    namespace: str
    stream: str
    group: str
    partition_index: int
    producer_id: str
    received: int
    confirmed: int

    def __post_init__(self) -> None:
        names = {"namespace": self.namespace, "stream": self.stream, "group": self.group}
        names["producer_id"] = self.producer_id
        _check(
            "ConsumerPosition",
            self.partition_index,
            names,
            {"received": self.received, "confirmed": self.confirmed},
        )

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.namespace, self.stream, self.group, self.producer_id)


Position = ProducerPosition | ConsumerPosition
"""What a client reports (`CoordinatorClient.report_positions`)."""

_Key = TypeVar("_Key")


@dataclass(frozen=True, slots=True)
class _Report:
    """A position as the coordinator keeps it: who reported it, and when it arrived."""

    position: Position
    connection: str
    at: float


def matches(row: LagInfo, namespace: str | None, stream: str | None, group: str | None) -> bool:
    """Whether ``row`` passes the filters (None: any). ``stream`` matches its own rows and
    those of its partitions' streams (``"orders"`` matches ``"orders-3"`` of partition 3)."""
    if namespace is not None and row.namespace != namespace:
        return False
    if group is not None and row.group != group:
        return False
    return stream is None or on_stream(row.stream, row.partition_index, stream)


class LagTable:
    """The latest position per key, and the lag rows they join into.

    Args:
        expiry: seconds after which a position not reported again is forgotten.

    Not thread-safe: its owner (`CoordinatorServer`) serializes the calls.
    """

    __slots__ = ("_consumers", "_last_sweep", "_producers", "expiry")

    def __init__(self, expiry: float) -> None:
        self.expiry = expiry
        self._producers: dict[tuple[str, str, str], _Report] = {}
        self._consumers: dict[tuple[str, str, str, str], _Report] = {}
        self._last_sweep = -math.inf

    def __len__(self) -> int:
        return len(self._producers) + len(self._consumers)

    def report(self, connection: str, positions: Iterable[Position], now: float) -> None:
        """Keep ``positions``, reported by ``connection`` at ``now``, each replacing the
        one of its key (whoever reported that)."""
        for position in positions:
            report = _Report(position, connection, now)
            if isinstance(position, ProducerPosition):
                self._producers[position.key] = report
            else:
                self._consumers[position.key] = report
        # Swept now and then, so rows nobody queries do not pile up.
        if now - self._last_sweep >= self.expiry / 2:
            self.expire(now)

    def forget(self, connection: str) -> int:
        """Drop the positions ``connection`` was the last to report (it said goodbye);
        returns how many."""
        return self._drop(lambda report: report.connection == connection)

    def expire(self, now: float) -> int:
        """Drop the positions not reported within ``expiry`` before ``now``; returns how
        many."""
        self._last_sweep = now
        limit = now - self.expiry
        return self._drop(lambda report: report.at < limit)

    def rows(
        self,
        now: float,
        namespace: str | None = None,
        *,
        stream: str | None = None,
        group: str | None = None,
    ) -> tuple[LagInfo, ...]:
        """The lag per (namespace, stream, group, partition, producer), sorted so, of the
        positions reported within ``expiry`` before ``now``; filtered as `matches`."""
        self.expire(now)
        joined: list[LagInfo] = []
        consumed: set[tuple[str, str, str]] = set()
        for (ns, st, _group, pid), consumer in self._consumers.items():
            producer = self._producers.get((ns, st, pid))
            if producer is not None:
                consumed.add((ns, st, pid))
            joined.append(_join(producer, consumer))
        joined.extend(
            _join(producer, None)
            for key, producer in self._producers.items()
            if key not in consumed
        )
        rows = [row for row in joined if matches(row, namespace, stream, group)]
        rows.sort(key=lambda r: (r.namespace, r.stream, r.group, r.partition_index, r.producer_id))
        return tuple(rows)

    def _drop(self, doomed: Callable[[_Report], bool]) -> int:
        return _drop(self._producers, doomed) + _drop(self._consumers, doomed)


def _drop(table: dict[_Key, _Report], doomed: Callable[[_Report], bool]) -> int:
    keys = [key for key, report in table.items() if doomed(report)]
    for key in keys:
        del table[key]
    return len(keys)


def _join(producer: _Report | None, consumer: _Report | None) -> LagInfo:
    """One row from a producer's report and a consumer's (at least one of them)."""
    p = None if producer is None else producer.position
    c = None if consumer is None else consumer.position
    assert p is None or isinstance(p, ProducerPosition)
    assert c is None or isinstance(c, ConsumerPosition)
    sent = max(-1 if p is None else p.sent, -1 if c is None else c.received)
    confirmed = max(-1 if p is None else p.confirmed, -1 if c is None else c.confirmed)
    in_flight = max(0, sent - confirmed)
    age = p.oldest_unconfirmed_age if p is not None and in_flight else 0.0
    at = max(r.at for r in (producer, consumer) if r is not None)
    first = c if c is not None else p
    assert first is not None
    return LagInfo(
        namespace=first.namespace,
        stream=first.stream,
        group=c.group if c is not None else p.group if p is not None else "",
        partition_index=p.partition_index if p is not None else first.partition_index,
        producer_id=first.producer_id,
        sent=sent,
        confirmed=confirmed,
        in_flight=in_flight,
        oldest_unconfirmed_age=age,
        reported_at=at,
    )


class OldestUnconfirmed:
    """The age of a producer's oldest unconfirmed message, from one mark per report.

    A mark (when, sent) says that by then every seq_nr up to ``sent`` was sent. The
    oldest unconfirmed message, ``confirmed + 1``, was sent by the first mark whose
    ``sent`` reaches it: its age is at least the time since that mark, and less than one
    report interval more. Marks are left only when ``sent`` moved, so they number at most
    the messages in flight (bounded by the flow-control window).
    """

    __slots__ = ("_marks",)

    def __init__(self) -> None:
        self._marks: deque[tuple[float, int]] = deque()

    def age(self, now: float, sent: int, confirmed: int) -> float:
        """Seconds since the oldest unconfirmed message was sent (0 when none is), as seen
        at ``now`` (a monotonic clock) with ``sent`` and ``confirmed`` read then."""
        marks = self._marks
        if marks and sent < marks[-1][1]:  # a new numbering: the marks say nothing of it
            marks.clear()
        while marks and marks[0][1] <= confirmed:
            marks.popleft()
        if sent <= confirmed:
            return 0.0
        if not marks or marks[-1][1] < sent:
            marks.append((now, sent))
        return now - marks[0][0]
