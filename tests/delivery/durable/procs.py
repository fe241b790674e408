"""Services for the durable multi-process tests (tests/delivery/durable/test_processes.py).

Each service is a process with one `Node` on 127.0.0.1 printing JSON lines on stdout, as
the services of tests/transport/procs.py (whose `Proc` wrapper the tests use to run them)::

    python -m tests.delivery.durable.procs produce --db Q --consumer HOST:PORT/NAME --count N
    python -m tests.delivery.durable.procs consume --file F --count N [--dedup-db D]
    python -m tests.delivery.durable.procs consume --file F --count N --effects-url URL

* ``produce``: a durable `Producer` on `SqliteDurableQueue(--db, --producer-id)` (a
  `PostgresDurableQueue` when ``--db`` is a ``postgresql://`` URL), exposed
  as ``durable-producer-<pid>``. It registers the consumer at ``--consumer`` itself, so a
  restarted producer (a new node address every time) reaches the consumer without the
  consumer knowing where it went; the name carries the process id so that two
  incarnations never share an address even if the OS hands out the same port again (the
  consumer would take the new one for the old one, mid-session). It sends the message
  whose payload is its number (8 bytes, big-endian) and whose seq_nr is that number,
  from where the queue says (`ProducerSnapshot.current_seq_nr` once loaded; the loaded
  unconfirmed messages are resent by the producer itself), up to ``--count``, in
  `Producer.send_many` batches of ``--batch``. Lines:

  - ``{"ready": true, "address": ..., "current_seq_nr": C, "unconfirmed": [lo, hi] | null}``
    after loading (``unconfirmed``: the loaded range that will be resent);
  - ``{"sent": S}`` after each batch: seq_nrs up to S are stored (and sent);
  - ``{"done": true, ...}`` once every message is confirmed.

* ``consume``: a `Consumer` exposed as ``--name`` that never registers anywhere (each
  producer incarnation registers it), optionally with a `SqliteDedupStore` (``--dedup-db``).
  It appends each delivered number to ``--file`` with one ``write(2)`` (O_APPEND, so a kill
  cannot leave half a line) before confirming it, and stops after number ``--count``;
  ``--throttle`` paces it (messages/s). With ``--effects-url`` (a ``postgresql://`` URL)
  it is the exactly-once recipe instead (docs/durable.md, "Exactly-once effect"): its
  store is a `PostgresTxDedupStore` in that database, and each number's effect, a row of
  ``EFFECTS_TABLE`` (made if missing; no UNIQUE, so a duplicate shows), is inserted in
  ``consumer.transaction(conn, delivery)`` with its position, committed, then appended to
  ``--file`` (progress only) and confirmed.
  Lines: ``ready``, ``{"timeout": ...}`` per `DeliveryTimeout` (it gives up after
  ``--max-timeouts``), with ``--effects-url`` ``{"skipped": n}`` when the consumer's count
  of duplicates it did not deliver (``dedup_duplicates``) has grown, seen at the next
  delivery, and a summary with the consumer's statistics.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from pykka_delivery import (
    Consumer,
    ConsumerControllerSettings,
    DeliveryTimeout,
    Producer,
    SqliteDedupStore,
    SqliteDurableQueue,
)
from pykka_delivery.delivery.stores.dedup_tx_postgres import PostgresTxDedupStore
from pykka_delivery.delivery.stores.durable_postgres import PostgresDurableQueue
from pykka_delivery.transport import Node, NodeSettings

NUMBER_BYTES = 8
PACING_SLACK = 0.002  # seconds ahead of the --throttle rate before the consumer sleeps
EFFECTS_TABLE = "durable_effect"
CONSUMER_ID = "durable-consumer"


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def payload_of(number: int) -> bytes:
    return number.to_bytes(NUMBER_BYTES, "big")


def produce(args: argparse.Namespace) -> int:
    queue: Any
    if args.db.startswith("postgresql://"):
        queue = PostgresDurableQueue(args.db, args.producer_id)
    else:
        queue = SqliteDurableQueue(args.db, args.producer_id)
    try:
        with Node(NodeSettings(port=0)) as node:
            name = f"durable-producer-{os.getpid()}"
            producer = Producer(
                args.producer_id, durable_queue=queue, self_ref_factory=node.expose(name)
            )
            loaded = producer.snapshot()
            unconfirmed = loaded.unconfirmed
            _emit(
                ready=True,
                address=f"{node.address}/{name}",
                current_seq_nr=loaded.current_seq_nr,
                unconfirmed=[unconfirmed[0], unconfirmed[-1]] if unconfirmed else None,
            )
            producer.register_consumer(node.ref(args.consumer))
            number = loaded.current_seq_nr
            while number <= args.count:
                numbers = range(number, min(args.count, number + args.batch - 1) + 1)
                seq_nrs = producer.send_many(map(payload_of, numbers), timeout=args.timeout)
                if seq_nrs != list(numbers):
                    _emit(error=f"numbers {numbers} were given seq_nrs {seq_nrs}")
                    return 3
                _emit(sent=numbers[-1])
                number = numbers[-1] + 1
            producer.wait_confirmed(timeout=args.timeout)
            stats = producer.statistics()
            _emit(done=True, sent=stats.sent, resent=stats.resent, stored=stats.stored)
            producer.close()
    finally:
        queue.close()
    return 0


class _Effects:
    """``--effects-url``: the application's connection, on which each number's row and
    its position commit together."""

    def __init__(self, url: str) -> None:
        self.conn = psycopg.connect(url, autocommit=True)
        self.conn.execute(
            f"CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE}"
            " (id BIGSERIAL PRIMARY KEY, number BIGINT NOT NULL)"
        )

    def apply(self, consumer: Consumer, delivery: Any, number: int) -> None:
        with consumer.transaction(self.conn, delivery):
            self.conn.execute(f"INSERT INTO {EFFECTS_TABLE} (number) VALUES (%s)", (number,))


def _report_skipped(consumer: Consumer, skipped: int) -> int:
    """Emit ``{"skipped": n}`` if the duplicates ``consumer`` did not deliver grew past
    ``skipped``; returns the count."""
    now = consumer.statistics().dedup_duplicates
    if now > skipped:
        _emit(skipped=now)
    return now


def _stores(args: argparse.Namespace) -> tuple[Any, _Effects | None]:
    """The consumer's deduplication store (None: none) and its effects (None: the file
    only)."""
    if args.effects_url:
        return PostgresTxDedupStore(args.effects_url, CONSUMER_ID), _Effects(args.effects_url)
    if args.dedup_db:
        return SqliteDedupStore(args.dedup_db, CONSUMER_ID), None
    return None, None


def consume(args: argparse.Namespace) -> int:
    fd = os.open(args.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    store, effects = _stores(args)
    try:
        with Node(NodeSettings(port=0)) as node:
            settings = ConsumerControllerSettings(
                flow_control_window=args.window,
                resend_interval_min=args.resend_interval,
                resend_interval_max=max(args.resend_interval, 30.0),
                max_attempts=args.max_attempts,
                redelivery_backoff=0.01,
            )
            consumer = Consumer(
                settings,
                self_ref_factory=node.expose(args.name),
                dedup_store=store,
                dead_letters=args.dead_letters,
            )
            _emit(ready=True, address=f"{node.address}/{args.name}")
            received = timeouts = mismatches = skipped = 0
            started = time.monotonic()
            while True:
                try:
                    delivery = consumer.receive(timeout=args.receive_timeout)
                except DeliveryTimeout as error:
                    timeouts += 1
                    _emit(timeout=type(error).__name__, received=received)
                    if timeouts >= args.max_timeouts:
                        break
                    continue
                number = int.from_bytes(delivery.message[:NUMBER_BYTES], "big")
                mismatches += number != delivery.seq_nr
                if effects is not None:
                    skipped = _report_skipped(consumer, skipped)
                if args.poison_every and number % args.poison_every == 0:
                    delivery.reject(f"poison {number}")  # every attempt fails
                    if number >= args.count and delivery.attempt >= args.max_attempts:
                        break
                    continue
                if effects is not None:
                    effects.apply(consumer, delivery, number)
                os.write(fd, b"%d\n" % number)  # recorded before it is confirmed
                delivery.confirm()
                received += 1
                if number >= args.count:
                    break
                if args.throttle:  # a steady flow, so that a kill lands anywhere in it
                    ahead = received / args.throttle - (time.monotonic() - started)
                    if ahead > PACING_SLACK:
                        time.sleep(ahead)
                    elif ahead < -PACING_SLACK:  # it waited for a producer: no catching up
                        started = time.monotonic() - received / args.throttle
            consumer.close()
            _emit(
                received=received,
                timeouts=timeouts,
                mismatches=mismatches,
                stats=dataclasses.asdict(consumer.statistics()),
            )
    finally:
        os.close(fd)
        if effects is not None:
            effects.conn.close()
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="services for tests/delivery/durable/test_processes.py"
    )
    commands = parser.add_subparsers(dest="command", required=True)

    sub = commands.add_parser("produce", help="a durable producer sending 1..--count")
    sub.add_argument(
        "--db", required=True, help="the SqliteDurableQueue file, or a postgresql:// URL"
    )
    sub.add_argument("--producer-id", default="durable-orders")
    sub.add_argument("--consumer", required=True, help="host:port/name of the consumer")
    sub.add_argument("--count", type=int, required=True, help="the last number to send")
    sub.add_argument("--batch", type=int, default=250, help="messages per send_many call")
    sub.add_argument("--timeout", type=float, default=60.0, help="bound on every wait")
    sub.set_defaults(run=produce)

    sub = commands.add_parser("consume", help="append each delivered number to --file")
    sub.add_argument("--file", required=True)
    sub.add_argument("--count", type=int, required=True, help="stop after this number")
    sub.add_argument("--dedup-db", default=None, help="a SqliteDedupStore file (none: off)")
    sub.add_argument(
        "--effects-url", default=None, help="postgresql://: effects + PostgresTxDedupStore"
    )
    sub.add_argument("--name", default="durable-consumer")
    sub.add_argument("--window", type=int, default=500, help="flow-control window")
    sub.add_argument("--resend-interval", type=float, default=1.0)
    sub.add_argument("--throttle", type=float, default=0.0, help="most messages/s (0: no limit)")
    sub.add_argument("--receive-timeout", type=float, default=30.0)
    sub.add_argument("--max-timeouts", type=int, default=1, help="stop after this many")
    sub.add_argument("--poison-every", type=int, default=0, help="reject multiples of this")
    sub.add_argument("--max-attempts", type=int, default=3)
    sub.add_argument("--dead-letters", default=None, help="SqliteDeadLetters file")
    sub.set_defaults(run=consume)

    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
