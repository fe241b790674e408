"""The Spark sink: DataFrames delivered to consumer services exactly once in effect."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.coordinator import CoordinatorClient, CoordinatorSettings
from pykka_delivery.spark import SinkRows, SinkWorker, coordinator_in_driver
from pykka_delivery.transport import Node
from tests.transport.procs import Proc

pytestmark = pytest.mark.spark

ROWS = 100_000


@pytest.fixture
def coordinator(spark: Any) -> Iterator[Any]:
    with coordinator_in_driver(
        spark, settings=CoordinatorSettings(disconnected_timeout=2.0)
    ) as hosted:
        yield hosted


class Workers:
    """Consumer services in this process: ``count`` sink workers with one shared ledger,
    whose handler stores every row it is given in the ledger's database."""

    def __init__(self, coordinator: Any, key: str, path: Path, count: int = 2) -> None:
        self.path = path
        self.node = Node().start()
        self.client = CoordinatorClient(coordinator.address, node=self.node.address)
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE IF NOT EXISTS got (id INTEGER, producer TEXT, row INTEGER)")
        self.workers = [
            SinkWorker(self.client, self.node, key, self.handle, ledger=path, name=f"{key}-{i}")
            for i in range(count)
        ]

    @staticmethod
    def handle(rows: SinkRows, db: sqlite3.Connection | None) -> None:
        assert db is not None
        db.executemany(
            "INSERT INTO got VALUES (?, ?, ?)",
            [(r["id"], rows.producer_id, rows.first_row + i) for i, r in enumerate(rows.rows)],
        )

    def ids(self) -> list[int]:
        with sqlite3.connect(self.path) as db:
            return [i for (i,) in db.execute("SELECT id FROM got ORDER BY id")]

    def close(self) -> None:
        for worker in self.workers:
            worker.close()
        self.client.close()
        self.node.stop()


@pytest.fixture
def workers(coordinator: Any, tmp_path: Path) -> Iterator[Workers]:
    found = Workers(coordinator, "rows", tmp_path / "ledger.sqlite")
    yield found
    found.close()


def test_a_dataframe_is_delivered_exactly_once_in_effect(
    spark: Any, coordinator: Any, workers: Workers
) -> None:
    df = spark.range(ROWS).selectExpr("id", "concat('user-', id % 97) AS user")
    df.write.format("pykka-delivery").options(
        **coordinator.options(service_key="rows", timeout=120)
    ).mode("append").save()

    assert workers.ids() == list(range(ROWS))
    stats = [w.statistics() for w in workers.workers]
    assert sum(s.rows for s in stats) == ROWS
    assert sum(s.duplicate_rows for s in stats) == 0
    assert all(s.rows > 0 for s in stats), "both workers pulled work"


def test_a_task_that_fails_once_is_retried_and_its_rows_are_not_applied_twice(
    spark: Any, coordinator: Any, workers: Workers
) -> None:
    def fail_once(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext  # noqa: PLC0415 (runs in a Spark worker)

        context = TaskContext.get()
        for batch in batches:
            if (
                context.partitionId() == 1
                and context.attemptNumber() == 0
                and (batch["id"] >= ROWS * 3 // 4).any()
            ):
                raise RuntimeError("made to fail once")
            yield batch

    df = spark.range(0, ROWS, 1, 2).mapInPandas(fail_once, "id long")
    df.write.format("pykka-delivery").options(
        **coordinator.options(service_key="rows", timeout=120, rows_per_message=10)
    ).mode("append").save()

    assert workers.ids() == list(range(ROWS))
    duplicates = sum(w.statistics().duplicate_rows for w in workers.workers)
    assert duplicates > 0, "the failed attempt delivered rows that the retry sent again"


def test_arrow_batches_are_delivered_exactly_once(
    spark: Any, coordinator: Any, workers: Workers
) -> None:
    df = spark.range(ROWS // 10)
    df.write.format("pykka-delivery").options(
        **coordinator.options(service_key="rows", format="arrow", rows_per_message=500)
    ).mode("append").save()

    assert workers.ids() == list(range(ROWS // 10))


def test_a_streaming_query_delivers_each_micro_batch(
    spark: Any, coordinator: Any, workers: Workers, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for part in range(3):
        lines = "\n".join(f'{{"id": {i}}}' for i in range(part * 1000, (part + 1) * 1000))
        (source / f"part-{part}.json").write_text(lines + "\n")
    query = (
        spark.readStream.schema("id long")
        .option("maxFilesPerTrigger", 1)
        .json(str(source))
        .writeStream.format("pykka-delivery")
        .options(**coordinator.options(service_key="rows", timeout=60))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert workers.ids() == list(range(3000))
    producers = {
        producer
        for (producer,) in sqlite3.connect(workers.path).execute(
            "SELECT DISTINCT producer FROM got"
        )
    }
    assert {p.split("-")[-2] for p in producers} == {"0", "1", "2"}, "one batch id per file"


def test_no_worker_fails_the_write_with_a_clear_error(spark: Any, coordinator: Any) -> None:
    df = spark.range(10)
    with pytest.raises(Exception, match="no worker with demand"):
        df.write.format("pykka-delivery").options(
            **coordinator.options(service_key="nobody", timeout=1)
        ).mode("append").save()


def test_a_missing_option_names_it(spark: Any, coordinator: Any) -> None:
    with pytest.raises(Exception, match='option "service_key" is required'):
        spark.range(1).write.format("pykka-delivery").options(**coordinator.options()).mode(
            "append"
        ).save()


def test_a_worker_killed_mid_write_loses_nothing_and_nothing_is_applied_twice(
    spark: Any, coordinator: Any, tmp_path: Path
) -> None:
    """Two worker processes; once a third of the rows are stored, one is SIGKILLed and a
    new one joins. The rows the killed worker held unconfirmed go to the others; those it
    had stored are recognised by the ledger."""
    rows = 30_000
    ledger = tmp_path / "ledger.sqlite"
    with sqlite3.connect(ledger) as db:
        db.execute("CREATE TABLE got (id INTEGER, producer TEXT, row INTEGER, worker TEXT)")

    def worker(name: str) -> Proc:
        return Proc(
            name,
            [
                str(Path(__file__).with_name("sink_worker_proc.py")),
                "--coordinator", coordinator.address,
                "--ledger", str(ledger),
                "--key", "killed",
                "--name", name,
                "--sleep-ms", "2",
            ],
        )  # fmt: skip

    def stored() -> int:
        with contextlib.closing(sqlite3.connect(ledger, timeout=30)) as db:
            return int(db.execute("SELECT count(*) FROM got").fetchone()[0])

    procs = [worker("w0"), worker("w1")]
    killed_at: list[int] = []
    done = threading.Event()

    def kill_one() -> None:
        while not done.wait(0.05):
            count = stored()
            if count >= rows // 3:
                procs[0].kill()
                killed_at.append(count)
                procs.append(worker("w2"))
                return

    try:
        for proc in procs:
            proc.ready(60)
        killer = threading.Thread(target=kill_one, daemon=True)
        killer.start()
        spark.range(rows).write.format("pykka-delivery").options(
            **coordinator.options(service_key="killed", timeout=120, rows_per_message=10)
        ).mode("append").save()
        done.set()
        killer.join(10)
        with contextlib.closing(sqlite3.connect(ledger)) as db:
            ids = [i for (i,) in db.execute("SELECT id FROM got ORDER BY id")]
            by_worker = dict(db.execute("SELECT worker, count(*) FROM got GROUP BY worker"))
    finally:
        done.set()
        for proc in procs:
            proc.kill()
    assert killed_at and killed_at[0] < rows, "a worker was killed mid-write"
    assert ids == list(range(rows)), "every row stored once"
    assert by_worker.get("w0", 0) > 0


def test_a_failed_write_saved_again_with_its_write_id_delivers_the_rest_once(
    spark: Any, coordinator: Any, workers: Workers
) -> None:
    """Partition 1 fails on every attempt, after some of its rows went out: the write
    fails (partition 0 delivered all its rows). Saved again with the same ``write_id``,
    the tasks have the same producer ids and row numbers, so the ledger takes only the
    rows it lacks."""

    def always_fail_late(batches: Iterator[Any]) -> Iterator[Any]:
        from pyspark import TaskContext  # noqa: PLC0415 (runs in a Spark worker)

        partition = TaskContext.get().partitionId()
        for batch in batches:
            if partition == 1 and (batch["id"] >= ROWS * 3 // 4).any():
                raise RuntimeError("made to fail")
            yield batch

    def save(frame: Any) -> None:
        frame.write.format("pykka-delivery").options(
            **coordinator.options(
                service_key="rows", timeout=120, rows_per_message=10, write_id="resumed"
            )
        ).mode("append").save()

    with pytest.raises(Exception, match="made to fail"):
        save(spark.range(0, ROWS, 1, 2).mapInPandas(always_fail_late, "id long"))
    partial = workers.ids()
    assert set(range(ROWS // 2)) <= set(partial), "partition 0 was delivered"
    assert ROWS // 2 < len(partial) < ROWS, "partition 1 went out in part"

    save(spark.range(0, ROWS, 1, 2))
    assert workers.ids() == list(range(ROWS))
    assert sum(w.statistics().duplicate_rows for w in workers.workers) >= len(partial)
