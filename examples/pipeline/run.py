"""The pipeline demo: click events through Spark and on to consumer services, exactly once.

What runs (everything on 127.0.0.1, state in SQLite files in a temporary directory):

1. **Spark** (``local[2]``) in this process, with the **coordinator** hosted in its driver.
2. Two **producer services** (processes, click_producer.py), ``web`` and ``mobile``,
   emit click events keyed by user over gRPC, both on one stream ``clicks`` of 4
   partitions: each is a named producer registered in the coordinator's stream catalog.
3. A **Structured Streaming query** reads stream ``clicks`` through the
   ``pykka-delivery`` source, given only the coordinator and the stream's name: it finds
   both producers in the catalog (per partition one consumer, registered in the
   coordinator, with a session to each producer; every message logged durably under the
   checkpoint, then confirmed) and, per micro-batch, counts the clicks per user per
   minute into Parquet. Midway the query is stopped and started again from its
   checkpoint: it goes on where it stopped.
4. The per-minute totals are summed into one table, which the ``pykka-delivery`` **sink**
   delivers to a work-pulling group of three **consumer services** (processes,
   totals_consumer.py) sharing a row ledger. Once a third of the rows are in, one
   consumer is killed (SIGKILL) and a new one joins: the rows it held go to the others,
   and none is stored twice.

While it runs, progress bars show each stage, with the lag the coordinator reports
(`CoordinatorClient.lag()`, what ``pykka-delivery lag`` prints: the producers and the
query's consumers report their positions about once a second).

At the end the demo checks, against what the producers report they sent (computed
independently of Spark), that no click was lost or counted twice in Spark (in all, and
per producer: the rows' ``producer_id`` names it, ``clicks-3:spark@web``), and that the
consumers stored every total once with the right count. It prints a report (per stage:
throughput, fail-overs, the largest lag seen); its last line is one JSON object with
``sent``, ``received``, ``lost``, ``duplicates``, ``failovers`` and ``lag``. Exit status 1
if anything was lost or doubled.

Usage: python examples/pipeline/run.py [--clicks N] [--consumers K] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from display import StageProgress, console, report, stage_title
from lag_watch import LagWatch
from services import WAIT, Service, stop_services

STREAM = "clicks"
PRODUCERS = ("web", "mobile")  # the click producer services, by name in the catalog
SERVICE_KEY = "minute-totals"  # the sink's work-pulling service (totals_consumer.py)
PARTITIONS = 4


def spark_session() -> Any:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession  # noqa: PLC0415 (after the environment is set)

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("pykka-delivery pipeline demo")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def start_query(
    spark: Any, options: dict[str, str], out: Path, checkpoint: Path, seen: list[int]
) -> Any:
    """The streaming query: per micro-batch, the clicks per user per minute to Parquet
    (``out/agg/batch=<id>``) and the ids of the messages counted (``out/ids/batch=<id>``),
    each overwritten if Spark runs the batch again: idempotent per batch id."""
    from pyspark.sql import functions as f  # noqa: PLC0415

    def write_batch(frame: Any, batch_id: int) -> None:
        frame.persist()
        frame.select("producer_id", "seq_nr").write.mode("overwrite").parquet(
            str(out / "ids" / f"batch={batch_id}")
        )
        counts = frame.groupBy("user", "minute").agg(f.count("*").alias("clicks"))
        counts.write.mode("overwrite").parquet(str(out / "agg" / f"batch={batch_id}"))
        seen[0] += frame.count()
        frame.unpersist()

    clicks = spark.readStream.format("pykka-delivery").options(**options).load()
    clicks = (
        clicks.select(
            "producer_id",
            "seq_nr",
            f.from_json(f.col("payload").cast("string"), "user string, page string, ts long").alias(
                "c"
            ),
        )
        .select(
            "producer_id",
            "seq_nr",
            "c.user",
            (f.col("c.ts").cast("long") / 60_000).cast("long").alias("m"),
        )
        .withColumn("minute", f.col("m") * 60)
        .drop("m")
    )
    return (
        clicks.writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def wait_for(condition: Any, what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.1)


def ledger_counts(path: Path) -> tuple[int, int]:
    """(rows stored, distinct rows stored) in the consumers' table."""
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:
            stored, distinct = db.execute(
                "SELECT count(*), count(DISTINCT producer || '/' || row) FROM totals"
            ).fetchone()
    except sqlite3.OperationalError:  # not created yet
        return 0, 0
    return int(stored), int(distinct)


class Pipeline:
    """One run of the demo: its services, its progress bars, what it observed."""

    def __init__(
        self, args: argparse.Namespace, work: Path, spark: Any, coordinator: Any, lag: LagWatch
    ) -> None:
        self.args = args
        self.work = work
        self.spark = spark
        self.coordinator = coordinator
        self.lag = lag
        self.services: list[Service] = []
        self.figures: dict[str, Any] = {"stage1_failovers": [], "stage2_failovers": []}

    def service(self, name: str, script: str, *args: str) -> Service:
        found = Service(name, script, *args)
        self.services.append(found)
        return found

    def consumer(self, number: int, ledger: Path) -> Service:
        return self.service(
            f"consumer-{number}",
            "totals_consumer.py",
            "--coordinator",
            self.coordinator.address,
            "--ledger",
            str(ledger),
            "--name",
            f"consumer-{number}",
            "--work-ms",
            str(self.args.work_ms),
        )

    def stage_one(self) -> dict[str, int]:
        """Producer services -> the streaming query; the query is stopped and started
        again midway. Returns the clicks per ``user|minute`` Spark counted."""
        args, work, spark = self.args, self.work, self.spark
        producers = [
            self.service(
                name,
                "click_producer.py",
                "--name",
                name,
                "--stream",
                STREAM,
                "--partitions",
                str(PARTITIONS),
                "--count",
                str(args.clicks),
                "--seed",
                str(i + 1),
                "--rate",
                str(args.rate),
                "--expected",
                str(work / f"expected-{name}.json"),
                "--coordinator",
                self.coordinator.address,
            )
            for i, name in enumerate(PRODUCERS)
        ]
        for producer in producers:
            producer.wait_ready()
        total = args.clicks * len(producers)
        checkpoint = work / "query-checkpoint"
        options = self.coordinator.options(
            streams=STREAM,  # its producers are found in the coordinator's catalog
            log_dir=checkpoint / "pykka-delivery",
            window=200,
            max_rows_per_batch=4000,
        )
        stage_title(
            f"Stage 1: 2 producer services send {total:,} clicks on stream {STREAM!r}; a "
            f"streaming query finds them through the coordinator and counts the clicks per "
            f"user per minute"
        )
        self.lag.watch("stage 1", (STREAM,))
        failovers = self.figures["stage1_failovers"]
        seen = [0]
        with StageProgress() as bars:

            def progress() -> bool:
                bars.set("clicks sent", sum(p.count for p in producers), total)
                bars.set("counted by Spark", seen[0], total, note=self.lag.note())
                return False

            began = time.monotonic()
            query = start_query(spark, options, work / "out", checkpoint, seen)
            wait_for(lambda: progress() or seen[0] >= total * 0.4, "40% of the clicks in Spark")
            query.stop()
            bars.print(
                f"  query stopped with {seen[0]:,} clicks counted; starting it again from its "
                f"checkpoint"
            )
            failovers.append(
                f"streaming query stopped at {seen[0]:,} clicks and restarted from its checkpoint"
            )
            query = start_query(spark, options, work / "out", checkpoint, seen)
            wait_for(
                lambda: progress() or all(p.done.is_set() for p in producers),
                "the producers' last confirmations",
            )
            query.processAllAvailable()
            progress()
            query.stop()
            seconds = time.monotonic() - began
        console.print(f"  stage 1 done in {seconds:.1f} s")

        # Checked against what the producers sent (computed without Spark).
        from pyspark.sql import functions as f  # noqa: PLC0415

        ids = spark.read.parquet(str(work / "out" / "ids"))
        counted = ids.count()
        distinct = ids.select("producer_id", "seq_nr").distinct().count()
        # Distinct clicks per producer, named at the end of each row's producer id.
        by_producer = {
            r.producer: r.clicks
            for r in ids.select("producer_id", "seq_nr")
            .distinct()
            .groupBy(f.substring_index("producer_id", "@", -1).alias("producer"))
            .agg(f.count("*").alias("clicks"))
            .collect()
        }
        expected: Counter[str] = Counter()
        for name in PRODUCERS:
            expected.update(json.loads((work / f"expected-{name}.json").read_text()))
        totals = (
            spark.read.parquet(str(work / "out" / "agg"))
            .groupBy("user", "minute")
            .agg(f.sum("clicks").cast("long").alias("clicks"))
        )
        totals.write.mode("overwrite").parquet(str(work / "minute_totals"))
        spark_totals = {
            f"{r.user}|{r.minute}": r.clicks
            for r in spark.read.parquet(str(work / "minute_totals")).collect()
        }
        self.figures.update(
            clicks_sent=total,
            clicks_counted=counted,
            clicks_lost=total - distinct,
            clicks_duplicates=counted - distinct,
            clicks_by_producer=by_producer,
            producers_match=by_producer == dict.fromkeys(PRODUCERS, args.clicks),
            totals_match_producers=spark_totals == dict(expected),
            stage1_seconds=round(seconds, 2),
            stage1_msgs_per_s=round(total / seconds),
        )
        return spark_totals

    def stage_two(self, spark_totals: dict[str, int]) -> None:
        """The table of totals -> the sink -> a work-pulling group of consumer services,
        one of which is killed once a third of the rows are stored, and replaced."""
        ledger = self.work / "consumers.sqlite"
        consumers = [self.consumer(i, ledger) for i in range(self.args.consumers)]
        for consumer in consumers:
            consumer.wait_ready()
        rows = len(spark_totals)
        stage_title(
            f"Stage 2: the sink delivers {rows:,} per-minute totals to {len(consumers)} "
            f"consumer services; one is killed midway and replaced"
        )
        self.lag.watch("stage 2", (SERVICE_KEY,))
        killed: list[str] = []
        finished = threading.Event()
        with StageProgress() as bars:

            def chaos() -> None:
                while not finished.is_set():
                    stored, _ = ledger_counts(ledger)
                    bars.set("totals stored", stored, rows, note=self.lag.note())
                    if not killed and stored >= rows / 3:
                        consumers[0].kill()
                        killed.append(consumers[0].name)
                        bars.print(
                            f"  {killed[0]} killed (SIGKILL); consumer-{len(consumers)} joins"
                        )
                        consumers.append(self.consumer(len(consumers), ledger))
                    time.sleep(0.05)

            watcher = threading.Thread(target=chaos, daemon=True)
            began = time.monotonic()
            watcher.start()
            try:
                table = self.spark.read.parquet(str(self.work / "minute_totals")).repartition(4)
                table.write.format("pykka-delivery").options(
                    **self.coordinator.options(service_key=SERVICE_KEY, timeout=120)
                ).mode("append").save()
            finally:
                finished.set()
                watcher.join(10)
            seconds = time.monotonic() - began
            stored, distinct = ledger_counts(ledger)
            bars.set("totals stored", stored, rows)
        console.print(f"  stage 2 done in {seconds:.1f} s")
        if killed:
            self.figures["stage2_failovers"].append(
                f"{killed[0]} killed (SIGKILL) mid-delivery and replaced"
            )
        with contextlib.closing(sqlite3.connect(ledger, timeout=30)) as db:
            delivered = {
                f"{u}|{m}": c for u, m, c in db.execute("SELECT user, minute, clicks FROM totals")
            }
            by_consumer = dict(
                db.execute("SELECT consumer, count(*) FROM totals GROUP BY consumer")
            )
        self.figures.update(
            totals_sent=rows,
            totals_stored=stored,
            totals_lost=rows - distinct,
            totals_duplicates=stored - distinct,
            totals_match_spark=delivered == spark_totals,
            stored_by_consumer=by_consumer,
            stage2_seconds=round(seconds, 2),
            stage2_rows_per_s=round(rows / seconds),
            clicks_delivered=sum(delivered.values()),
        )


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from pykka_delivery.coordinator import CoordinatorSettings  # noqa: PLC0415
    from pykka_delivery.spark import coordinator_in_driver  # noqa: PLC0415

    started = time.monotonic()
    console.print("Starting Spark (local[2]) and the coordinator in its driver ...")
    spark = spark_session()
    pipeline: Pipeline | None = None
    try:
        with coordinator_in_driver(
            spark,
            log_path=work / "coordinator.sqlite",
            settings=CoordinatorSettings(disconnected_timeout=2.0),
        ) as coordinator:
            lag = LagWatch(coordinator.address)
            pipeline = Pipeline(args, work, spark, coordinator, lag)
            try:
                pipeline.stage_two(pipeline.stage_one())
            finally:
                # While the coordinator is up: the services and the lag client say goodbye.
                stop_services(pipeline.services)
                lag.close()
    finally:
        if pipeline is not None:
            stop_services(pipeline.services)
        spark.stop()
    figures = pipeline.figures
    figures.update(
        sent=figures["clicks_sent"],
        received=figures["clicks_delivered"],
        lost=figures["clicks_lost"]
        + figures["totals_lost"]
        + max(0, figures["clicks_sent"] - figures["clicks_delivered"]),
        duplicates=figures["clicks_duplicates"] + figures["totals_duplicates"],
        failovers=len(figures["stage1_failovers"]) + len(figures["stage2_failovers"]),
        lag={
            stage: {"in_flight": seen.in_flight, "oldest_unconfirmed_s": round(seen.oldest_age, 1)}
            for stage, seen in lag.stages.items()
            if seen.samples
        },
        lag_stages=lag.stages,
        lag_problem=lag.problem,
        lag_command=f"pykka-delivery lag --address {coordinator.address}",
        seconds=round(time.monotonic() - started, 1),
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clicks", type=int, default=20_000, help="clicks per producer service")
    parser.add_argument("--rate", type=float, default=2000.0, help="clicks/s per producer")
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=0.5, help="consumer work per row")
    parser.add_argument("--keep", type=Path, default=None, help="keep the files in this directory")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Stopping the query midway (the fail-over shown) interrupts the micro-batch it runs;
    # py4j logs that interrupted callback with its traceback at ERROR. A failure that
    # matters still ends the query, and the demo with it.
    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    work = args.keep or Path(tempfile.mkdtemp(prefix="pykka-delivery-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        figures = run(args, work)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    report(figures)
    ok = (
        figures["lost"] == 0
        and figures["duplicates"] == 0
        and figures["totals_match_producers"]
        and figures["producers_match"]
        and figures["totals_match_spark"]
        and figures["received"] == figures["sent"]
    )
    keys = ("sent", "received", "lost", "duplicates", "failovers", "lag", "seconds")
    summary = {k: figures[k] for k in keys}
    summary.update(
        stage1_msgs_per_s=figures["stage1_msgs_per_s"],
        stage2_rows_per_s=figures["stage2_rows_per_s"],
        ok=ok,
    )
    print(json.dumps(summary), flush=True)  # plain: one line a program can parse
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
