"""The Spark sink's workers on a PostgreSQL row ledger, as on two hosts: each worker opens
its own `PostgresRowLedger` from the URL (its own connections), and a retried task's rows,
received by the other worker, are recognised and not applied again.

No Spark job: the test delivers a task's rows with the sink's own `deliver_rows` (what a
Spark task runs), twice under the same producer id, as a retried task does. The Spark end
to end tests (test_sink.py) use the SQLite ledger the same way.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)
from pykka_delivery.spark import SinkRows, SinkWorker
from pykka_delivery.spark.ledger_postgres import PostgresRowLedger
from pykka_delivery.transport import Node

pytest.importorskip("pyspark", reason="the [spark] extra is not installed")

from pykka_delivery.spark import _process
from pykka_delivery.spark.sink import SinkSettings, deliver_rows  # needs pyspark

ROWS = 300
TASK = "write-1-task-0"


class Batch:
    """What `deliver_rows` reads of a Spark task's Arrow record batch."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def to_pylist(self) -> list[dict[str, Any]]:
        return self.records


class Host:
    """A consumer service on a host of its own: a node, a coordinator client and a sink
    worker opening its own PostgreSQL ledger from the URL."""

    def __init__(self, name: str, coordinator: str, url: str) -> None:
        self.name = name
        self.node = Node().start()
        self.client = CoordinatorClient(coordinator, node=self.node.address)
        self.worker = SinkWorker(
            self.client, self.node, "rows", self.handle, ledger=url, name=f"sink-{name}"
        )

    def handle(self, rows: SinkRows, db: Any) -> None:
        db.cursor().executemany(
            "INSERT INTO got VALUES (%s, %s, %s, %s)",
            [
                (r["id"], rows.producer_id, rows.first_row + i, self.name)
                for i, r in enumerate(rows.rows)
            ],
        )

    def close(self) -> None:
        self.worker.close()
        self.client.close()
        self.node.stop()


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    actor = CoordinatorActor.start(settings=CoordinatorSettings(disconnected_timeout=5.0))
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    yield server
    _process._close_all()  # the task side's node and client, cached per process
    server.stop()
    actor.stop()


@pytest.fixture
def url(postgres_url: str) -> str:
    with psycopg.connect(postgres_url) as conn:
        conn.execute("CREATE TABLE got (id BIGINT, producer TEXT, row BIGINT, worker TEXT)")
    return postgres_url


def run_task(server: CoordinatorServer) -> None:
    settings = SinkSettings(
        coordinator=server.address,
        service_key="rows",
        namespace="",
        format="json",
        rows_per_message=10,
        send_batch=50,
        timeout=30.0,
        token=None,
        host="127.0.0.1",
    )
    deliver_rows(settings, TASK, 0, iter([Batch([{"id": i} for i in range(ROWS)])]))


def got(url: str) -> list[tuple[int, str]]:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT id, worker FROM got ORDER BY id").fetchall()


def test_a_retried_task_received_on_another_host_applies_each_row_once(
    server: CoordinatorServer, url: str
) -> None:
    first = Host("a", server.address, url)
    try:
        run_task(server)
    finally:
        first.close()
    second = Host("b", server.address, url)
    try:
        run_task(server)  # the task again, same producer id and rows: a retry
        stats = second.worker.statistics()
    finally:
        second.close()

    assert got(url) == [(i, "a") for i in range(ROWS)]
    assert (stats.rows, stats.duplicate_rows) == (0, ROWS)
    ledger = PostgresRowLedger(url)
    assert ledger.count() == ROWS
    ledger.close()
