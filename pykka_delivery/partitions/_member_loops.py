"""The partition threads of a `GroupMember`: each takes its partition's deliveries one
at a time, calls the handler until it returns (a failure is retried after a backoff,
nothing is skipped), confirms, and leaves and joins the partition's group again when its
consumer fails for good."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from pykka_delivery.coordinator.client import CoordinatorRefused
from pykka_delivery.coordinator.coordinated_consumer import CoordinatedConsumer
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.stores.dedup_tx import AlreadyApplied
from pykka_delivery.errors import ClosedError, DeliveryError, LocalProtocolError
from pykka_delivery.partitions.envelope import unwrap
from pykka_delivery.partitions.records import GroupDelivery, GroupMemberSettings
from pykka_delivery.protocol.serialization import Serialization

__all__ = ["PartitionLoops"]

logger = logging.getLogger("pykka_delivery.partitions")


class PartitionLoops:
    """The partition threads' work, for `GroupMember` (which sets these attributes)."""

    stream: str
    group: str
    settings: GroupMemberSettings
    errors: list[BaseException]
    _handler: Callable[[GroupDelivery], None]
    _serialization: Serialization | None
    _lock: threading.Lock
    _idle: threading.Condition
    _busy: set[int]
    _stopping: threading.Event
    _handled: list[int]
    _failures: int
    _consumers: list[CoordinatedConsumer]
    _retired: list[list[CoordinatedConsumer]]
    _join: Callable[[int], CoordinatedConsumer]

    def _consume(self, partition: int) -> None:
        """A partition's thread: its deliveries, one at a time, while this member is its
        active consumer (it waits in between). A consumer that fails (its deduplication
        store) leaves the partition's group and joins it again after a backoff."""
        delay = self.settings.retry_backoff_min
        while True:
            consumer = self._consumers[partition]
            try:
                delivery = consumer.receive()
            except ClosedError:
                return
            except CoordinatorRefused as error:
                # Logged by the client: the coordinator lost this subscription, and the
                # group now has another partition index. Joining again would be refused.
                self.errors.append(error)
                return
            except DeliveryError as error:
                # Its deduplication store failed to open: the next receive tries again.
                if not self._back_off(partition, "opening its deduplication store", error, delay):
                    return
                delay = min(delay * 2, self.settings.retry_backoff_max)
                continue
            delay = self.settings.retry_backoff_min
            with self._lock:
                if self._stopping.is_set():
                    return  # leaving: unconfirmed, so the next member gets it
                self._busy.add(partition)
            try:
                handled = self._handle(partition, delivery)
            except DeliveryError as error:  # confirming failed: the store gave up
                handled = self._rejoin(partition, error)
            finally:
                with self._lock:
                    self._busy.discard(partition)
                    self._idle.notify_all()
            if not handled:
                return

    def _back_off(self, partition: int, doing: str, error: BaseException, delay: float) -> bool:
        """Log a failure, count it and wait ``delay``; False if this member closed."""
        with self._lock:
            self._failures += 1
        logger.warning(
            "GroupMember %r of %r: partition %d failed %s (%s); trying again in %.3g s",
            self.group,
            self.stream,
            partition,
            doing,
            error,
            delay,
        )
        return not self._stopping.wait(delay)

    def _rejoin(self, partition: int, error: BaseException) -> bool:
        """The partition's consumer failed for good (its delivery in flight stays
        unconfirmed): leave the partition's group, so another member can take it over,
        and join again at the back. False if this member closed meanwhile."""
        self.errors.append(error)
        old = self._consumers[partition]
        with contextlib.suppress(DeliveryError):
            old.close(timeout=self.settings.registration_timeout)
        delay = self.settings.retry_backoff_min
        while self._back_off(partition, "confirming, so it joins again", error, delay):
            try:
                new = self._join(partition)
            except DeliveryError as failure:
                error = failure
                delay = min(delay * 2, self.settings.retry_backoff_max)
                continue
            with self._lock:
                self._retired[partition].append(old)
                self._consumers[partition] = new
                if not self._stopping.is_set():
                    return True
            new.close(timeout=self.settings.registration_timeout)  # closed meanwhile
            return False
        return False

    def _handle(self, partition: int, delivery: Delivery) -> bool:
        """Call the handler until it returns, then confirm; False if this member closed
        meanwhile (the delivery stays unconfirmed)."""
        delay = self.settings.retry_backoff_min
        store = self._consumers[partition].active_dedup_store
        while True:
            try:
                key, message = unwrap(delivery.message, self._serialization)
                self._handler(
                    GroupDelivery(
                        self.stream,
                        partition,
                        self.group,
                        key,
                        message,
                        delivery.producer_id,
                        delivery.seq_nr,
                        store,
                    )
                )
                break
            except AlreadyApplied:  # from record_in: applied before, so it is handled
                break
            except Exception:
                with self._lock:
                    self._failures += 1
                logger.exception(
                    "GroupMember %r of %r: the handler failed on partition %d seq_nr %d; "
                    "calling it again in %.3g s",
                    self.group,
                    self.stream,
                    partition,
                    delivery.seq_nr,
                    delay,
                )
                if self._stopping.wait(delay):
                    return False
                delay = min(delay * 2, self.settings.retry_backoff_max)
        try:
            delivery.confirm()
        except LocalProtocolError:
            # Closed past the grace: the consumer stopped and the delivery went back.
            logger.warning(
                "GroupMember %r of %r: partition %d seq_nr %d was handled after the member "
                "left; the next member may handle it again",
                self.group,
                self.stream,
                partition,
                delivery.seq_nr,
            )
            return False
        with self._lock:
            self._handled[partition] += 1
        return True
