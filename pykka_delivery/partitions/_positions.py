"""The positions a `PartitionedProducer` reports to the coordinator (lag as data, see
pykka_delivery/coordinator/lag.py): one `ProducerPosition` per (group, partition)
producer, read from its snapshot at each report of the client, so sending pays nothing
for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.lag import OldestUnconfirmed, ProducerPosition
from pykka_delivery.delivery.handles.producer import Producer
from pykka_delivery.partitions.catalog import partition_stream

__all__ = ["ProducerPositions"]


class ProducerPositions:
    """Reports the positions of a partitioned stream's producers through ``client``
    until `close`.

    Args:
        client: the coordinator client that sends them (not owned).
        namespace: the coordinator namespace of the stream's groups.
        stream: the stream's name.
        groups: the groups, in the order of each row of producers.
        rows: returns the producers now, one row per partition (it changes on growth).
        clock: a monotonic clock, for the age of the oldest unconfirmed message.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        namespace: str,
        stream: str,
        *,
        groups: Sequence[str],
        rows: Callable[[], Sequence[Sequence[Producer]]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client = client
        self._namespace = namespace
        self._stream = stream
        self._groups = groups
        self._rows = rows
        self._clock = clock
        self._oldest: dict[str, OldestUnconfirmed] = {}
        client.add_position_source(self.positions)

    def positions(self) -> list[ProducerPosition]:
        """Where each producer is now (on the client's thread, at each report)."""
        now = self._clock()
        positions = []
        for partition, row in enumerate(self._rows()):
            stream = partition_stream(self._stream, partition)
            for group, producer in zip(self._groups, row, strict=True):
                snapshot = producer.snapshot()
                sent, confirmed = snapshot.sent_seq_nr, snapshot.confirmed_seq_nr
                oldest = self._oldest.setdefault(producer.producer_id, OldestUnconfirmed())
                positions.append(
                    ProducerPosition(
                        self._namespace,
                        stream,
                        partition,
                        producer.producer_id,
                        sent,
                        confirmed,
                        oldest.age(now, sent, confirmed),
                        group,
                    )
                )
        return positions

    def close(self) -> None:
        """Report no more (the coordinator forgets the positions after its
        ``lag_expiry``, or when the client says goodbye)."""
        self._client.remove_position_source(self.positions)
