"""A named `PartitionedProducer`'s entry in the coordinator's stream catalog.

While it runs, the producer is listed under its stream (name, node address, partitions
served), so that members find it without being told its address. It watches its stream:
a growth pushed by the coordinator (``create_stream`` with more partitions, by anyone) is
followed on a thread of its own with the producer's `grow` barrier, then the entry is
registered again with the new count, so members open the new partitions' sessions only
once this producer serves them. Leaving withdraws the entry (the producer drained first).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING

from pykka_delivery.coordinator import CatalogStream, CoordinatorClient, CoordinatorRefused, Refusal
from pykka_delivery.errors import DeliveryError
from pykka_delivery.partitions._catalog_watches import GrowthFollower, watch_catalog
from pykka_delivery.retry import Backoff

if TYPE_CHECKING:
    from pykka_delivery.partitions.producer import PartitionedProducer

__all__ = ["CatalogPresence"]

logger = logging.getLogger("pykka_delivery.partitions")


class CatalogPresence:
    """Registers ``producer`` as ``name`` at ``address`` in ``namespace``'s catalog and
    follows its stream's growth until `leave`.

    Raises:
        CoordinatorRefused: ``"stream_not_found"`` (create the stream first),
            ``"producer_conflict"`` (another live producer had that name for
            ``settings.name_wait``).
        ConnectionRejected, DeliveryTimeout, ClosedError: the coordinator was not reached.
    """

    def __init__(
        self,
        producer: PartitionedProducer,
        client: CoordinatorClient,
        name: str,
        address: str,
        namespace: str,
    ) -> None:
        self._producer = producer
        self._client = client
        self._name = name
        self._address = address
        self._namespace = namespace
        settings = producer.settings
        self._timeout = settings.registration_timeout
        self.registration_id = self._register_first(settings.name_wait)
        self._follower = GrowthFollower(
            f"PartitionedProducer {producer.stream!r} ({name})",
            lambda: producer.partitions,
            self._grow,
            Backoff(settings.retry_backoff_min, settings.retry_backoff_max),
        )
        try:
            self._stop_watch = watch_catalog(
                client,
                producer.stream,
                self._on_catalog,
                namespace=namespace,
                timeout=self._timeout,
            )
        except BaseException:
            self._follower.close()
            self._deregister()
            raise

    @property
    def errors(self) -> list[BaseException]:
        """Failed attempts to follow a growth, oldest first (each was tried again)."""
        return self._follower.errors

    def leave(self) -> None:
        """Stop following the stream and withdraw the entry (members close this producer's
        sessions). Errors reaching the coordinator are logged: the entry then goes with
        this client's connection."""
        self._follower.close(self._producer.settings.grow_timeout)
        with contextlib.suppress(DeliveryError):
            self._stop_watch()
        self._deregister()

    def _register_first(self, name_wait: float) -> int:
        """Register, trying again for up to ``name_wait`` seconds while another connection
        holds the name: a predecessor killed a moment ago, whose connection the
        coordinator has not seen end yet (a lost connection's name is taken over)."""
        producer = self._producer
        deadline = time.monotonic() + name_wait
        delays = Backoff(0.05, 1.0).delays()
        while True:
            try:
                return self._client.register_producer(
                    producer.stream,
                    self._name,
                    self._address,
                    producer.partitions,
                    namespace=self._namespace,
                    timeout=self._timeout,
                )
            except CoordinatorRefused as refused:
                delay = next(delays)
                if (
                    refused.refusal is not Refusal.PRODUCER_CONFLICT
                    or time.monotonic() + delay > deadline
                ):
                    raise
                logger.info(
                    "PartitionedProducer %r: name %r is still held (%s); trying again in %.3g s",
                    producer.stream,
                    self._name,
                    refused,
                    delay,
                )
                time.sleep(delay)

    def _on_catalog(self, streams: tuple[CatalogStream, ...]) -> None:
        for stream in streams:
            if stream.name == self._producer.stream:
                self._follower.want(stream.partitions)

    def _grow(self, partitions: int) -> None:
        producer = self._producer
        producer.grow(partitions, producer.settings.grow_timeout)
        # Members open a partition's session only once this producer serves it.
        self._client.register_producer(
            producer.stream,
            self._name,
            self._address,
            producer.partitions,
            namespace=self._namespace,
            timeout=self._timeout,
            registration_id=self.registration_id,
        )

    def _deregister(self) -> None:
        try:
            self._client.deregister_producer(
                self._producer.stream,
                self.registration_id,
                namespace=self._namespace,
                timeout=self._timeout,
            )
        except DeliveryError as error:
            logger.warning(
                "PartitionedProducer %r (%s) could not leave the catalog (%s); its entry "
                "goes with the client's connection",
                self._producer.stream,
                self._name,
                error,
            )
