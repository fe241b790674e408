"""`SinkWorker`: a consumer service's side of the Spark sink.

A consumer service runs one (or more) `SinkWorker`: it registers under the sink's
``service_key`` in the coordinator's service directory, so every Spark task of a write
sends it rows when it has demand, and it takes the rows of any number of tasks at once (a
`FanInConsumer`: one consumer per task). Each message's rows go to the application's
handler, then the message is confirmed.

Exactly once in effect: a retried Spark task sends its rows again, and the rows a worker
left unconfirmed when it died go to another worker. With a `SqliteRowLedger` (one file
shared by the workers of a host) the handler gets only rows never applied before, inside
the ledger's transaction (its ``connection`` argument): what it writes to that database
and the mark that the rows were applied commit together, so a row is applied once even
when a worker dies between the two. A `PostgresRowLedger` (a ``postgresql://`` URL) does
the same for the workers of every host: a retried task's rows are recognised whichever
host receives them. Without a ledger, delivery is at least once.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pykka_delivery.coordinator.client import CoordinatorClient
from pykka_delivery.coordinator.service_registry import CoordinatorServiceRegistry
from pykka_delivery.delivery.core.settings import ConsumerControllerSettings
from pykka_delivery.delivery.handles.fan_in import FanInConsumer, FanInSettings
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.stores.backends import backend_of
from pykka_delivery.spark.ledger import RowLedger, SqliteRowLedger
from pykka_delivery.spark.rows import SinkRows
from pykka_delivery.transport import Node

__all__ = ["SINK_WORKER_SETTINGS", "SinkWorker", "SinkWorkerStats"]

logger = logging.getLogger("pykka_delivery.spark")

RowsHandler = Callable[[SinkRows, Any], None]
"""Called with a message's rows and the ledger's connection in its transaction: an
`sqlite3.Connection` (`SqliteRowLedger`), a `psycopg.Connection` (`PostgresRowLedger`),
or None without a ledger."""

SINK_WORKER_SETTINGS = FanInSettings(
    consumer=ConsumerControllerSettings(flow_control_window=500, resend_interval_min=0.1)
)
"""A `SinkWorker`'s default settings.

* A window of 500 messages per Spark task: a task sends in bursts, and a wider window
  means fuller transport frames (500 against the consumer default of 50 took the sink
  from 22k to 39k rows/s at one row per message in bench/spark.py).
* A first retry after 0.1 s: a task waits for its last rows' confirmations, which a
  worker sends with its retried `Request` (work pulling confirms with the workers'
  Requests, not one Ack per message); the consumer default of 2 s would hold every task's
  end (and every micro-batch's) that long. The retries back off ×1.5 while a producer is
  silent."""


@dataclass(frozen=True, slots=True)
class SinkWorkerStats:
    """Counters of a `SinkWorker`.

    Attributes:
        messages: messages handled and confirmed.
        rows: rows handed to the handler.
        duplicate_rows: rows received again (a retried task, another worker's leftovers)
            and not handed over, because the ledger had them.
        producers: Spark tasks whose rows this worker received.
    """

    messages: int
    rows: int
    duplicate_rows: int
    producers: int


class SinkWorker:
    """Receives the rows the Spark sink delivers to ``service_key``.

    ::

        def handle(rows: SinkRows, db: sqlite3.Connection | None) -> None:
            rows_in = [(r["user"], r["n"]) for r in rows.rows]
            db.executemany("INSERT INTO clicks VALUES (?, ?)", rows_in)

        worker = SinkWorker(client, node, "clicks", handle, ledger="ledger.sqlite")

    Args:
        client: this process's connection to the coordinator (the directory).
        node: this process's transport node; the worker is exposed on it as ``name``.
        service_key: the sink's ``service_key`` option.
        handler: called with each message's rows (those not applied before, with a
            ledger) and the ledger's connection inside its transaction (None without a
            ledger). An exception rolls the transaction back; the message is handed over
            again after a backoff (see `FanInSettings`).
        ledger: a `SqliteRowLedger` or a `PostgresRowLedger`; or the path of an SQLite
            file, or a ``postgresql://`` URL, of one this worker opens and closes (the
            URL needs the ``[postgres]`` extra); None: no deduplication (at least once).
        namespace: the service directory's namespace (the sink's ``namespace`` option).
        settings: see `FanInSettings` (windows, idle timeout, handler retries). Default:
            `SINK_WORKER_SETTINGS`.
        name: the name the worker is exposed under on ``node``.
    """

    def __init__(
        self,
        client: CoordinatorClient,
        node: Node,
        service_key: str,
        handler: RowsHandler,
        *,
        ledger: RowLedger | str | os.PathLike[str] | None = None,
        namespace: str = "",
        settings: FanInSettings | None = None,
        name: str | None = None,
    ) -> None:
        self._handler = handler
        self._owns_ledger = isinstance(ledger, str | os.PathLike)
        self.ledger = _open_ledger(ledger)
        self._lock = threading.Lock()
        self._messages = self._rows = self._duplicates = 0
        self._producers: set[str] = set()
        try:
            self._consumer = FanInConsumer(
                self._on_delivery,
                settings or SINK_WORKER_SETTINGS,
                self_ref_factory=node.expose(name or f"spark-sink-{service_key}"),
                service_key=service_key,
                registry=CoordinatorServiceRegistry(client, node.ref, namespace=namespace),
            )
        except BaseException:
            self._close_ledger()
            raise

    def _on_delivery(self, delivery: Delivery) -> None:
        rows = SinkRows.decode(delivery.message)
        handed = len(rows.rows)
        if self.ledger is None:
            self._handler(rows, None)
        else:
            handler = self._handler

            def effect(conn: Any, new: list[tuple[str, int]]) -> None:
                if new:
                    fresh = {row for _, row in new}
                    kept = [r for i, r in enumerate(rows.rows) if rows.first_row + i in fresh]
                    handler(SinkRows(rows.producer_id, rows.first_row, kept), conn)

            handed = len(self.ledger.apply_many(rows.keys, effect))
        with self._lock:
            self._messages += 1
            self._rows += handed
            self._duplicates += len(rows.rows) - handed
            self._producers.add(rows.producer_id)

    def statistics(self) -> SinkWorkerStats:
        with self._lock:
            return SinkWorkerStats(
                self._messages, self._rows, self._duplicates, len(self._producers)
            )

    def close(self) -> None:
        """Leave the directory, let the handlers in progress finish, close (and close the
        ledger if this worker opened it)."""
        self._consumer.close()
        self._close_ledger()

    def _close_ledger(self) -> None:
        if self._owns_ledger and self.ledger is not None:
            self.ledger.close()

    def __enter__(self) -> SinkWorker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _open_ledger(given: RowLedger | str | os.PathLike[str] | None) -> RowLedger | None:
    """The ledger ``given`` stands for (backends.py): a URL or a path opens one."""
    if given is None:
        return None
    backend = backend_of(given)
    if backend == "postgres":
        from pykka_delivery.spark.ledger_postgres import (  # noqa: PLC0415
            PostgresRowLedger,  # the [postgres] extra, for a URL only
        )

        return PostgresRowLedger(given)
    if backend == "sqlite":
        assert isinstance(given, str | os.PathLike)
        return SqliteRowLedger(given)
    if not isinstance(given, RowLedger):
        msg = (
            f"ledger must be a SqliteRowLedger or a PostgresRowLedger, the path of an SQLite "
            f"file, a postgresql:// URL, or None; got {type(given).__name__}"
        )
        raise TypeError(msg)
    return given
