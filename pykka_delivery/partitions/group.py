"""`GroupMember`: one process's membership in a consumer group of a partitioned stream.

Theory of operation:

* Every member of group g registers, through its process's `CoordinatorClient`, one
  subscription per partition p of the stream: a partitioned single-active-consumer group
  with key ``GroupId(namespace, "<stream>-<p>", g)`` and partition index p (a super
  stream's partition, as RabbitMQ models it). The coordinator shares the partitions by
  its ``partition_assignment``: the sticky rule by default (balanced, moving the fewest
  partitions on a join or leave), or RabbitMQ's ``eligible[p % len(eligible)]``.
* A join or a leave hands over each partition whose chosen member changes by a
  step-down (the old member finishes its delivery in flight, stops, answers, and only
  then the new one starts); the other partitions keep flowing.
* Per partition a `CoordinatedConsumer` consumes, only while active, group g's stream of
  that partition: from every producer of the stream found in the coordinator's stream
  catalog (the default: one session per producer behind one ref, a `MergedConsumer`,
  following producers that join or leave without any rebalance, see `_discovery`), or
  from the one producer it was given. It registers to each producer at each activation,
  so a producer resends from the first message nobody confirmed.
* Delivery to the application: a handler callback. One thread per partition takes the
  partition's deliveries one at a time and calls ``handler(GroupDelivery)`` (partition,
  key, message, producer id, seq_nr); when it returns, the delivery is confirmed. So a
  partition's messages are handled in order, one at a time, and different partitions'
  concurrently (one thread each). A handler that raises is logged and called again with
  the same delivery after a backoff (``retry_backoff_min`` doubling up to
  ``retry_backoff_max``): nothing is skipped, so a message that always fails holds its
  partition (and its hand-over, which waits for the delivery in flight) until the
  handler copes with it.
* `close` leaves gracefully: no new delivery is handled, the handler calls in progress
  get ``close_grace`` seconds to finish (and be confirmed), then every subscription is
  unregistered, which hands each partition to the next member at once. A delivery taken
  but not handled, or still in the handler past the grace, stays unconfirmed with the
  producer, for the next member.
* Growth: `grow` registers the member in the groups of a grown stream's new partitions
  (the coordinator spreads them as the old ones) and starts their threads; the
  partitions it had keep flowing. The producer's own `grow` is the barrier that keeps
  per-key order across the growth. A member that finds its producers in the catalog
  grows by itself when the coordinator pushes a growth.
* Exactly-once effect across hand-overs, optional: with a deduplication store each
  activation of partition p opens the store for consumer id ``consumer_id(stream, p, g)``
  (its position per producer id is the group's progress on that partition, per
  producer), skips what
  was confirmed before (a message at or below the stored position is confirmed without
  being delivered, so a lower confirmation never moves the position back), records each
  confirmation, and closes the store before it answers a step-down, so the next member
  opens it. One consumer id per (group, partition), not per group: a store holds its
  consumer id against every other opener (docs/durable.md), and a member may hold
  several partitions while other members hold the rest. With a transactional store
  (``dedup_store=lambda p: SqliteTxDedupStore(db, consumer_id(stream, p, group))``) the
  handler applies its effect in ``delivery.transaction(conn)``, so the effect and the
  position commit together: exactly once even when a member is killed mid-flow.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.coordinated_consumer import (
    ActivationInterval,
    CoordinatedConsumer,
)
from pykka_delivery.coordinator.state import SIMPLE
from pykka_delivery.delivery.handles.producer_set import ProducerSet
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.errors import ClosedError, DeliveryError
from pykka_delivery.partitions._catalog_watches import GrowthFollower
from pykka_delivery.partitions._discovery import StreamProducers
from pykka_delivery.partitions._member_loops import PartitionLoops
from pykka_delivery.partitions._member_parts import (
    DedupSource,
    dedup_factory,
    for_partition,
    producer_ref,
)
from pykka_delivery.partitions.catalog import (
    DEFAULT_NAMESPACE,
    catalog_partitions,
    partition_stream,
)
from pykka_delivery.partitions.config import GroupConfig, PartitionsConfig, StreamConfig
from pykka_delivery.partitions.records import GroupDelivery, GroupMemberSettings, GroupMemberStats
from pykka_delivery.protocol.messages import Ref
from pykka_delivery.protocol.serialization import Serialization
from pykka_delivery.retry import Backoff

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

# The records live in `records`; importable from here as well, where they were first defined.
__all__ = [
    "DEFAULT_NAMESPACE",
    "GroupDelivery",
    "GroupMember",
    "GroupMemberSettings",
    "GroupMemberStats",
]

logger = logging.getLogger("pykka_delivery.partitions")


class GroupMember(PartitionLoops):
    """This process's member of consumer group ``group`` on a partitioned stream.

    ::

        def handle(delivery: GroupDelivery) -> None:
            print(delivery.partition, delivery.key, delivery.message)

        member = GroupMember(client, "orders", 8, "billing", handler=handle, node=node)
        ...
        member.close()  # lets the handlers finish, then hands the partitions over

    Args:
        client: the process's connection to the coordinator (several members may share
            it; the caller closes it after them).
        stream: the stream's name.
        partitions: its partition count.
        group: the consumer group's name.
        handler: called with each `GroupDelivery`, on the partition's thread; the
            delivery is confirmed when it returns. Handlers of different partitions run
            at the same time.
        producer: None (the default): the stream's producers are found in the
            coordinator's stream catalog (named producers register there):
            for each partition it owns the member consumes from every producer at once,
            one session per producer behind one ref (`MergedConsumer`), opens a session
            to a producer that joins and closes that of one that leaves without any
            rebalance, and grows with the stream when the coordinator pushes a growth.
            Or where the stream's one unnamed `PartitionedProducer` is: the ``host:port``
            of its transport node, or a function from a partition to the ref of group
            ``group``'s producer of it (``partitioned.ref(group, p)`` in one process).
            ``node`` is required but for a function.
        node: the transport node each partition's consumer is exposed on at each
            activation, so that a producer in another process reaches it.
        namespace: the coordinator namespace of the group. Default `DEFAULT_NAMESPACE`.
        catalog_namespace: the stream's namespace in the catalog. Default ``""``.
        settings: see `GroupMemberSettings`.
        dedup_store: turns on deduplication across hand-overs: the path of an SQLite
            file shared by the group's members (a `SqliteDedupStore` is opened per
            activation, consumer id ``producer_id(stream, p, group)``), a ``postgresql://``
            URL of a database they share, on any host (a ``PostgresDedupStore`` per
            activation), or a function from
            a partition to a new store for one activation (closed when it ends); a
            `SqliteTxDedupStore` for exactly-once effect (`GroupDelivery.transaction`). None:
            none; a partition handed over after its Ack was lost, or taken from a killed
            member, may deliver again what was handled.
        serialization: reads the messages (inside their `KeyedMessage`); default
            `default_serialization`.
        timer_service: for the consumers' timers; default the process-wide one.
        spread: True (the default): the members share the partitions (the modulo rule
            above). False: each partition is a simple single-active-consumer group, so
            the member that registered first consumes every partition and the others
            stand by, each taking over the partitions of a member that leaves or is lost
            (the Spark source's standby queries). Every member of a group must agree.
        on_activated: called with a partition's index when this member starts consuming
            it, on that partition's thread.
        on_deactivated: called with a partition's index when this member stops
            consuming it (handed over, connection lost, `close`), on the thread that
            stopped it, before the partition is handed on. Both as
            `CoordinatedConsumer`'s hooks: they must not block, and one that raises is
            logged while consuming goes on.

    Raises:
        ValueError: a bad name or partition count, or a str ``producer`` without ``node``.
        CoordinatorRefused, ConnectionRejected, DeliveryTimeout, ClosedError: a
            registration failed (those made are unregistered again).
    """

    def __init__(
        self,
        client: CoordinatorClient,
        stream: str,
        partitions: int,
        group: str,
        *,
        handler: Callable[[GroupDelivery], None],
        producer: str | Callable[[int], Ref] | None = None,
        node: Node | None = None,
        namespace: str = DEFAULT_NAMESPACE,
        catalog_namespace: str = "",
        settings: GroupMemberSettings | None = None,
        dedup_store: DedupSource | None = None,
        serialization: Serialization | None = None,
        timer_service: TimerService | None = None,
        spread: bool = True,
        on_activated: Callable[[int], None] | None = None,
        on_deactivated: Callable[[int], None] | None = None,
    ) -> None:
        StreamConfig(stream, partitions)
        GroupConfig(group, (stream,))
        if (producer is None or isinstance(producer, str)) and node is None:
            what = "the producers of the catalog are" if producer is None else "the producer is"
            msg = (
                f"GroupMember of {group!r} on {stream!r}: {what} reached through a transport "
                f"node: give node= (this process's transport node)"
            )
            raise ValueError(msg)
        self.settings = settings = settings or GroupMemberSettings()
        self.stream, self.partitions, self.group, self.namespace = (
            stream,
            partitions,
            group,
            namespace,
        )
        self._handler = handler
        self._client = client
        self._serialization = serialization
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._busy: set[int] = set()  # partitions inside the handler (or confirming)
        self._stopping = threading.Event()
        self._closed = False
        self._handled = [0] * partitions
        self._failures = 0
        self.errors: list[BaseException] = []
        """What stopped a partition's consumer (a refusal, a failing store), oldest first."""

        self._follower: GrowthFollower | None = None
        self._producers: StreamProducers | None = None
        source: str | Callable[[int], Ref | ProducerSet]
        if producer is None:
            assert node is not None
            self._producers = StreamProducers(
                client,
                stream,
                group,
                node,
                namespace=catalog_namespace,
                on_partitions=self._on_catalog_partitions,
                timeout=settings.registration_timeout,
            )
            source = self._producers.for_partition
        else:
            source = producer

        def join(partition: int) -> CoordinatedConsumer:
            return CoordinatedConsumer(
                client,
                namespace,
                partition_stream(stream, partition),
                group,
                producer_ref(source, node, stream, group, partition),
                partition_index=partition if spread else SIMPLE,
                settings=settings.consumer,
                serialization=serialization,
                timer_service=timer_service,
                node=node,
                timeout=settings.registration_timeout,
                dedup_store=dedup_factory(dedup_store, settings.dedup, stream, group, partition),
                on_activated=for_partition(on_activated, partition),
                on_deactivated=for_partition(on_deactivated, partition),
            )

        self._join = join
        self._consumers: list[CoordinatedConsumer] = []
        # Consumers a partition had before it re-joined (their intervals still count).
        self._retired: list[list[CoordinatedConsumer]] = [[] for _ in range(partitions)]
        try:
            for partition in range(partitions):
                self._consumers.append(join(partition))
        except BaseException:
            for consumer in self._consumers:
                with contextlib.suppress(DeliveryError):
                    consumer.close(timeout=settings.registration_timeout)
            if self._producers is not None:
                self._producers.close()
            raise
        self._grow_lock = threading.Lock()  # one growth at a time
        self._threads = [self._thread(partition) for partition in range(partitions)]
        for thread in self._threads:
            thread.start()
        if self._producers is not None:
            self._follower = GrowthFollower(
                f"GroupMember {group!r} of {stream!r}",
                lambda: self.partitions,
                self.grow,
                Backoff(settings.retry_backoff_min, settings.retry_backoff_max),
            )
            self._follower.want(self._producers.partitions)  # a growth listed meanwhile

    @classmethod
    def from_config(
        cls,
        config: PartitionsConfig,
        stream: str,
        group: str,
        client: CoordinatorClient,
        *,
        handler: Callable[[GroupDelivery], None],
        producer: str | Callable[[int], Ref] | None = None,
        **kwargs: Any,
    ) -> GroupMember:
        """A member of ``group`` on ``stream`` as ``config`` declares them (the partition
        count); ``kwargs`` as for the constructor.

        Raises:
            KeyError: ``config`` declares no such stream.
            ValueError: ``config`` declares no such group, or the group does not follow
                the stream.
        """
        declared = config.stream(stream)
        following = [g.name for g in config.groups_following(stream)]
        if group not in following:
            msg = (
                f"group {group!r} does not follow stream {stream!r} in the config "
                f"(groups following it: {following}); add {stream!r} to its streams"
            )
            raise ValueError(msg)
        return cls(
            client,
            stream,
            declared.partitions,
            group,
            producer=producer,
            handler=handler,
            **kwargs,
        )

    @classmethod
    def from_coordinator(
        cls,
        client: CoordinatorClient,
        stream: str,
        group: str,
        *,
        handler: Callable[[GroupDelivery], None],
        producer: str | Callable[[int], Ref] | None = None,
        catalog_namespace: str = "",
        create_with: int | None = None,
        timeout: float | None = None,
        **kwargs: Any,
    ) -> GroupMember:
        """A member of ``group`` on ``stream`` with the partition count of the
        coordinator's stream catalog (see
        `pykka_delivery.partitions.catalog.catalog_partitions`: ``create_with`` creates
        a stream the catalog lacks). ``catalog_namespace`` is the stream's namespace in
        the catalog (the group's own is ``namespace``, in ``kwargs``); ``timeout`` bounds
        each catalog request; ``kwargs`` as for the constructor.

        Raises:
            KeyError, CoordinatorRefused, ...: as ``catalog_partitions``.
            ValueError, ...: as the constructor.
        """
        partitions = catalog_partitions(
            client, stream, namespace=catalog_namespace, create_with=create_with, timeout=timeout
        )
        return cls(
            client,
            stream,
            partitions,
            group,
            producer=producer,
            handler=handler,
            catalog_namespace=catalog_namespace,
            **kwargs,
        )

    # --- state --------------------------------------------------------------------------

    def owned(self) -> frozenset[int]:
        """The partitions this member consumes now."""
        return frozenset(p for p, c in enumerate(self._consumers) if c.is_consuming)

    def intervals(self) -> dict[int, tuple[ActivationInterval, ...]]:
        """Per partition, every period this member consumed it (`time.monotonic`)."""
        return {
            p: tuple(i for c in (*self._retired[p], current) for i in c.intervals())
            for p, current in enumerate(self._consumers)
        }

    def statistics(self) -> GroupMemberStats:
        with self._lock:
            handled, failures = tuple(self._handled), self._failures
        return GroupMemberStats(
            handled,
            failures,
            tuple(len(spans) for spans in self.intervals().values()),
            self.owned(),
        )

    # --- growth ---------------------------------------------------------------------------

    def grow(self, partitions: int) -> bool:
        """Follow the stream's growth to ``partitions`` partitions: register this member
        in the group of each new partition (with its partition index, so the
        coordinator's modulo rule spreads the new partitions over the members as the old
        ones) and start their threads. The partitions this member had keep flowing,
        untouched. Every member of the group should grow, after the producer did
        (`PartitionedProducer.grow`: a new partition's producer exists only from then
        on).

        Returns:
            True if the member grew, False if it had that many partitions already.

        Raises:
            ValueError: ``partitions`` is below the current count (counts never shrink)
                or not a whole number of 1 or more.
            ClosedError: this member was closed (before or during the growth; the new
                partitions' registrations are then withdrawn).
            DeliveryError: a registration failed (``settings.registration_timeout``);
                the new partitions registered before it are kept and the count is
                unchanged past them: call grow again to register the rest.
        """
        StreamConfig(self.stream, partitions)
        with self._grow_lock:
            old = self.partitions
            if partitions < old:
                msg = (
                    f"GroupMember {self.group!r} of {self.stream!r} cannot shrink from {old} "
                    f"to {partitions} partitions: counts only grow; give {old} or more"
                )
                raise ValueError(msg)
            for partition in range(old, partitions):
                self._check_open()
                consumer = self._join(partition)
                thread = self._thread(partition)
                with self._lock:
                    if not self._closed:
                        self._handled.append(0)
                        self._retired.append([])
                        self._consumers.append(consumer)
                        self._threads.append(thread)
                        self.partitions = partition + 1
                        thread.start()
                        continue
                consumer.close(timeout=self.settings.registration_timeout)  # closed meanwhile
                self._check_open()
            if partitions > old:
                logger.info(
                    "GroupMember %r of %r grew from %d to %d partitions",
                    self.group,
                    self.stream,
                    old,
                    partitions,
                )
            return partitions > old

    def grow_from_catalog(
        self, *, catalog_namespace: str = "", timeout: float | None = None
    ) -> bool:
        """`grow` to the partition count of the coordinator's stream catalog, asked
        through this member's client; True if it grew. ``timeout`` bounds the catalog
        request.

        Raises:
            KeyError: the catalog has no such stream.
            ValueError, ClosedError, DeliveryError: as `grow`, and as
                ``client.stream_partitions``.
        """
        count = catalog_partitions(
            self._client, self.stream, namespace=catalog_namespace, timeout=timeout
        )
        return self.grow(count)

    def producers(self) -> tuple[str, ...]:
        """The names of the stream's producers in the catalog's last listing (members that
        find their producers there; () for one given by address)."""
        return () if self._producers is None else self._producers.names()

    def _on_catalog_partitions(self, partitions: int) -> None:
        """On the client's thread: the catalog lists ``partitions``; grow to it."""
        follower = self._follower
        if follower is not None:  # else the constructor catches up when it makes it
            follower.want(partitions)

    # --- leaving --------------------------------------------------------------------------

    def close(self, grace: float | None = None) -> None:
        """Leave the group gracefully: handle no new delivery, give the handler calls in
        progress ``grace`` seconds (default ``settings.close_grace``) to finish and be
        confirmed, then unregister every partition (each goes to the next member at
        once) and end the partitions' threads, also those waiting for a delivery or an
        activation. Idempotent; may be called from any thread, and from a handler (which
        it then does not wait for)."""
        grace = self.settings.close_grace if grace is None else grace
        current = threading.current_thread()
        own = {p for p, thread in enumerate(self._threads) if thread is current}
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopping.set()
        if self._follower is not None:
            self._follower.close(self.settings.registration_timeout)
        if self._producers is not None:
            self._producers.close()
        with self._lock:
            if not self._idle.wait_for(lambda: self._busy <= own, grace):
                logger.warning(
                    "GroupMember %r of %r: the handler still runs on partition(s) %s after "
                    "the %.1f s grace; their deliveries stay unconfirmed, for the next member",
                    self.group,
                    self.stream,
                    sorted(self._busy - own),
                    grace,
                )
            late = set(self._busy)  # not waited for any longer
        for consumer in self._consumers:
            consumer.close(timeout=self.settings.registration_timeout)
        deadline = time.monotonic() + self.settings.close_timeout
        for partition, thread in enumerate(self._threads):
            if partition not in late:
                thread.join(max(0.0, deadline - time.monotonic()))
        logger.info("GroupMember %r of %r left its partitions", self.group, self.stream)

    def __enter__(self) -> GroupMember:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------

    def _thread(self, partition: int) -> threading.Thread:
        return threading.Thread(
            target=self._consume,
            args=(partition,),
            name=f"group-{self.group}-{partition_stream(self.stream, partition)}",
            daemon=True,
        )

    def _check_open(self) -> None:
        if self._closed:
            msg = f"GroupMember {self.group!r} of {self.stream!r} is closed"
            raise ClosedError(msg)
