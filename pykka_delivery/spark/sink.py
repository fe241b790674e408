"""The sink: a DataFrame's rows delivered reliably to the workers of a service key.

``df.write.format("pykka-delivery").option(...).save()`` (and ``writeStream``) runs
`deliver_rows` in every Spark task. The task is a `WorkPullingProducer` whose workers are
the consumer services registered under the ``service_key`` option in the coordinator's
service directory (`SinkWorker` is such a service); each row goes to one worker with
demand, and the rows a worker leaves unconfirmed (it died, say) go to the others.

Theory of operation:

* **A stable producer per task.** The producer id is ``<write id>-<partition>`` for a
  batch write (the write id is made once when Spark plans the write, or given with the
  ``write_id`` option) and ``<query id>-<batch id>-<partition>`` for a streaming query
  (Spark keeps a query's id in its checkpoint, and re-runs a failed micro-batch with the
  same id). Every attempt of a task, retried or speculative, has the same producer id and
  numbers its rows the same way, so ``(producer id, row)`` names a row across attempts,
  and a worker that remembers the names it applied (`SqliteRowLedger`) applies each row
  once: exactly once in effect.
* **Flow control.** A task sends only while a worker has demand (the workers' flow-control
  windows); a slow consumer slows the task, nothing piles up in memory. The task fails
  with `DeliveryTimeout` when no worker takes a row for ``timeout`` seconds.
* **Commit after confirmation.** A task returns only when every row it sent was confirmed
  by a worker, so Spark's driver-side commit runs only when every task's rows are. A
  failed write's abort logs which partitions were delivered completely; the others may
  have been delivered in part: save again with the same ``write_id`` to deliver the rest
  without duplicates.

Options (strings; names case-insensitive):

=====================  ========  ==============================================================
option                 default   meaning
=====================  ========  ==============================================================
``coordinator``        required  the coordinator's ``host:port`` (`CoordinatorInDriver.address`)
``service_key``        required  the key the consumer services registered under
``namespace``          ``""``    the service directory's namespace
``format``             ``json``  ``json``: one JSON object per row; ``arrow``: Arrow batches
``rows_per_message``   100/1000  rows per message (json / arrow); 1 for one row per message
``send_batch``         500       messages handed to the producer at once
``timeout``            600       seconds a task waits for a worker's demand, and for the last
                                 confirmations
``write_id``           new       names a batch write: the same id again resumes a failed write
``token``              none      the shared secret of the coordinator and the nodes
``host``               127.0.0.1 the address each task's transport node binds
=====================  ========  ==============================================================
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from pykka_delivery.coordinator.service_registry import CoordinatorServiceRegistry
from pykka_delivery.delivery.handles.work_pulling import WorkPullingProducer
from pykka_delivery.spark._process import Options, connections
from pykka_delivery.spark.rows import arrow_rows, json_rows

__all__ = [
    "DeliveryStreamWriter",
    "DeliveryWriter",
    "SinkCommit",
    "SinkSettings",
    "deliver_rows",
    "sink_writer",
]

logger = logging.getLogger("pykka_delivery.spark")


@dataclass(frozen=True, slots=True)
class SinkSettings:
    """The sink's options, parsed (see the module docstring for each)."""

    coordinator: str
    service_key: str
    namespace: str
    format: str
    rows_per_message: int
    send_batch: int
    timeout: float
    token: str | None
    host: str

    @classmethod
    def parse(cls, options: Options) -> SinkSettings:
        format_ = options.choice("format", "json", ("json", "arrow"))
        return cls(
            coordinator=options.address("coordinator"),
            service_key=options.text("service_key"),
            namespace=options.text("namespace", ""),
            format=format_,
            rows_per_message=options.integer(
                "rows_per_message", 100 if format_ == "json" else 1000, 1, 1_000_000
            ),
            send_batch=options.integer("send_batch", 500, 1, 100_000),
            timeout=options.seconds("timeout", 600.0),
            token=options.optional("token"),
            host=options.text("host", "127.0.0.1"),
        )


@dataclass(slots=True)  # Spark's WriterCommitMessage is a plain dataclass
class SinkCommit(WriterCommitMessage):
    """What a task reports to the driver: every one of its rows was confirmed.

    Attributes:
        producer_id: the task's producer id.
        partition: its Spark partition.
        rows: rows delivered (each confirmed by a worker).
        messages: messages they travelled in.
        seconds: how long the task took, from its first row to the last confirmation.
    """

    producer_id: str
    partition: int
    rows: int
    messages: int
    seconds: float


def _messages(settings: SinkSettings, producer_id: str, batches: Iterator[Any]) -> Iterator[Any]:
    """A task's rows, which Spark hands over as Arrow record batches, as `SparkRows`
    messages numbered from 0. JSON rows come from ``to_pylist`` (Arrow's own conversion,
    cheaper than Spark building a `Row` per row)."""
    per = settings.rows_per_message
    first = 0
    arrow = settings.format == "arrow"
    for batch in batches:  # pyarrow.RecordBatch
        if arrow:
            for offset in range(0, batch.num_rows, per):
                part = batch.slice(offset, per)
                yield arrow_rows(producer_id, first, part)
                first += part.num_rows
            continue
        records = batch.to_pylist()
        for offset in range(0, len(records), per):
            chunk = records[offset : offset + per]
            yield json_rows(producer_id, first, chunk)
            first += len(chunk)


def deliver_rows(
    settings: SinkSettings, producer_id: str, partition: int, rows: Iterator[Any]
) -> SinkCommit:
    """Deliver one task's rows (Spark `Row`s, or Arrow record batches with
    ``format="arrow"``) to the workers of ``settings.service_key``; return when every one
    was confirmed.

    Raises:
        DeliveryTimeout: no worker had demand, or the last confirmations did not come,
            within ``settings.timeout`` seconds.
    """
    started = time.monotonic()
    node, client = connections(settings.coordinator, settings.token, settings.host)
    registry = CoordinatorServiceRegistry(client, node.ref, namespace=settings.namespace)
    names: list[str] = []

    def worker_ref(local: Any, worker_id: str) -> Any:
        name = f"{producer_id}-{worker_id}"
        names.append(name)
        return node.register(name, local)

    producer = WorkPullingProducer(
        producer_id, settings.service_key, registry=registry, worker_ref_factory=worker_ref
    )
    rows_sent = messages_sent = 0
    try:
        messages = _messages(settings, producer_id, rows)
        while True:
            batch = list(itertools.islice(messages, settings.send_batch))
            if not batch:
                break
            producer.send_many(batch, timeout=settings.timeout)
            messages_sent += len(batch)
            rows_sent += sum(m.count for m in batch)
        producer.wait_confirmed(timeout=settings.timeout)
    except BaseException:
        stats = producer.statistics()
        logger.error(
            "Spark sink task %r (partition %d) failed after sending %d rows in %d messages, "
            "%d messages confirmed; the others may or may not have reached a worker, and a "
            "retry of the task sends them again under the same names",
            producer_id,
            partition,
            rows_sent,
            messages_sent,
            stats.confirmed,
        )
        raise
    finally:
        producer.close()
        for name in names:
            node.unregister(name)
    seconds = time.monotonic() - started
    logger.info(
        "Spark sink task %r delivered %d rows in %d messages in %.2f s",
        producer_id,
        rows_sent,
        messages_sent,
        seconds,
    )
    return SinkCommit(producer_id, partition, rows_sent, messages_sent, seconds)


_AGAIN_BATCH = "Save again with option write_id set to this write's id"
_AGAIN_STREAM = "Restart the query from its checkpoint (Spark runs the batch again)"


def _task() -> Any:
    from pyspark import TaskContext  # noqa: PLC0415 (Spark's rule: import in tasks)

    context = TaskContext.get()
    if context is None:
        msg = "the pykka-delivery sink's write() runs in a Spark task only"
        raise RuntimeError(msg)
    return context


def _report(
    kind: str, name: str, messages: list[WriterCommitMessage | None], failed: bool, again: str
) -> None:
    delivered = [m for m in messages if isinstance(m, SinkCommit)]
    rows = sum(m.rows for m in delivered)
    if not failed:
        logger.info(
            "Spark sink %s %s: %d partitions, %d rows delivered", kind, name, len(delivered), rows
        )
        return
    missing = [i for i, m in enumerate(messages) if not isinstance(m, SinkCommit)]
    logger.error(
        "Spark sink %s %s aborted: partitions %s delivered all their rows (%d); partitions "
        "%s did not confirm all theirs, some of which may have reached the workers. %s to "
        "deliver the rest without duplicates",
        kind,
        name,
        [m.partition for m in delivered],
        rows,
        missing,
        again,
    )


class DeliveryWriter(DataSourceArrowWriter):
    """The batch writer: each task delivers its partition's rows (`deliver_rows`). Spark
    hands them over as Arrow record batches whatever the row format."""

    def __init__(self, settings: SinkSettings, write_id: str) -> None:
        self.settings = settings
        self.write_id = write_id

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        partition = _task().partitionId()
        return deliver_rows(self.settings, f"{self.write_id}-{partition}", partition, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _report("write", self.write_id, messages, False, _AGAIN_BATCH)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _report("write", self.write_id, messages, True, _AGAIN_BATCH)


class DeliveryStreamWriter(DataSourceStreamArrowWriter):
    """The streaming writer: each micro-batch's tasks deliver their rows, with producer
    ids ``<query id>-<batch id>-<partition>``."""

    def __init__(self, settings: SinkSettings) -> None:
        self.settings = settings

    def write(self, iterator: Iterator[Any]) -> SinkCommit:
        task = _task()
        query = task.getLocalProperty("sql.streaming.queryId")
        batch = task.getLocalProperty("streaming.sql.batchId")
        if not query or batch is None:
            msg = "the pykka-delivery stream writer found no streaming query id or batch id"
            raise RuntimeError(msg)
        partition = task.partitionId()
        producer_id = f"{query}-{batch}-{partition}"
        return deliver_rows(self.settings, producer_id, partition, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report("micro-batch", str(batchId), messages, False, _AGAIN_STREAM)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report("micro-batch", str(batchId), messages, True, _AGAIN_STREAM)


def sink_writer(options: Options, *, streaming: bool) -> Any:
    """The writer Spark asks the data source for."""
    settings = SinkSettings.parse(options)
    if streaming:
        return DeliveryStreamWriter(settings)
    return DeliveryWriter(settings, options.text("write_id", str(uuid.uuid4())))
