"""The streaming source: partitioned streams feeding a Structured Streaming query.

``spark.readStream.format("pykka-delivery").options(...).load()`` gives one row per
message of the streams named in the ``streams`` option, each sent by a
`PartitionedProducer` in a producer service.

Theory of operation:

* **Where it runs.** Spark keeps one long-lived Python process per streaming source on the
  driver side, and calls ``initialOffset``, ``latestOffset``, ``partitions``, ``commit``
  and ``stop`` there. On the first of those calls the reader starts, in that process, a
  transport node, a coordinator connection and one `GroupMember` per stream (consumer
  group ``group``, default ``"spark"``), so it consumes each partition of each stream.
  ``read`` runs in executor processes and only reads files.
* **Producers found in the catalog.** A stream named alone (``streams="clicks"``) has
  its producers listed in the coordinator's stream catalog: every named
  `PartitionedProducer` of it (``name="web"``, ``name="mobile"``, ...) registers there.
  For each partition it consumes, the member has one session per producer (behind one
  address), opens one to a producer that joins and closes that of one that leaves, and
  grows with the stream when the coordinator pushes a growth: nothing asks for a
  producer's address. The older ``name=host:port`` entry still reads the one unnamed
  producer of a stream at that node address.
* **A log per stream partition, made when first needed.** A partition's log is opened
  when its consumer first activates (its deduplication store is the log) or when Spark's
  offsets name it, so a stream that grows while the query runs gets logs for its new
  partitions, and the offsets gain their keys.
* **Standby queries.** By default (``standby=true``) every partition is a simple
  single-active-consumer group: the first query consumes every partition, a second query
  on the same group stands by, and takes over the partitions when the first one's process
  is lost (after the coordinator's ``disconnected_timeout``) or stops. With
  ``standby=false`` the queries of a group share the partitions instead.
* **Log, then confirm.** Each message received is staged in its partition's durable log
  (`PartitionLog`, one SQLite file per stream partition under ``log_dir``), with the
  producer's position, and confirmed. The log is the consumer's deduplication store: it
  commits the staged messages and the positions in one transaction before any
  confirmation leaves for the producer, so a message the producer forgets is in the log,
  and one the producer resends after a crash is recognised and not logged twice. It keeps
  one position per producer id, so the several producers of a partition dedup
  independently (the ``producer_id`` column tells them apart: ``clicks-3:spark@web``).
* **Offsets.** An offset is ``{"<stream>/<partition>": log position}``. ``latestOffset``
  commits what is staged and answers the log ends (capped by ``max_rows_per_batch``);
  ``partitions(start, end)`` splits the ranges (at most ``rows_per_partition`` rows each);
  ``read`` returns a range's rows from the log file; ``commit(end)`` trims the logs up to
  ``end``. Spark writes a micro-batch's offsets to its checkpoint before running it and
  re-runs it with the same offsets after a crash, and the log keeps every row until Spark
  commits it, so a query restarted from its checkpoint goes on without loss, and without
  counting twice in a sink that is idempotent per micro-batch.

Put ``log_dir`` under the query's checkpoint location: the log and the checkpoint belong
together (a new checkpoint with an old log starts from the log's kept rows). One query at
a time may use a log directory. Executors read the log files, so on a cluster ``log_dir``
must be on storage every executor reaches.

Options (strings; names case-insensitive):

=======================  ==========  =============================================================
option                   default     meaning
=======================  ==========  =============================================================
``coordinator``          required    the coordinator's ``host:port``
``streams``              required    stream names, comma-separated (``clicks,orders``): each
                                     stream's producers are found in the coordinator's catalog.
                                     Also accepted: ``name=host:port``, the one unnamed producer
                                     of stream ``name`` at that transport node
``log_dir``              required    where the partition logs live (under the checkpoint location)
``partitions``           catalog     a stream found in the catalog: the count it is created with
                                     there if the catalog lacks it (without it, such a stream is
                                     an error); its count then follows the catalog as it grows.
                                     A ``name=host:port`` stream: its count (default: the
                                     catalog's)
``catalog_namespace``    ``""``      the streams' namespace in the coordinator's catalog
``group``                ``spark``   the consumer group
``namespace``            ``default`` the coordinator namespace of the group
``standby``              ``true``    false: queries of a group share the partitions
``window``               500         each partition consumer's flow-control window
``max_rows_per_batch``   unlimited   cap on the rows of one micro-batch
``rows_per_partition``   100000      cap on the rows of one Spark partition of a micro-batch
``token``                none        the shared secret of the coordinator and the nodes
``host``                 127.0.0.1   the address the reader's transport node binds
=======================  ==========  =============================================================
"""

from __future__ import annotations

import datetime
import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.stream_rules import name_problem
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.errors import ClosedError
from pykka_delivery.partitions.catalog import catalog_partitions
from pykka_delivery.partitions.group import (
    DEFAULT_NAMESPACE,
    GroupDelivery,
    GroupMember,
    GroupMemberSettings,
)
from pykka_delivery.spark._process import OptionError, Options, connections
from pykka_delivery.spark.log import PartitionLog, read_log
from pykka_delivery.transport import Node

__all__ = ["DeliveryStreamReader", "LogRange", "SourceSettings", "encode_payload"]

logger = logging.getLogger("pykka_delivery.spark")


@dataclass(frozen=True, slots=True)
class SourceSettings:
    """The source's options, parsed (see the module docstring for each)."""

    coordinator: str
    # (stream, None): its producers are found in the catalog; (stream, "host:port"): the
    # node of its one unnamed producer.
    streams: tuple[tuple[str, str | None], ...]
    log_dir: str
    partitions: int | None
    group: str
    namespace: str
    standby: bool
    window: int
    max_rows_per_batch: int | None
    rows_per_partition: int
    token: str | None
    host: str
    catalog_namespace: str = ""

    @classmethod
    def parse(cls, options: Options) -> SourceSettings:
        max_rows = options.integer("max_rows_per_batch", 0, 0, 1_000_000_000)
        return cls(
            coordinator=options.address("coordinator"),
            streams=_parse_streams(options.text("streams")),
            log_dir=options.text("log_dir"),
            partitions=options.integer("partitions", 0, 0, 1024) or None,
            group=options.text("group", "spark"),
            namespace=options.text("namespace", DEFAULT_NAMESPACE),
            standby=options.flag("standby", True),
            window=options.integer("window", 500, 1, 100_000),
            max_rows_per_batch=max_rows or None,
            rows_per_partition=options.integer("rows_per_partition", 100_000, 1, 100_000_000),
            token=options.optional("token"),
            host=options.text("host", "127.0.0.1"),
            catalog_namespace=options.text("catalog_namespace", ""),
        )


def _parse_streams(raw: str) -> tuple[tuple[str, str | None], ...]:
    """The ``streams`` option's entries: ``name`` (found in the catalog) or
    ``name=host:port`` (the one unnamed producer at that node)."""
    streams: list[tuple[str, str | None]] = []
    for item in raw.split(","):
        entry = item.strip()
        name, sep, address = (part.strip() for part in entry.partition("="))
        host, _, port = address.rpartition(":")
        problem = name_problem("stream", name)
        if not entry:
            problem = "an empty entry"
        elif problem is None and sep and (not host or not port.isdigit()):
            problem = f"the producer address {address!r} is not host:port"
        elif problem is None and name in (s for s, _ in streams):
            problem = f"stream {name!r} is named twice"
        if problem is not None:
            msg = (
                f'pykka-delivery source: option "streams" has {entry!r}: {problem}; give '
                f"stream names, comma-separated (e.g. clicks or clicks,orders): each "
                f"stream's producers are found in the coordinator's catalog"
            )
            raise OptionError(msg)
        streams.append((name, address if sep else None))
    return tuple(streams)


@dataclass(slots=True)  # Spark's InputPartition is a plain class
class LogRange(InputPartition):
    """One Spark partition of a micro-batch: positions ``start`` (excluded) to ``end``
    (included) of one stream partition's log file."""

    path: str
    start: int
    end: int


def encode_payload(message: Any) -> tuple[bytes, str]:
    """A message as the ``payload`` column's bytes, with its content type (the
    ``headers`` column's ``content-type``)."""
    if isinstance(message, bytes):
        return message, "application/octet-stream"
    if isinstance(message, str):
        return message.encode("utf-8"), "text/plain; charset=utf-8"
    serialize = getattr(message, "SerializeToString", None)
    if serialize is not None:
        return serialize(), f"application/x-protobuf; messageType={message.DESCRIPTOR.full_name}"
    return (
        json.dumps(message, separators=(",", ":"), ensure_ascii=False).encode("utf-8"),
        "application/json",
    )


def _key_text(key: bytes | str | None) -> str | None:
    if isinstance(key, bytes):
        return key.decode("utf-8", errors="backslashreplace")
    return key


class _Running:
    """What the reader runs in Spark's stream-runner process: a group member per stream,
    and a log per stream partition, opened when first needed (`log`)."""

    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        node, client = connections(settings.coordinator, settings.token, settings.host)
        self._log_dir = Path(settings.log_dir)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        self._streams = frozenset(stream for stream, _ in settings.streams)
        self._lock = threading.Lock()
        self._closed = False
        # Replaced, never changed in place: Spark's thread iterates it while a member's
        # thread adds the log of a partition it activates.
        self.logs: dict[str, PartitionLog] = {}
        self.members: list[GroupMember] = []
        try:
            for stream, address in settings.streams:
                self.members.append(self._member(client, node, stream, address))
        except BaseException:
            self.close()
            raise
        logger.info(
            "pykka-delivery source consuming %s as group %r, logs in %s",
            ", ".join(f"{s} from {a or 'the catalog'}" for s, a in settings.streams),
            settings.group,
            self._log_dir,
        )

    def _member(
        self, client: CoordinatorClient, node: Node, stream: str, address: str | None
    ) -> GroupMember:
        settings = self.settings
        return GroupMember(
            client,
            stream,
            self._partitions(client, stream, address),
            settings.group,
            producer=address,
            handler=self._stage,
            node=node,
            namespace=settings.namespace,
            catalog_namespace=settings.catalog_namespace,
            settings=GroupMemberSettings(
                consumer=ConsumerControllerSettings(flow_control_window=settings.window)
            ),
            dedup_store=lambda p: self.log(stream, p).dedup_store(),
            spread=not settings.standby,
        )

    def _partitions(self, client: CoordinatorClient, stream: str, address: str | None) -> int:
        """The stream's partition count now: the catalog's (a stream found there is created
        with option ``partitions`` if the catalog lacks it), or the option's."""
        namespace = self.settings.catalog_namespace
        if address is not None and self.settings.partitions:
            return self.settings.partitions
        create_with = self.settings.partitions if address is None else None
        try:
            return catalog_partitions(client, stream, namespace=namespace, create_with=create_with)
        except KeyError:
            fix = (
                "start its producers first (PartitionedProducer.from_coordinator creates it), "
                'create it (CoordinatorClient.create_stream), or give option "partitions" '
                "(the count to create it with)"
            )
            msg = (
                f"pykka-delivery source: stream {stream!r} is not in the coordinator's catalog "
                f"(namespace {namespace!r}); {fix}"
            )
            raise OptionError(msg) from None

    def log(self, stream: str, partition: int) -> PartitionLog:
        """Stream partition ``partition``'s log, opened on first use.

        Raises:
            ClosedError: the reader stopped.
            LogError: as `PartitionLog`.
        """
        key = f"{stream}/{partition}"
        found = self.logs.get(key)
        if found is not None:
            return found
        with self._lock:
            found = self.logs.get(key)
            if found is None:
                if self._closed:
                    msg = f"pykka-delivery source: the reader stopped; no log for {key!r}"
                    raise ClosedError(msg)
                found = PartitionLog(
                    self._log_dir / f"{stream}-{partition}.sqlite", stream, partition
                )
                self.logs = {**self.logs, key: found}
            return found

    def log_of_key(self, key: str) -> PartitionLog | None:
        """The log of an offset's key ``"<stream>/<partition>"``, None if this query does
        not read that stream."""
        stream, _, partition = key.rpartition("/")
        if stream not in self._streams or not partition.isdigit():
            return None
        return self.log(stream, int(partition))

    def _stage(self, delivery: GroupDelivery) -> None:
        payload, content_type = encode_payload(delivery.message)
        key = f"{delivery.stream}/{delivery.partition}"
        log = self.logs.get(key) or self.log(delivery.stream, delivery.partition)
        log.stage(
            delivery.producer_id,
            delivery.seq_nr,
            _key_text(delivery.key),
            payload,
            {"content-type": content_type},
        )

    def close(self) -> None:
        for member in self.members:
            member.close()
        with self._lock:
            self._closed = True
            logs = self.logs
        for log in logs.values():
            log.close()


class DeliveryStreamReader(DataSourceStreamReader):
    """The stream reader Spark drives (see the module docstring)."""

    def __init__(self, settings: SourceSettings) -> None:
        self.settings = settings
        self._running: _Running | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to ship ``read`` to the executors: only the settings
        # travel (what runs stays in the stream-runner process).
        return {"settings": self.settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["settings"])  # type: ignore[misc]

    def _start(self) -> _Running:
        with self._lock:
            if self._running is None:
                self._running = _Running(self.settings)
            return self._running

    def initialOffset(self) -> dict[str, int]:
        """Where a new query starts: the oldest rows the logs open now keep (a log opened
        later starts at its own oldest row: see `partitions`)."""
        return {key: log.start() for key, log in sorted(self._start().logs.items())}

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: Any = None
    ) -> dict[str, int]:
        """Commit what is staged and answer the log ends, capped by
        ``max_rows_per_batch`` (shared fairly among the stream partitions)."""
        running = self._start()
        ends: dict[str, int] = {}
        for key, log in sorted(running.logs.items()):
            log.flush()
            ends[key] = log.end()
        cap = self.settings.max_rows_per_batch
        if cap is None or start is None:
            return ends
        return _capped(_starts(start, running.logs), ends, cap)

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[LogRange]:
        """The ranges between ``start`` and ``end``, at most ``rows_per_partition`` rows
        each."""
        running = self._start()
        step = self.settings.rows_per_partition
        ranges: list[LogRange] = []
        for key, last in sorted(end.items()):
            log = running.log_of_key(key)
            if log is None:
                msg = (
                    f"pykka-delivery source: the checkpoint names stream partition {key!r}, "
                    f"whose stream this query's streams option does not have; restart the "
                    f"query with the streams it was started with"
                )
                raise OptionError(msg)
            # A key new since `start` (a log opened later: a grown stream, or a partition
            # first activated) starts at its log's oldest row.
            first = start.get(key, log.start())
            for low in range(first, last, step):
                ranges.append(LogRange(str(log.path), low, min(low + step, last)))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        """A range's rows, from its log file (runs on an executor)."""
        assert isinstance(partition, LogRange)
        for r in read_log(partition.path, partition.start, partition.end):
            yield (
                r.stream,
                r.partition,
                r.producer_id,
                r.seq_nr,
                r.key,
                r.payload,
                datetime.datetime.fromtimestamp(r.timestamp_ms / 1000, tz=datetime.UTC),
                r.headers,
            )

    def commit(self, end: dict[str, int]) -> None:
        """Spark processed everything up to ``end``: trim the logs."""
        running = self._start()
        for key, position in end.items():
            log = running.log_of_key(key)
            if log is not None:
                log.trim(position)

    def stop(self) -> None:
        """The query stopped: leave the groups (the standby takes over) and close the
        logs."""
        with self._lock:
            running, self._running = self._running, None
        if running is not None:
            running.close()


def _starts(start: dict[str, int], logs: dict[str, PartitionLog]) -> dict[str, int]:
    """``start``, with the oldest kept row of each log it does not name yet."""
    return {**{key: log.start() for key, log in logs.items()}, **start}


def _capped(start: dict[str, int], ends: dict[str, int], cap: int) -> dict[str, int]:
    """``ends``, with at most ``cap`` rows past ``start`` in all: each stream partition
    gets an equal share, and the shares others leave go round again."""
    available = {k: max(0, e - start.get(k, 0)) for k, e in ends.items()}
    taken = dict.fromkeys(ends, 0)
    left = cap
    while left > 0:
        wanting = [k for k in sorted(ends) if taken[k] < available[k]]
        if not wanting:
            break
        share = max(1, left // len(wanting))
        for k in wanting:
            more = min(share, available[k] - taken[k], left)
            taken[k] += more
            left -= more
            if left == 0:
                break
    return {k: start.get(k, 0) + taken[k] for k in ends}
