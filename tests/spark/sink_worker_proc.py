"""A consumer service for the sink tests, run as its own process: a `SinkWorker` under
``--key`` storing each row's id in table ``got`` of the shared ledger file, in the ledger's
transaction, after ``--sleep-ms`` of work per message. Prints ``{"ready": true, "address":
...}`` once registered; runs until killed or told to stop (SIGTERM)."""

from __future__ import annotations

import argparse
import json
import signal
import sqlite3
import threading
import time

from pykka_delivery.coordinator import CoordinatorClient
from pykka_delivery.spark import SinkRows, SinkWorker
from pykka_delivery.transport import Node


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--coordinator", required=True)
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def handle(rows: SinkRows, db: sqlite3.Connection | None) -> None:
        assert db is not None
        time.sleep(args.sleep_ms / 1000)
        db.executemany(
            "INSERT INTO got VALUES (?, ?, ?, ?)",
            [
                (r["id"], rows.producer_id, rows.first_row + i, args.name)
                for i, r in enumerate(rows.rows)
            ],
        )

    with Node() as node, CoordinatorClient(args.coordinator, node=node.address) as client:
        worker = SinkWorker(client, node, args.key, handle, ledger=args.ledger, name=args.name)
        print(json.dumps({"ready": True, "address": node.address}), flush=True)
        stop.wait()
        worker.close()


if __name__ == "__main__":
    main()
