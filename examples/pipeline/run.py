"""The pipeline demo: click events through Spark and on to consumer services, exactly once.

What runs (everything on 127.0.0.1, state in SQLite files in a temporary directory):

1. **Spark** (``local[2]``) in this process, with the **coordinator** hosted in its driver.
2. Two **producer services** (processes, click_producer.py) emit click events keyed by
   user over gRPC, on streams ``clicks-web`` and ``clicks-mobile`` of 4 partitions each.
3. A **Structured Streaming query** reads both streams through the ``pykka-delivery``
   source (one consumer per partition, registered in the coordinator; every message
   logged durably under the checkpoint, then confirmed) and, per micro-batch, counts the
   clicks per user per minute into Parquet. Midway the query is stopped and started
   again from its checkpoint: it goes on where it stopped.
4. The per-minute totals are summed into one table, which the ``pykka-delivery`` **sink**
   delivers to a work-pulling group of three **consumer services** (processes,
   totals_consumer.py) sharing a row ledger. Once a third of the rows are in, one
   consumer is killed (SIGKILL) and a new one joins: the rows it held go to the others,
   and none is stored twice.

At the end the demo checks, against what the producers report they sent (computed
independently of Spark), that no click was lost or counted twice in Spark, and that the
consumers stored every total once with the right count. It prints a report; its last line
is one JSON object with ``sent``, ``received``, ``lost``, ``duplicates`` and
``failovers``. Exit status 1 if anything was lost or doubled.

Usage: python examples/pipeline/run.py [--clicks N] [--consumers K] [--keep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
STREAMS = ("clicks-web", "clicks-mobile")
PARTITIONS = 4
WAIT = 120.0  # bound on every wait for a service


class Service:
    """A child process whose stdout lines report its state (READY, SENT n, APPLIED n, DONE)."""

    def __init__(self, name: str, script: str, *args: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / script), *args],
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.address = ""
        self.count = 0
        self.ready = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "READY":
                self.address = rest
                self.ready.set()
            elif word in ("SENT", "APPLIED"):
                self.count = int(rest)
            elif word == "DONE":
                self.done.set()

    def wait_ready(self) -> None:
        if not self.ready.wait(WAIT):
            raise RuntimeError(f"{self.name} did not start within {WAIT} s")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)


class Progress:
    """Progress bars of the running stage, redrawn in place on a terminal, else a line
    every few seconds."""

    def __init__(self) -> None:
        self.bars: dict[str, tuple[int, int]] = {}
        self._tty = sys.stdout.isatty()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def set(self, name: str, done: int, total: int) -> None:
        with self._lock:
            self.bars[name] = (done, total)

    def _line(self) -> str:
        with self._lock:
            bars = dict(self.bars)
        parts = []
        for name, (done, total) in bars.items():
            filled = int(20 * min(done, total) / total) if total else 0
            parts.append(f"{name} [{'#' * filled}{'.' * (20 - filled)}] {done:,}/{total:,}")
        return "  ".join(parts)

    def _run(self) -> None:
        while not self._stop.wait(0.25 if self._tty else 3.0):
            line = self._line()
            if line:
                print(
                    f"\r{line}\033[K" if self._tty else f"  {line}",
                    end="" if self._tty else "\n",
                    flush=True,
                )

    def finish(self, message: str) -> None:
        """Draw the bars once more and clear them."""
        line = self._line()
        with self._lock:
            self.bars.clear()
        print(f"\r{line}\033[K" if self._tty else f"  {line}", flush=True)
        print(message, flush=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


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

    clicks = (
        spark.readStream.format("pykka-delivery")
        .options(**options)
        .load()
        .select(
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


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from pykka_delivery.coordinator import CoordinatorSettings  # noqa: PLC0415
    from pykka_delivery.spark import coordinator_in_driver  # noqa: PLC0415

    figures: dict[str, Any] = {}
    failovers: list[str] = []
    started = time.monotonic()
    print("Starting Spark (local[2]) and the coordinator in its driver ...", flush=True)
    spark = spark_session()
    services: list[Service] = []
    progress = Progress()
    try:
        with coordinator_in_driver(
            spark,
            log_path=work / "coordinator.sqlite",
            settings=CoordinatorSettings(disconnected_timeout=2.0),
        ) as coordinator:
            # --- stage 1: producer services -> streaming query -------------------------
            producers = [
                Service(
                    stream,
                    "click_producer.py",
                    "--stream",
                    stream,
                    "--partitions",
                    str(PARTITIONS),
                    "--count",
                    str(args.clicks),
                    "--seed",
                    str(i + 1),
                    "--rate",
                    str(args.rate),
                    "--expected",
                    str(work / f"expected-{stream}.json"),
                )
                for i, stream in enumerate(STREAMS)
            ]
            services += producers
            for producer in producers:
                producer.wait_ready()
            total = args.clicks * len(producers)
            checkpoint = work / "query-checkpoint"
            options = coordinator.options(
                streams=",".join(f"{p.name}={p.address}" for p in producers),
                partitions=PARTITIONS,
                log_dir=checkpoint / "pykka-delivery",
                window=200,
                max_rows_per_batch=4000,
            )
            print(
                f"Stage 1: 2 producer services send {total:,} clicks; a streaming query "
                f"counts them per user per minute",
                flush=True,
            )
            seen = [0]
            stage1 = time.monotonic()
            query = start_query(spark, options, work / "out", checkpoint, seen)

            def stage1_progress() -> bool:
                progress.set("clicks sent", sum(p.count for p in producers), total)
                progress.set("counted by Spark", seen[0], total)
                return False

            wait_for(
                lambda: stage1_progress() or seen[0] >= total * 0.4, "40% of the clicks in Spark"
            )
            query.stop()
            progress.finish(
                f"  query stopped with {seen[0]:,} clicks counted; starting it again from its "
                f"checkpoint"
            )
            failovers.append(
                f"streaming query stopped at {seen[0]:,} clicks and restarted from its checkpoint"
            )
            query = start_query(spark, options, work / "out", checkpoint, seen)
            wait_for(
                lambda: stage1_progress() or all(p.done.is_set() for p in producers),
                "the producers' last confirmations",
            )
            query.processAllAvailable()
            stage1_progress()
            query.stop()
            stage1_seconds = time.monotonic() - stage1
            progress.finish(f"  stage 1 done in {stage1_seconds:.1f} s")

            # --- the checks of stage 1, and the table of totals ------------------------
            from pyspark.sql import functions as f  # noqa: PLC0415

            ids = spark.read.parquet(str(work / "out" / "ids"))
            counted = ids.count()
            distinct = ids.select("producer_id", "seq_nr").distinct().count()
            expected: Counter[str] = Counter()
            for stream in STREAMS:
                expected.update(json.loads((work / f"expected-{stream}.json").read_text()))
            totals = (
                spark.read.parquet(str(work / "out" / "agg"))
                .groupBy("user", "minute")
                .agg(f.sum("clicks").cast("long").alias("clicks"))
            )
            totals.write.mode("overwrite").parquet(str(work / "minute_totals"))
            table = spark.read.parquet(str(work / "minute_totals")).repartition(4).cache()
            spark_totals = {f"{r.user}|{r.minute}": r.clicks for r in table.collect()}
            rows = len(spark_totals)
            figures.update(
                clicks_sent=total,
                clicks_counted=counted,
                clicks_lost=total - distinct,
                clicks_duplicates=counted - distinct,
                totals_match_producers=spark_totals == dict(expected),
                stage1_seconds=round(stage1_seconds, 2),
                stage1_msgs_per_s=round(total / stage1_seconds),
            )

            # --- stage 2: the totals -> consumer services (work pulling) ---------------
            ledger = work / "consumers.sqlite"
            consumers = [
                Service(
                    f"consumer-{i}",
                    "totals_consumer.py",
                    "--coordinator",
                    coordinator.address,
                    "--ledger",
                    str(ledger),
                    "--name",
                    f"consumer-{i}",
                    "--work-ms",
                    str(args.work_ms),
                )
                for i in range(args.consumers)
            ]
            services += consumers
            for consumer in consumers:
                consumer.wait_ready()
            print(
                f"Stage 2: the sink delivers {rows:,} per-minute totals to {len(consumers)} "
                f"consumer services; one is killed midway and replaced",
                flush=True,
            )
            killed: list[str] = []

            def chaos() -> None:
                while not finished.is_set():
                    stored, _ = ledger_counts(ledger)
                    progress.set("totals stored", stored, rows)
                    if not killed and stored >= rows / 3:
                        victim = consumers[0]
                        victim.kill()
                        killed.append(victim.name)
                        replacement = Service(
                            f"consumer-{len(consumers)}",
                            "totals_consumer.py",
                            "--coordinator",
                            coordinator.address,
                            "--ledger",
                            str(ledger),
                            "--name",
                            f"consumer-{len(consumers)}",
                            "--work-ms",
                            str(args.work_ms),
                        )
                        services.append(replacement)
                        consumers.append(replacement)
                    time.sleep(0.05)

            finished = threading.Event()
            watcher = threading.Thread(target=chaos, daemon=True)
            stage2 = time.monotonic()
            watcher.start()
            try:
                table.write.format("pykka-delivery").options(
                    **coordinator.options(service_key="minute-totals", timeout=120)
                ).mode("append").save()
            finally:
                finished.set()
                watcher.join(10)
            stage2_seconds = time.monotonic() - stage2
            stored, distinct_rows = ledger_counts(ledger)
            progress.set("totals stored", stored, rows)
            progress.finish(f"  stage 2 done in {stage2_seconds:.1f} s")
            if killed:
                failovers.append(f"{killed[0]} killed (SIGKILL) mid-delivery and replaced")
            with contextlib.closing(sqlite3.connect(ledger, timeout=30)) as db:
                delivered = {
                    f"{u}|{m}": c
                    for u, m, c in db.execute("SELECT user, minute, clicks FROM totals")
                }
                by_consumer = dict(
                    db.execute("SELECT consumer, count(*) FROM totals GROUP BY consumer")
                )
            figures.update(
                totals_sent=rows,
                totals_stored=stored,
                totals_lost=rows - distinct_rows,
                totals_duplicates=stored - distinct_rows,
                totals_match_spark=delivered == spark_totals,
                stored_by_consumer=by_consumer,
                stage2_seconds=round(stage2_seconds, 2),
                stage2_rows_per_s=round(rows / stage2_seconds),
            )
            clicks_delivered = sum(delivered.values())
            figures.update(
                sent=total,
                received=clicks_delivered,
                lost=figures["clicks_lost"]
                + figures["totals_lost"]
                + max(0, total - clicks_delivered),
                duplicates=figures["clicks_duplicates"] + figures["totals_duplicates"],
                failovers=len(failovers),
                failover_events=failovers,
                seconds=round(time.monotonic() - started, 1),
            )
            stop_services(services)  # while the coordinator is up: they leave cleanly
    finally:
        progress.close()
        stop_services(services)
        spark.stop()
    return figures


def stop_services(services: list[Service]) -> None:
    for service in services:
        if service.proc.poll() is None:
            service.proc.terminate()
    for service in services:
        service.stop()


def report(figures: dict[str, Any]) -> None:
    print()
    print("Pipeline report")
    print(f"  clicks sent by the producer services      {figures['clicks_sent']:>10,}")
    print(
        f"  clicks counted by Spark (distinct)        {figures['clicks_sent'] - figures['clicks_lost']:>10,}"
    )
    print(
        f"  lost / counted twice in Spark             {figures['clicks_lost']:>5} / {figures['clicks_duplicates']}"
    )
    print(f"  per-minute totals equal the producers'    {figures['totals_match_producers']!s:>10}")
    print(f"  stage 1 clicks/s, end to end              {figures['stage1_msgs_per_s']:>10,}")
    print(f"  totals delivered through the sink         {figures['totals_sent']:>10,}")
    print(
        f"  stored by the consumers (distinct)        {figures['totals_sent'] - figures['totals_lost']:>10,}"
    )
    print(
        f"  lost / stored twice                       {figures['totals_lost']:>5} / {figures['totals_duplicates']}"
    )
    print(f"  consumers' totals equal Spark's           {figures['totals_match_spark']!s:>10}")
    print(f"  stored per consumer                       {figures['stored_by_consumer']}")
    print(f"  stage 2 rows/s, end to end                {figures['stage2_rows_per_s']:>10,}")
    print(f"  fail-overs observed                       {figures['failovers']:>10}")
    for event in figures["failover_events"]:
        print(f"    - {event}")
    print(f"  total time                                {figures['seconds']:>9} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clicks", type=int, default=20_000, help="clicks per producer service")
    parser.add_argument("--rate", type=float, default=2000.0, help="clicks/s per producer")
    parser.add_argument("--consumers", type=int, default=3)
    parser.add_argument("--work-ms", type=float, default=0.5, help="consumer work per row")
    parser.add_argument("--keep", type=Path, default=None, help="keep the files in this directory")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.ERROR)
    # A gRPC server's event loop reports the streams it cut at shutdown: not news here.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    logging.getLogger("grpc").setLevel(logging.CRITICAL)
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
        and figures["totals_match_spark"]
        and figures["received"] == figures["sent"]
    )
    summary = {k: figures[k] for k in ("sent", "received", "lost", "duplicates", "failovers")}
    summary.update(
        seconds=figures["seconds"],
        stage1_msgs_per_s=figures["stage1_msgs_per_s"],
        stage2_rows_per_s=figures["stage2_rows_per_s"],
        ok=ok,
    )
    print(json.dumps(summary), flush=True)
    sys.stderr.flush()
    # Everything is stopped; skip the interpreter's teardown, where grpc's Cython layer
    # prints the tasks of closed event loops after our last line.
    os._exit(0 if ok else 1)


if __name__ == "__main__":
    main()
