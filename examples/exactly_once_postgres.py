"""Exactly-once effect on PostgreSQL: the effect and the consumer's position in one
transaction of the application's own psycopg connection (the ``[postgres]`` extra).

    python examples/exactly_once_postgres.py demo --url postgresql://me@localhost/app

The recipe, in ``consume``: the consumer's deduplication store is a `PostgresTxDedupStore`
in the application's database, and each message's effect (a row of table
``exactly_once_demo_ledger``) is written in ``consumer.transaction(conn, delivery)``,
which records the position in the same transaction and commits; then the delivery is
confirmed. ``demo`` runs it as examples/exactly_once_sqlite.py does (the same producer,
the consumer SIGKILLed ``--kills`` times mid-flow, both finding each other through a
coordinator the demo serves, one JSON line at the end), on the database of ``--url``; it
empties its own table and its consumer's positions there first.

    pykka-delivery coordinator serve --port 7070
    python examples/exactly_once_postgres.py produce --queue Q.db --count N \\
        --coordinator 127.0.0.1:7070
    python examples/exactly_once_postgres.py consume --url URL --coordinator 127.0.0.1:7070
"""

from __future__ import annotations

import argparse
import signal
import tempfile
import threading
from pathlib import Path

import psycopg
from exactly_once_sqlite import (
    coordinator_arguments,
    demo_arguments,
    produce_arguments,
    report,
    run_kills,
    say,
)

from pykka_delivery import DeliveryTimeout, MergedConsumer
from pykka_delivery.coordinator import CoordinatorClient, DirectoryProducers
from pykka_delivery.delivery.stores.dedup_tx_postgres import PostgresTxDedupStore
from pykka_delivery.transport import Node

CONSUMER_ID = "exactly-once-demo"
TABLE = "exactly_once_demo_ledger"


def consume(args: argparse.Namespace) -> int:
    """Apply each number to the ledger exactly once, until SIGTERM."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    store = PostgresTxDedupStore(args.url, CONSUMER_ID)
    with (
        psycopg.connect(args.url, autocommit=True) as conn,
        Node() as node,
        CoordinatorClient(args.coordinator, node=node) as client,
        DirectoryProducers(client, args.service, node) as producers,
    ):
        # Every producer announced under the service, as it comes and goes.
        consumer = MergedConsumer(self_ref_factory=node.expose("ledger"), dedup_store=store)
        consumer.register_to(producers.producers)
        say(ready=True)
        first = True
        while not stopping.is_set():
            try:
                delivery = consumer.receive(timeout=0.2)
            except DeliveryTimeout:
                continue
            number = int.from_bytes(delivery.message, "big")
            # The recipe: effect and position commit together, then confirm.
            with consumer.transaction(conn, delivery):
                conn.execute(f"INSERT INTO {TABLE} (number) VALUES (%s)", (number,))
            delivery.confirm()
            if first:  # what this consumer skipped as applied before it started
                say(first=number, skipped=consumer.statistics().dedup_duplicates)
                first = False
        consumer.close()
    store.close()
    return 0


def demo(args: argparse.Namespace) -> int:
    with psycopg.connect(args.url, autocommit=True) as conn:
        PostgresTxDedupStore(conn, CONSUMER_ID).close()  # creates its table
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        # No UNIQUE on number: the demo counts duplicates rather than refusing them.
        conn.execute(f"CREATE TABLE {TABLE} (id BIGSERIAL PRIMARY KEY, number BIGINT NOT NULL)")
        conn.execute(
            "DELETE FROM pykka_delivery_dedup_position WHERE consumer_id = %s", (CONSUMER_ID,)
        )

        def applied() -> int:
            row = conn.execute(f"SELECT coalesce(max(id), 0) FROM {TABLE}").fetchone()
            return int(row[0]) if row else 0

        directory = Path(args.dir or tempfile.mkdtemp(prefix="exactly-once-"))
        skipped = run_kills(
            args,
            __file__,
            directory,
            lambda address: ["consume", "--url", args.url, "--coordinator", address],
            applied,
        )
        counts = conn.execute(
            f"SELECT count(*), count(DISTINCT number),"
            f" count(DISTINCT CASE WHEN number BETWEEN 1 AND %s THEN number END) FROM {TABLE}",
            (args.count,),
        ).fetchone()
    assert counts is not None
    return report(args, counts, skipped)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("demo", help="producer + consumer, the consumer killed, a count")
    sub.add_argument("--url", required=True, help="postgresql://... of the application's db")
    demo_arguments(sub, positions=False)
    sub.set_defaults(run=demo)
    produce_arguments(commands.add_parser("produce", help="a durable producer of 1..--count"))
    sub = commands.add_parser("consume", help="apply each number to the ledger, once")
    sub.add_argument("--url", required=True, help="postgresql://... of the application's db")
    coordinator_arguments(sub)
    sub.set_defaults(run=consume)
    args = parser.parse_args()
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
