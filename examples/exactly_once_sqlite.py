"""Exactly-once effect on SQLite: the effect and the consumer's position in one transaction.

    python examples/exactly_once_sqlite.py demo --count 30000 --kills 3

The recipe, in ``consume``: the consumer's deduplication store is a `SqliteTxDedupStore`
in the application's own database, and each message's effect (here: a row in table
``ledger``) is written in ``consumer.transaction(conn, delivery)``, which records the
message's position in the same transaction and commits; the delivery is confirmed after.
A consumer killed at any moment has either committed both or neither; the one started
after it loads the positions and skips what was applied, however much of it the producer
resends.

``demo`` runs it as a user would: a producer process with a durable queue
(``produce``) sends the numbers 1..count, a consumer process (``consume``) applies them,
each given only the address of a coordinator the demo serves (the producer announces
itself under service ``--service``, the consumer finds it there), and the demo SIGKILLs
the consumer ``--kills`` times mid-flow, starting a new one each time. At the end it
counts the ledger's rows and prints one JSON line: ``duplicates`` (rows applied twice)
and ``missing`` are 0 and ``exactly_once`` is true. With
``--positions behind`` the consumer uses a `SqliteDedupStore` instead (positions written
behind, in transactions of their own, effects committed one by one), to compare: each kill
then applies again what was confirmed since its last flush.

    pykka-delivery coordinator serve --port 7070
    python examples/exactly_once_sqlite.py produce --queue Q.db --count N \\
        --coordinator 127.0.0.1:7070
    python examples/exactly_once_sqlite.py consume --db app.db --coordinator 127.0.0.1:7070
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pykka_delivery import (
    DeliveryTimeout,
    MergedConsumer,
    Producer,
    SqliteDedupStore,
    SqliteDurableQueue,
    SqliteTxDedupStore,
)
from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorServer,
    DirectoryProducers,
    announce_producer,
)
from pykka_delivery.transport import Node

PRODUCER_ID = "ledger-feed"
CONSUMER_ID = "ledger"


def say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def produce(args: argparse.Namespace) -> int:
    """A durable producer of the numbers 1..count (8-byte payloads), announced under
    service ``--service`` in the coordinator."""
    durable_queue = SqliteDurableQueue(args.queue, PRODUCER_ID)
    with Node() as node, CoordinatorClient(args.coordinator, node=node) as client:
        producer = Producer(
            PRODUCER_ID, durable_queue=durable_queue, self_ref_factory=node.expose(PRODUCER_ID)
        )
        # Consumers find it there: host:port/PRODUCER_ID, while this client lives.
        announce_producer(client, args.service, node, PRODUCER_ID)
        say(ready=True, address=f"{node.address}/{PRODUCER_ID}")
        number = producer.snapshot().current_seq_nr  # after a restart: where the queue says
        while number <= args.count:
            batch = range(number, min(args.count, number + 499) + 1)
            producer.send_many((n.to_bytes(8, "big") for n in batch), timeout=args.timeout)
            number = batch[-1] + 1
        producer.wait_confirmed(timeout=args.timeout)
        say(done=True, sent=args.count)
        producer.close()
    durable_queue.close()
    return 0


def consume(args: argparse.Namespace) -> int:
    """Apply each number to the ledger exactly once, until SIGTERM."""
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    conn = sqlite3.connect(args.db, isolation_level=None)  # transactions are explicit
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA busy_timeout=5000")
    # No UNIQUE on number: the demo counts duplicates rather than refusing them.
    conn.execute("CREATE TABLE IF NOT EXISTS ledger (number INTEGER NOT NULL)")
    if args.positions == "tx":
        store: SqliteTxDedupStore | SqliteDedupStore = SqliteTxDedupStore(args.db, CONSUMER_ID)
    else:
        store = SqliteDedupStore(f"{args.db}.positions", CONSUMER_ID)
    with (
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
            if args.positions == "tx":
                # The recipe: effect and position commit together, then confirm.
                with consumer.transaction(conn, delivery):
                    conn.execute("INSERT INTO ledger (number) VALUES (?)", (number,))
            else:
                conn.execute("INSERT INTO ledger (number) VALUES (?)", (number,))
            delivery.confirm()
            if first:  # what this consumer skipped as applied before it started
                say(first=number, skipped=consumer.statistics().dedup_duplicates)
                first = False
        consumer.close()
    store.close()
    conn.close()
    return 0


# --- the demo: processes, kills, the count --------------------------------------------


class Child:
    """A process of ``script``; its stdout JSON lines are read by a thread."""

    def __init__(self, script: str, log: Path, *argv: str) -> None:
        with log.open("a") as stderr:  # the library's warnings (a killed peer, say)
            self.popen = subprocess.Popen(
                [sys.executable, script, *argv], stdout=subprocess.PIPE, stderr=stderr, text=True
            )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            self.lines.put(json.loads(line))

    def expect(self, key: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                break
            if key in line:
                return line
        msg = f"no {key!r} line within {timeout} s (exit status {self.popen.poll()})"
        raise TimeoutError(msg)

    def stop(self, sig: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
        self.popen.wait(30)


def run_kills(
    args: argparse.Namespace,
    script: str,
    directory: Path,
    consume: Callable[[str], list[str]],
    applied: Callable[[], int],
) -> list[int]:
    """Serve a coordinator, start ``script produce``, then ``args.kills`` + 1 consumers
    one after the other (``consume(coordinator address)``: their arguments), each
    SIGKILLed once ``applied()`` (effects so far) passes the next step of the flow, the
    last one stopped once the producer saw everything confirmed. Returns what each
    consumer skipped at its start."""
    rng = random.Random(args.seed)
    log = directory / "processes.log"
    queue_file = str(directory / "queue.db")
    count = str(args.count)
    children: list[Child] = []
    skipped = []
    with coordinator() as address:
        try:
            producer = Child(
                script, log, "produce", "--queue", queue_file, "--count", count,
                "--coordinator", address,
            )  # fmt: skip
            children.append(producer)
            producer.expect("ready", 30)
            step = args.count // (args.kills + 1)
            for kill in range(args.kills + 1):
                consumer = Child(script, log, *consume(address))
                children.append(consumer)
                consumer.expect("ready", 30)
                if kill == args.kills:  # the last one runs to the end
                    producer.expect("done", args.timeout)
                    consumer.stop(signal.SIGTERM)
                else:  # SIGKILL anywhere around the next step of the flow
                    target = (kill + 1) * step + rng.randrange(-step // 4, step // 4)
                    deadline = time.monotonic() + args.timeout
                    while applied() < target:
                        if time.monotonic() > deadline or consumer.popen.poll() is not None:
                            raise TimeoutError(f"the consumer did not reach {target}")
                        time.sleep(0.005)
                    consumer.stop(signal.SIGKILL)
                with contextlib.suppress(TimeoutError):  # printed after its first delivery
                    skipped.append(consumer.expect("first", 5)["skipped"])
            producer.popen.wait(30)
        finally:
            for child in children:
                if child.popen.poll() is None:
                    child.stop(signal.SIGKILL)
    return skipped


@contextlib.contextmanager
def coordinator() -> Iterator[str]:
    """A coordinator (its command log in memory) served on a free port; its address."""
    actor = CoordinatorActor.start()
    try:
        server = CoordinatorServer(actor).start()
        try:
            yield server.address
        finally:
            server.stop()
    finally:
        actor.stop()


def report(args: argparse.Namespace, counts: tuple[int, int, int], skipped: list[int]) -> int:
    """Print the ledger's count (rows, distinct numbers, distinct numbers in 1..count);
    the exit status: 1 if the transactional recipe did not apply each number once."""
    rows, distinct, in_range = counts
    exactly_once = rows == distinct == in_range == args.count
    say(
        positions=args.positions,
        count=args.count,
        kills=args.kills,
        effects=rows,
        duplicates=rows - distinct,
        missing=args.count - in_range,
        skipped_at_start=skipped,
        exactly_once=exactly_once,
    )
    return 0 if exactly_once or args.positions != "tx" else 1


def applied(db: Path) -> int:
    """Rows in the ledger so far (read while the consumer writes: WAL readers wait for
    no one)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        try:
            return int(conn.execute("SELECT coalesce(max(rowid), 0) FROM ledger").fetchone()[0])
        except sqlite3.OperationalError:  # no table yet
            return 0


def demo(args: argparse.Namespace) -> int:
    directory = Path(args.dir or tempfile.mkdtemp(prefix="exactly-once-"))
    db = directory / "app.db"
    skipped = run_kills(
        args,
        __file__,
        directory,
        lambda address: (
            ["consume", "--db", str(db), "--coordinator", address, "--positions", args.positions]
        ),
        lambda: applied(db),
    )
    with contextlib.closing(sqlite3.connect(db)) as conn:
        counts = conn.execute(
            "SELECT count(*), count(DISTINCT number),"
            " count(DISTINCT CASE WHEN number BETWEEN 1 AND ? THEN number END) FROM ledger",
            (args.count,),
        ).fetchone()
    return report(args, counts, skipped)


def demo_arguments(sub: argparse.ArgumentParser, *, positions: bool = True) -> None:
    """The options of ``demo``, shared with the PostgreSQL example (which has only the
    transactional store: no ``--positions``)."""
    sub.add_argument("--count", type=int, default=30_000)
    sub.add_argument("--kills", type=int, default=3, help="consumer SIGKILLs mid-flow")
    if positions:
        sub.add_argument("--positions", choices=("tx", "behind"), default="tx")
    else:
        sub.set_defaults(positions="tx")
    sub.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    sub.add_argument("--seed", type=int, default=None, help="of the kill points")
    sub.add_argument("--timeout", type=float, default=120.0, help="bound on each wait")


def coordinator_arguments(sub: argparse.ArgumentParser) -> None:
    """Where producers are announced and found: shared by ``produce`` and ``consume``."""
    sub.add_argument("--coordinator", required=True, help="the coordinator's host:port")
    sub.add_argument("--service", default="ledger", help="the producers' service key")


def produce_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--queue", required=True, help="its SqliteDurableQueue file")
    sub.add_argument("--count", type=int, required=True)
    coordinator_arguments(sub)
    sub.add_argument("--timeout", type=float, default=120.0)
    sub.set_defaults(run=produce)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("demo", help="producer + consumer, the consumer killed, a count")
    demo_arguments(sub)
    sub.set_defaults(run=demo)
    produce_arguments(commands.add_parser("produce", help="a durable producer of 1..--count"))
    sub = commands.add_parser("consume", help="apply each number to the ledger, once")
    sub.add_argument("--db", required=True, help="the application's database")
    coordinator_arguments(sub)
    sub.add_argument("--positions", choices=("tx", "behind"), default="tx")
    sub.set_defaults(run=consume)
    args = parser.parse_args()
    return int(args.run(args))


if __name__ == "__main__":
    raise SystemExit(main())
