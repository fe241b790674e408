"""A consumer service of the pipeline demo: receives per-minute click totals from Spark.

It joins the work-pulling group of service key ``minute-totals`` (a `SinkWorker`
registered in the coordinator's service directory) and stores each row it is handed in
table ``totals`` of the SQLite ledger file all the consumer services share, in the
ledger's transaction: a row is stored once however often it arrives (a retried Spark
task, or the rows a killed consumer left unconfirmed, sent again to another). Each row
also takes ``--work-ms`` of simulated work. Prints ``READY`` once registered, then
``APPLIED <rows>`` now and then; SIGTERM leaves the group and exits.

Run by examples/pipeline/run.py.
"""

from __future__ import annotations

import argparse
import signal
import sqlite3
import threading
import time
from pathlib import Path

from pykka_delivery.coordinator import CoordinatorClient
from pykka_delivery.spark import SinkRows, SinkWorker, SqliteRowLedger
from pykka_delivery.transport import Node

SERVICE_KEY = "minute-totals"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--ledger", type=Path, required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--work-ms", type=float, default=0.2)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    ledger = SqliteRowLedger(args.ledger)
    with sqlite3.connect(args.ledger, timeout=30) as db:
        db.execute(
            "CREATE TABLE IF NOT EXISTS totals (user TEXT, minute INTEGER, clicks INTEGER, "
            "consumer TEXT, producer TEXT, row INTEGER)"
        )

    def store(rows: SinkRows, db: sqlite3.Connection | None) -> None:
        assert db is not None
        time.sleep(args.work_ms / 1000 * len(rows.rows))
        db.executemany(
            "INSERT INTO totals VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    r["user"],
                    r["minute"],
                    r["clicks"],
                    args.name,
                    rows.producer_id,
                    rows.first_row + i,
                )
                for i, r in enumerate(rows.rows)
            ],
        )

    with Node() as node, CoordinatorClient(args.coordinator, node=node) as client:
        worker = SinkWorker(client, node, SERVICE_KEY, store, ledger=ledger, name=args.name)
        print("READY", flush=True)
        try:
            while not stop.wait(0.5):
                print(f"APPLIED {worker.statistics().rows}", flush=True)
        finally:
            worker.close()
            ledger.close()


if __name__ == "__main__":
    main()
