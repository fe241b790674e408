"""`DeliveryCollector`: the Prometheus collector that turns the statistics of this
process's nodes, producer and consumer handles and coordinator servers into metrics.

Nothing is counted for it: at each scrape it reads the snapshots the objects keep anyway
(``statistics()``, ``snapshot()``, ``link_statistics()``, ``lag()``), so sending and
receiving pay nothing for metrics, served or not. Samples with the same labels (two
producers of one producer id in one process, say) are added up, so the exposition never
repeats a series.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pykka_delivery import _observed
from pykka_delivery.coordinator.lag import LagInfo, OldestUnconfirmed
from pykka_delivery.coordinator.service import CoordinatorServer, CoordinatorServerStats
from pykka_delivery.coordinator.stats import HandoverHistogram
from pykka_delivery.delivery.core.consumer import ConsumerSnapshot, ConsumerStats
from pykka_delivery.delivery.core.producer import ProducerSnapshot, ProducerStats
from pykka_delivery.metrics._read import read_all
from pykka_delivery.metrics._specs import SPECS, Spec
from pykka_delivery.transport import LinkStats, Node, NodeStats, RemoteRef

__all__ = ["DeliveryCollector"]

_Labels = tuple[str, ...]


class _Samples:
    """What one scrape found, by metric name and label values (values added up)."""

    def __init__(self) -> None:
        self.values: dict[str, dict[_Labels, float]] = {spec.name: {} for spec in SPECS}
        self.histograms: dict[str, dict[_Labels, HandoverHistogram]] = {}

    def add(self, name: str, labels: _Labels, value: float) -> None:
        series = self.values[name]
        series[labels] = series.get(labels, 0) + value

    def add_all(self, labels: _Labels, values: Iterable[tuple[str, float]]) -> None:
        for name, value in values:
            self.add(name, labels, value)


class DeliveryCollector(Collector):
    """Metrics of the nodes, producer and consumer handles and coordinator servers alive
    in this process, read from their statistics at each scrape (docs/metrics.md lists
    every metric).

    Args:
        read_timeout: seconds a scrape waits for the event loop of asyncio handles
            (`AsyncProducer`, `AsyncConsumer`), whose state is read on their loop; handles
            of a loop that does not answer in time are left out of that scrape.

    Register it with `register` (or ``registry.register(DeliveryCollector())``).
    """

    def __init__(self, read_timeout: float = 1.0) -> None:
        self.read_timeout = read_timeout
        # Scrapes may come at once (a threading HTTP server): one reads at a time.
        self._lock = threading.Lock()
        # Per producer, the marks that time its oldest unconfirmed message (one per scrape).
        self._oldest: weakref.WeakKeyDictionary[object, OldestUnconfirmed] = (
            weakref.WeakKeyDictionary()
        )

    @property
    def read_timeout(self) -> float:
        """See the class's arguments (may be changed between scrapes)."""
        return self._read_timeout

    @read_timeout.setter
    def read_timeout(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            msg = f"read_timeout must be a number of seconds above 0, got {value!r}"
            raise ValueError(msg)
        self._read_timeout = float(value)

    def describe(self) -> Iterator[Metric]:
        """The metric families without samples (names for the registry's checks)."""
        for spec in SPECS:
            yield _family(spec)

    def collect(self) -> Iterator[Metric]:
        """Every metric, read now."""
        with self._lock:
            samples = self._read()
        for spec in SPECS:
            family = _family(spec)
            if spec.kind == "histogram":
                for labels, h in samples.histograms.get(spec.name, {}).items():
                    buckets = [(_bound(b), float(count)) for b, count in h.buckets]
                    family.add_metric(labels, buckets, h.sum)  # type: ignore[attr-defined]
            else:
                for labels, value in samples.values[spec.name].items():
                    family.add_metric(labels, value)  # type: ignore[attr-defined]
            yield family

    def _read(self) -> _Samples:
        samples = _Samples()
        timeout = self.read_timeout
        for node in read_all(_observed.NODE, _read_node, timeout):
            _add_node(samples, *node)
        now = time.monotonic()
        for producer, producer_id, stats, snap in read_all(
            _observed.PRODUCER, _read_producer, timeout
        ):
            sent, confirmed = snap.sent_seq_nr, snap.confirmed_seq_nr
            oldest = self._oldest.get(producer)
            if oldest is None:
                oldest = self._oldest[producer] = OldestUnconfirmed()
            _add_producer(samples, producer_id, stats, snap, oldest.age(now, sent, confirmed))
        for consumer in read_all(_observed.CONSUMER, _read_consumer, timeout):
            _add_consumer(samples, *consumer)
        for server in read_all(_observed.COORDINATOR, _read_coordinator, timeout):
            _add_coordinator(samples, *server)
        return samples


def _family(spec: Spec) -> Metric:
    labels = list(spec.labels)
    if spec.kind == "counter":
        return CounterMetricFamily(spec.name, spec.doc, labels=labels)
    if spec.kind == "gauge":
        return GaugeMetricFamily(spec.name, spec.doc, labels=labels)
    return HistogramMetricFamily(spec.name, spec.doc, labels=labels)


def _bound(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else repr(float(bound))


# --- reading (on the thread each object's state belongs to) ----------------------------


def _read_node(node: Node) -> tuple[str, NodeStats, dict[str, LinkStats]] | None:
    if not node.address:  # not started: nothing to name it by
        return None
    return node.address, node.statistics(), node.link_statistics()


def _read_producer(producer: Any) -> tuple[object, str, ProducerStats, ProducerSnapshot]:
    return producer, producer.producer_id, producer.statistics(), producer.snapshot()


def _read_consumer(consumer: Any) -> tuple[str, ConsumerStats, ConsumerSnapshot]:
    ref = consumer.ref
    name = ref.path if isinstance(ref, RemoteRef) else ""
    return name, consumer.statistics(), consumer.snapshot()


def _read_coordinator(
    server: CoordinatorServer,
) -> tuple[str, CoordinatorServerStats, tuple[LagInfo, ...]] | None:
    if not server.address:  # not started
        return None
    return server.address, server.statistics(), server.lag()


# --- turning readings into samples ---------------------------------------------------


def _add_node(samples: _Samples, address: str, s: NodeStats, links: dict[str, LinkStats]) -> None:
    labels = (address,)
    samples.add_all(
        labels,
        [
            ("pykka_delivery_node_frames_sent", s.frames_sent),
            ("pykka_delivery_node_frames_received", s.frames_received),
            ("pykka_delivery_node_envelopes_sent", s.envelopes_sent),
            ("pykka_delivery_node_envelopes_received", s.envelopes_received),
            ("pykka_delivery_node_links_opened", s.links_opened),
            ("pykka_delivery_node_links_lost", s.links_lost),
            ("pykka_delivery_node_lost_in_flight", s.lost_in_flight),
            ("pykka_delivery_node_malformed", s.malformed),
            ("pykka_delivery_node_unknown_target", s.unknown_target),
            ("pykka_delivery_node_rejected_links", s.rejected_links),
        ],
    )
    samples.add("pykka_delivery_node_dropped", (address, "outbox_full"), s.dropped_pending)
    samples.add("pykka_delivery_node_dropped", (address, "unsendable"), s.dropped_unsendable)
    for peer, link in links.items():
        samples.add_all(
            (address, peer),
            [
                ("pykka_delivery_link_frames_sent", link.frames_sent),
                ("pykka_delivery_link_bytes_sent", link.bytes_sent),
                ("pykka_delivery_link_frames_received", link.frames_received),
                # Every link opened after the first is a reconnect.
                ("pykka_delivery_link_reconnects", max(0, link.links_opened - 1)),
                ("pykka_delivery_link_losses", link.links_lost),
                ("pykka_delivery_link_up", 1 if link.up else 0),
            ],
        )


def _add_producer(
    samples: _Samples, producer_id: str, s: ProducerStats, snap: ProducerSnapshot, age: float
) -> None:
    samples.add_all(
        (producer_id,),
        [
            ("pykka_delivery_messages_sent", s.sent),
            ("pykka_delivery_messages_resent", s.resent),
            ("pykka_delivery_messages_refused", s.refused_payloads),
            ("pykka_delivery_messages_stored", s.stored),
            ("pykka_delivery_messages_lost_on_close", s.lost_on_close),
            ("pykka_delivery_producer_protocol_errors", s.rejected),
            ("pykka_delivery_producer_fenced", s.fenced),
            ("pykka_delivery_producer_stuck", s.stuck),
            ("pykka_delivery_producer_in_flight", snap.in_flight),
            (
                "pykka_delivery_producer_window",
                max(0, snap.requested_seq_nr - snap.confirmed_seq_nr),
            ),
            ("pykka_delivery_producer_oldest_unconfirmed_age_seconds", age),
        ],
    )


def _add_consumer(samples: _Samples, name: str, s: ConsumerStats, snap: ConsumerSnapshot) -> None:
    samples.add_all(
        (name, snap.producer_id),
        [
            ("pykka_delivery_messages_delivered", s.delivered),
            ("pykka_delivery_messages_confirmed", s.confirmed),
            ("pykka_delivery_messages_rejected", s.rejected),
            # A rejected delivery is either delivered again or dead-lettered.
            ("pykka_delivery_messages_redelivered", s.rejected - s.dead_lettered),
            ("pykka_delivery_messages_dead_lettered", s.dead_lettered),
            ("pykka_delivery_consumer_duplicates", s.duplicates + s.dedup_duplicates),
            ("pykka_delivery_consumer_gaps", s.gaps),
            (
                "pykka_delivery_consumer_in_flight",
                max(0, snap.received_seq_nr - snap.confirmed_seq_nr),
            ),
            (
                "pykka_delivery_consumer_window",
                max(0, snap.requested_seq_nr - snap.confirmed_seq_nr),
            ),
        ],
    )


def _add_coordinator(
    samples: _Samples, address: str, s: CoordinatorServerStats, lag: tuple[LagInfo, ...]
) -> None:
    labels = (address,)
    samples.add_all(
        labels,
        [
            ("pykka_delivery_coordinator_streams_attached", s.streams_attached),
            ("pykka_delivery_coordinator_rejected", s.rejected),
            ("pykka_delivery_coordinator_malformed", s.malformed),
            ("pykka_delivery_coordinator_requests", s.requests),
            ("pykka_delivery_coordinator_updates_sent", s.updates_sent),
        ],
    )
    ended = "pykka_delivery_coordinator_streams_ended"
    samples.add(ended, (address, "goodbye"), s.streams_closed)
    samples.add(ended, (address, "lost"), s.streams_lost)
    probes = "pykka_delivery_coordinator_probes"
    samples.add(probes, (address, "gone"), s.probes_gone)
    samples.add(probes, (address, "alive"), s.probes_alive)
    samples.add(probes, (address, "no_answer"), s.probes_no_answer)
    c = s.coordinator
    if c is not None:  # the actor answered
        samples.add_all(
            labels,
            [
                ("pykka_delivery_coordinator_groups", c.groups),
                ("pykka_delivery_coordinator_rebalances", c.rebalances),
                ("pykka_delivery_coordinator_commands_applied", c.commands_applied),
                ("pykka_delivery_coordinator_commands_refused", c.commands_refused),
            ],
        )
        consumers = "pykka_delivery_coordinator_consumers"
        samples.add(consumers, (address, "active"), c.consumers_active)
        samples.add(consumers, (address, "waiting"), c.consumers_waiting)
        samples.add(consumers, (address, "disconnected"), c.consumers_disconnected)
        samples.add(consumers, (address, "presumed_down"), c.consumers_presumed_down)
        handovers = "pykka_delivery_coordinator_handover_duration_seconds"
        samples.histograms.setdefault(handovers, {})[labels] = c.handover_seconds
    for row in lag:
        key = (address, row.namespace, row.stream, row.group, str(row.partition_index))
        samples.add_all(
            (*key, row.producer_id),
            [
                ("pykka_delivery_lag_in_flight", row.in_flight),
                ("pykka_delivery_lag_oldest_unconfirmed_age_seconds", row.oldest_unconfirmed_age),
            ],
        )
