"""`PartitionedProducer`: one producer of a partitioned stream, for every group following it.

Theory of operation:

* A stream of N partitions is N independent ordered streams. Each consumer group that
  follows the stream gets every message, with its own progress, so for every group g and
  partition p there is one reliable stream: a `Producer` handle with producer id
  ``producer_id(stream, p, g)`` = ``"<stream>-<p>:<g>"``, exposed on the transport node
  under that same name. (``"<stream>-<p>"`` is the partition's stream, the coordinator's
  group key, as RabbitMQ names super stream partitions. A partition number has only
  digits and names have no ``:``, so distinct (stream, partition, group) never share an
  id.)
* `send(message, key)` places the message with the stream's `Router` (a key on the
  partition of its stable hash, in every process; no key: round robin), wraps it with its
  key (`KeyedMessage`, so the consumer sees the key) and hands it to every group's
  producer of that partition.
* All groups or none: `send` first waits until each of those producers has demand, then
  sends to each (which cannot block then: one thread at a time sends on a partition). So
  a `DeliveryTimeout` means that no group got the message, and retrying it duplicates
  nothing.
* Flow control: a partition's producer has demand while its group's active consumer has
  room in its window (`ConsumerControllerSettings.flow_control_window`). The slowest
  group of a partition, or a group with no active consumer for it, therefore holds `send`
  for that partition: the producer goes at the pace of its slowest group (as a Kafka
  producer would not: there the broker stores the messages; here the producer's memory
  is the buffer, bounded by the windows). Sends to other partitions are not held by it.
* Consumers find the producer, not the reverse. The active consumer of partition p in
  group g (a `CoordinatedConsumer`, run by a `GroupMember`) registers itself to
  ``<node address>/<producer id>``; the producer moves the partition's stream to whoever
  registered last and resends, from the first message not confirmed, what is unconfirmed.
  So the producer never asks the coordinator who is active: a hand-over is the next
  consumer's registration.
* Per-key order: a key always maps to the same partition (for a given partition count),
  and each partition is one ordered stream per group; hand-overs resume from the first
  unconfirmed message, so a key's messages are processed in the order they were sent
  (some again after a hand-over, never out of order).
* Growth: `grow` adds partitions to a running stream behind a barrier: it stops the
  sends, waits until every message sent so far is confirmed by every group, then opens
  the new partitions' producers and routes with the new count. A key that moves to a
  new partition therefore never overtakes its earlier messages on the old one; the cost
  is a pause of the sends of at most the time to confirm what is in flight.
* Durable: given a durable queue (an SQLite file, or a factory), each (group, partition)
  producer stores its messages there before sending them; a restarted producer resends
  what no consumer confirmed, with the original seq_nrs (docs/durable.md).
* Lag as data: given a `CoordinatorClient` (``coordinator``, or `from_coordinator`), the
  client reports each (group, partition) producer's position at every
  ``report_interval``, read from its snapshot then (docs/coordinator.md, "Lag").

* Replicas: a producer with a ``name`` has producer ids of its own
  (``producer_id(stream, p, g, name)``), so any number of named producers (one per
  service replica) send to one stream. Given a coordinator and a node it is listed in the
  coordinator's stream catalog (`CatalogPresence`), where the members find it and open a
  session to it per partition they own; it follows the stream's growth the coordinator
  pushes, and leaves the catalog when it closes, after its messages are confirmed.
  Without a name, the producer ids are the same in every process: one such producer per
  stream, reached by its address.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.stream_rules import name_problem
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue, DurableQueueError
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import ClosedError, DeliveryTimeout
from pykka_delivery.partitions._positions import ProducerPositions
from pykka_delivery.partitions._presence import CatalogPresence
from pykka_delivery.partitions._producer_parts import (
    DurableQueueSource,
    check_groups,
    open_queue,
    send_timeout,
)
from pykka_delivery.partitions.catalog import (
    DEFAULT_NAMESPACE,
    catalog_partitions,
    partition_stream,
    producer_id,
)
from pykka_delivery.partitions.config import PartitionsConfig, StreamConfig
from pykka_delivery.partitions.envelope import Key, wrap
from pykka_delivery.partitions.records import PartitionedProducerSettings, PartitionedProducerStats
from pykka_delivery.partitions.routing import Router
from pykka_delivery.protocol.messages import Ref
from pykka_delivery.protocol.serialization import Serialization

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

# The records and the catalog names live in `records` and `catalog`; importable from here
# as well, where they were first defined.
__all__ = [
    "PartitionedProducer",
    "PartitionedProducerSettings",
    "PartitionedProducerStats",
    "catalog_partitions",
    "partition_stream",
    "producer_id",
]

logger = logging.getLogger("pykka_delivery.partitions")


class PartitionedProducer:
    """Sends one stream's messages, partitioned by key, to every group that follows it.

    ::

        producer = PartitionedProducer("orders", 8, ["billing", "audit"], node=node)
        producer.send({"order": 42}, key="customer-7")  # returns the partition, here 3

    Args:
        stream: the stream's name (letters, digits, ``.``, ``_`` and ``-``).
        partitions: its partition count, 1 or more.
        groups: the consumer groups that follow it (at least one, each once).
        node: the transport node on which each (group, partition) producer is exposed
            under its producer id, for consumers in other processes. None: the producers
            are reached in this process only, through `ref`.
        settings: see `PartitionedProducerSettings`.
        durable_queue: a path: one SQLite file holding every (group, partition) queue
            (producer ids keep them apart), opened here and closed by `close`; a
            ``postgresql://`` URL: the same in a PostgreSQL database
            (``PostgresDurableQueue``, one pool per queue, default settings); or a factory
            called with each producer id, whose queues the caller owns. None (the
            default): no durable queue.
        serialization: writes each message inside its `KeyedMessage` (and the durable
            queues' payloads); default `default_serialization`.
        timer_service: for the producers' timers; default the process-wide one.
        start: the first partition of the round robin of unkeyed messages; default a
            random one.
        coordinator: a coordinator client that reports the producers' positions (lag as
            data: ``client.lag()``); the caller owns it. None (the default): no reports.
        namespace: the coordinator namespace of the groups' members (`GroupMember`'s
            ``namespace``), under which the positions are reported. Default
            `DEFAULT_NAMESPACE`.
        name: this producer's name among the stream's producers (a replica's stable
            name, e.g. ``"web-1"``: letters, digits, ``.``, ``_``, ``-``). Its producer
            ids are then ``producer_id(stream, p, g, name)``, its own, so any number of
            named producers run on one stream; the same name after a restart finds its
            durable queue again. With ``coordinator`` and ``node`` it registers in the
            coordinator's stream catalog (members find it there), follows the stream's
            growth pushed by the coordinator, and leaves the catalog on `close`. None
            (the default): the one producer of the stream, reached by its address.
        catalog_namespace: the stream's namespace in the catalog. Default ``""``.

    Raises:
        ValueError: a bad name, partition count, group list or namespace, or ``start``
            out of range.
        DurableQueueError: a durable queue could not be opened or loaded (those opened
            are closed again).
        CoordinatorRefused: a named producer's registration in the catalog was refused
            (``"stream_not_found"``: create the stream first, as `from_coordinator`
            does; ``"producer_conflict"``: another live producer has that name).
    """

    def __init__(
        self,
        stream: str,
        partitions: int,
        groups: Sequence[str],
        *,
        node: Node | None = None,
        settings: PartitionedProducerSettings | None = None,
        durable_queue: DurableQueueSource | None = None,
        serialization: Serialization | None = None,
        timer_service: TimerService | None = None,
        start: int | None = None,
        coordinator: CoordinatorClient | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        name: str | None = None,
        catalog_namespace: str = "",
    ) -> None:
        StreamConfig(stream, partitions)  # checks the name and the count
        groups = check_groups(stream, groups)
        for kind, value in (("namespace", namespace), ("producer", name)):
            problem = None if value is None else name_problem(kind, value)
            if problem is not None:
                msg = f"PartitionedProducer {stream!r}: {problem}"
                raise ValueError(msg)
        self.name = name or ""
        self._presence: CatalogPresence | None = None
        self.settings = settings = settings or PartitionedProducerSettings()
        self.stream = stream
        self.partitions = partitions
        self.groups = groups
        self._router = Router(partitions, start=start, run_length=settings.run_length)
        self._serialization = serialization
        self._node = node
        self._durable_queue = durable_queue
        self._timer_service = timer_service
        self._locks = [threading.Lock() for _ in range(partitions)]
        self._sent = [0] * partitions
        self._closed = False
        self._grow_lock = threading.Lock()  # one growth at a time
        self._owned_queues: list[DurableProducerQueue] = []
        # _producers[p][i]: group groups[i]'s producer of partition p.
        self._producers: list[list[Producer]] = []
        self._positions: ProducerPositions | None = None
        try:
            for partition in range(partitions):
                self._add_row(partition, self._producers)
        except BaseException:
            self.close()
            raise
        if coordinator is not None:
            self._positions = ProducerPositions(
                coordinator, namespace, stream, groups=groups, rows=lambda: self._producers
            )
            if name and node is not None:
                try:
                    self._presence = CatalogPresence(
                        self, coordinator, name, node.address, catalog_namespace
                    )
                except BaseException:
                    self.close()
                    raise

    @classmethod
    def from_config(
        cls, config: PartitionsConfig, stream: str, **kwargs: Any
    ) -> PartitionedProducer:
        """The producer of ``stream`` as ``config`` declares it: its partition count, and
        the groups that follow it. ``kwargs`` as for the constructor.

        Raises:
            KeyError: ``config`` declares no such stream.
            ValueError: no group follows it (nobody would get its messages).
        """
        declared = config.stream(stream)
        groups = [group.name for group in config.groups_following(stream)]
        return cls(stream, declared.partitions, groups, **kwargs)

    @classmethod
    def from_coordinator(
        cls,
        client: CoordinatorClient,
        stream: str,
        groups: Sequence[str],
        *,
        catalog_namespace: str = "",
        create_with: int | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> PartitionedProducer:
        """The producer of ``stream`` with the partition count of the coordinator's
        stream catalog (see `catalog_partitions`: ``create_with`` creates a stream the
        catalog lacks). ``catalog_namespace`` is the stream's namespace in the catalog;
        ``timeout`` bounds each request to the coordinator; ``kwargs`` as for the
        constructor. The producer reports its positions through ``client`` unless
        ``coordinator=None`` is given; given a ``name`` and a ``node`` it registers in
        the catalog, where members find it::

            producer = PartitionedProducer.from_coordinator(
                client, "clicks", ["totals"], name="web-1", node=node, create_with=8
            )

        Raises:
            KeyError, CoordinatorRefused, ...: as `catalog_partitions`.
            ValueError, DurableQueueError: as the constructor.
        """
        partitions = catalog_partitions(
            client, stream, namespace=catalog_namespace, create_with=create_with, timeout=timeout
        )
        kwargs.setdefault("coordinator", client)
        return cls(stream, partitions, groups, catalog_namespace=catalog_namespace, **kwargs)

    # --- sending -------------------------------------------------------------------------

    def send(self, message: Any, key: Key = None, timeout: float | None = None) -> int:
        """Send ``message`` to the partition of ``key`` (the next of the round robin
        without one), for every group; returns the partition.

        It waits until every group's producer of that partition has demand (the slowest
        group sets the pace), then sends to all of them: a timeout sends to none.

        Raises:
            DeliveryTimeout: not every group had room within ``timeout`` seconds; no group
                got the message (send it again).
            TypeError: the key is neither bytes, str nor None.
            SerializationError: the message cannot be serialized.
            ClosedError: this producer was closed.
            DurableQueueError: a group's durable queue failed every attempt: this
                producer closes itself; the groups before it in `groups` may have the
                message stored (they will deliver it), the others do not.
        """
        wrapped = wrap(message, key, self._serialization)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            router = self._router
            partition = router.route(key)
            lock = self._locks[partition]
            wait = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
            if not lock.acquire(timeout=wait):
                raise send_timeout(self.stream, partition, None, timeout)
            if self._router is router:
                break
            # The stream grew while this send waited (`grow` held every lock): the key may
            # have moved, so route it again with the new partition count.
            lock.release()
        try:
            self._check_open()
            producers = self._producers[partition]
            for index, producer in enumerate(producers):
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    producer.wait_for_demand(remaining)
                except DeliveryTimeout:
                    raise send_timeout(
                        self.stream, partition, self.groups[index], timeout
                    ) from None
            try:
                for producer in producers:
                    # Cannot block: it has demand, and only this thread sends on it.
                    producer.send(wrapped)
            except DurableQueueError:
                self.close()
                raise
            self._sent[partition] += 1
        finally:
            lock.release()
        return partition

    def wait_confirmed(self, timeout: float | None = None) -> None:
        """Block until every message sent so far is confirmed by every group.

        Raises:
            DeliveryTimeout: some are still unconfirmed after ``timeout`` seconds (the
                error names a (group, partition) that is behind).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for row in list(self._producers):
            for producer in row:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                producer.wait_confirmed(remaining)

    # --- growth ----------------------------------------------------------------------------

    def grow(self, partitions: int, timeout: float | None = None) -> bool:
        """Grow the stream to ``partitions`` partitions, keeping every key's order.

        A grown count moves some keys to other partitions (docs/partitions.md, "Growth").
        A moved key's next message must not be handled before its earlier ones, still on
        the old partition, so growth is a barrier: it stops every send (taking each
        partition's send lock), waits until every message sent so far is confirmed by
        every group, and only then opens every group's producer of each new partition
        (exposed on the node under its producer id, as the others), and switches the
        router to the new count. Sends waiting meanwhile then go on, routed with the new
        count. Its cost: sends pause for at most the time the groups take to confirm
        what is in flight (a window per (group, partition) at most), plus the opening of
        the new producers. The new partitions get messages once their consumers
        registered (the members' `GroupMember.grow`): until then a send to a new
        partition waits for demand, as with any partition without an active consumer.

        Args:
            partitions: the new count; the same count is accepted and does nothing.
            timeout: how long to wait for the send locks and the confirmations, in
                seconds; None waits as long as it takes.

        Returns:
            True if the stream grew, False if it had that many partitions already.

        Raises:
            ValueError: ``partitions`` is below the current count (counts never
                shrink: keys would move without their earlier messages) or not a
                whole number of 1 or more.
            DeliveryTimeout: a send held a partition, or a (group, partition) did not
                confirm everything, within ``timeout``: nothing changed, sends resume
                with the old count; call it again.
            ClosedError: this producer was closed.
            DurableQueueError: a new partition's durable queue could not be opened:
                nothing changed (the new producers opened are closed again).
        """
        StreamConfig(self.stream, partitions)  # a whole number of 1 or more
        deadline = None if timeout is None else time.monotonic() + timeout

        def remaining() -> float:
            return -1.0 if deadline is None else max(0.0, deadline - time.monotonic())

        if not self._grow_lock.acquire(timeout=remaining()):
            msg = (
                f"PartitionedProducer {self.stream!r}: another grow was still running after "
                f"{timeout} s; nothing changed"
            )
            raise DeliveryTimeout(msg)
        held: list[threading.Lock] = []
        try:
            self._check_open()
            old = self.partitions
            if partitions < old:
                msg = (
                    f"PartitionedProducer {self.stream!r} cannot shrink from {old} to "
                    f"{partitions} partitions: counts only grow (a key would move without "
                    f"its earlier messages); give {old} or more"
                )
                raise ValueError(msg)
            if partitions == old:
                return False
            for partition, lock in enumerate(self._locks):
                if not lock.acquire(timeout=remaining()):
                    raise send_timeout(self.stream, partition, None, timeout, growing=True)
                held.append(lock)
            self._barrier(deadline, timeout)
            rows = list(self._producers)
            try:
                for partition in range(old, partitions):
                    self._add_row(partition, rows)
            except BaseException:
                self._close_rows(rows[old:])
                raise
            self._locks = [*self._locks, *(threading.Lock() for _ in range(old, partitions))]
            self._sent = [*self._sent, *([0] * (partitions - old))]
            self._producers = rows
            self.partitions = partitions
            self._router = Router(partitions, run_length=self.settings.run_length)
            if self._closed:  # closed meanwhile: the new producers too
                self._close_rows(rows[old:])
            logger.info(
                "PartitionedProducer %r grew from %d to %d partitions", self.stream, old, partitions
            )
            return True
        finally:
            for lock in held:
                lock.release()
            self._grow_lock.release()

    def grow_from_catalog(
        self,
        client: CoordinatorClient,
        *,
        catalog_namespace: str = "",
        timeout: float | None = None,
    ) -> bool:
        """`grow` to the partition count of the coordinator's stream catalog (after
        ``client.create_stream(stream, larger)``); True if the stream grew. Call it from a
        loop, or when told of a growth, to follow the catalog. ``timeout`` bounds the
        catalog request and the growth each.

        Raises:
            KeyError: the catalog has no such stream.
            ValueError, DeliveryTimeout, ...: as `grow`, and as
                ``client.stream_partitions``.
        """
        count = catalog_partitions(
            client, self.stream, namespace=catalog_namespace, timeout=timeout
        )
        return self.grow(count, timeout)

    # --- what the consumers need ----------------------------------------------------------

    def ref(self, group: str, partition: int) -> Ref:
        """Where group ``group``'s consumer of ``partition`` registers (in this process;
        from another one: ``<node address>/<producer_id(...)>``).

        Raises:
            KeyError: not a group of this producer, or no such partition.
        """
        return self.producer(group, partition).ref

    def producer(self, group: str, partition: int) -> Producer:
        """The `Producer` handle of (``group``, ``partition``), for its snapshot and
        statistics (send through `send` only).

        Raises:
            KeyError: not a group of this producer, or no such partition.
        """
        if group not in self.groups or not 0 <= partition < self.partitions:
            msg = (
                f"PartitionedProducer {self.stream!r} has no producer for group {group!r} "
                f"and partition {partition!r}; groups {list(self.groups)}, partitions 0 to "
                f"{self.partitions - 1}"
            )
            raise KeyError(msg)
        return self._producers[partition][self.groups.index(group)]

    def statistics(self) -> PartitionedProducerStats:
        return PartitionedProducerStats(
            tuple(self._sent),
            {p.producer_id: p.statistics() for row in self._producers for p in row},
        )

    # --- lifecycle --------------------------------------------------------------------------

    def close(self) -> None:
        """Close every producer (unconfirmed messages are not resent any more: call
        `wait_confirmed` first, or use a durable queue), withdraw their names from the
        node, and close the durable queues this producer opened from a path. Idempotent.

        A producer in the catalog leaves gracefully first: it waits up to
        ``settings.leave_timeout`` for every group to confirm what was sent (what is still
        unconfirmed then is logged; a durable queue keeps it for a restart under the same
        name), then withdraws its entry, so its members close its sessions."""
        presence, self._presence = self._presence, None
        if presence is not None and not self._closed:
            try:
                self.wait_confirmed(self.settings.leave_timeout)
            except DeliveryTimeout as error:
                logger.warning(
                    "PartitionedProducer %r (%s) leaves with messages unconfirmed after %.3g s "
                    "(%s); a durable queue resends them when it restarts under its name",
                    self.stream,
                    self.name,
                    self.settings.leave_timeout,
                    error,
                )
        if presence is not None:
            presence.leave()
        self._closed = True
        if self._positions is not None:
            self._positions.close()
        self._close_rows(self._producers)
        queues, self._owned_queues = self._owned_queues, []
        for queue in queues:
            try:
                queue.close()
            except DurableQueueError as error:  # confirmations only: duplicates on restart
                logger.error("Closing %r failed: %s", queue, error)

    def __enter__(self) -> PartitionedProducer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals ----------------------------------------------------------------------------

    def _add_row(self, partition: int, rows: list[list[Producer]]) -> None:
        """Open every group's producer of ``partition`` and append them to ``rows`` as one
        row (appended first, so that a failure part way leaves them to be closed)."""
        row: list[Producer] = []
        rows.append(row)
        for group in self.groups:
            pid = producer_id(self.stream, partition, group, self.name)
            row.append(
                Producer(
                    pid,
                    self.settings.producer,
                    serialization=self._serialization,
                    timer_service=self._timer_service,
                    self_ref_factory=None if self._node is None else self._node.expose(pid),
                    durable_queue=open_queue(
                        self._durable_queue,
                        pid,
                        self.settings.durable_queue,
                        self._serialization,
                        self._owned_queues,
                    ),
                )
            )

    def _check_open(self) -> None:
        if self._closed:
            msg = f"PartitionedProducer {self.stream!r} is closed"
            raise ClosedError(msg)

    def _barrier(self, deadline: float | None, timeout: float | None) -> None:
        """Wait (every send lock held) until each (group, partition) producer has every
        message confirmed."""
        for partition, row in enumerate(self._producers):
            for index, producer in enumerate(row):
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    producer.wait_confirmed(remaining)
                except DeliveryTimeout:
                    msg = (
                        f"PartitionedProducer {self.stream!r} could not grow: group "
                        f"{self.groups[index]!r} had not confirmed every message of partition "
                        f"{partition} within {timeout} s (its active consumer is slow, or "
                        f"there is none); nothing changed, call grow again"
                    )
                    raise DeliveryTimeout(msg) from None

    def _close_rows(self, rows: list[list[Producer]]) -> None:
        for row in rows:
            for producer in row:
                producer.close()
                if self._node is not None:
                    self._node.unregister(producer.producer_id)
