"""Services for the tests and benchmark of many producers per stream, found through the
coordinator (test_producers_processes.py, bench/partitions.py), and the helpers that read
what they wrote.

Each service is a process on 127.0.0.1 printing JSON lines on stdout (a
``{"ready": true, ...}`` line once it is reachable); the coordinator is
``python -m tests.coordinator.procs coordinator``::

    python -m tests.partitions.replica_procs produce --coordinator HOST:PORT --name p1 \\
        --stream orders --group billing --durable p1.db --count N --rate R
    python -m tests.partitions.replica_procs member --coordinator HOST:PORT --name m1 \\
        --stream orders --group billing --dir D

* ``produce``: a transport `Node`, a `CoordinatorClient` and a named `PartitionedProducer`
  (`PartitionedProducer.from_coordinator`, creating the stream with ``--partitions`` if
  the catalog lacks it), registered in the stream's catalog under ``--name``, its queues
  in the SQLite file ``--durable`` (none if empty). It sends messages ``i`` = 0 ..
  ``--count``-1, each ``{"producer": name, "key": k, "n": n}`` under key ``k`` =
  ``key_of(i, keys)``, ``n`` = ``i // keys`` (per key, n counts 0, 1, 2, ...), at most
  ``--rate`` per second (0: as fast as the groups take them). Restarted on its durable
  queue it goes on from the first ``i`` its queues never stored (the sum of its
  partitions' last seq_nrs: it sends from one thread, so what it stored is exactly
  0 .. that sum - 1), and its queues resend what was not confirmed. Lines: ``ready``
  (with ``start``, the first ``i`` it sends); with ``--warmup W``, W more messages
  (``{"warmup": true, ...}``, keys ``w<k>``, confirmed) then ``{"warm": true}``, and it
  waits for SIGUSR1 before the counted ones, printing ``{"go": <monotonic>}``; then
  ``{"sent": count, ...}`` once all are sent, ``{"confirmed": true}`` once every group
  confirmed them. On SIGTERM it closes the producer (a graceful leave: it drains, then
  withdraws from the catalog) and prints ``{"done": true}``.
* ``member``: a transport `Node`, a `CoordinatorClient` given that node (so the
  coordinator probes it) and one `GroupMember.from_coordinator` of ``--group``: it is
  given only the coordinator's address, and finds the stream's producers in the catalog.
  With ``--sink tx`` (the default) its handler applies each message exactly once: in one
  transaction on ``<dir>/effects-<partition>.db`` it inserts a row in table ``effects``
  and the delivery's position in the partition's `SqliteTxDedupStore` (consumer id
  ``consumer_id(stream, p, group)``, one per activation). With ``--sink log`` it appends
  ``<producer> <key> <n> <monotonic time>`` to ``<dir>/<group>-<partition>.log`` instead (one
  ``write(2)`` per message: the benchmark's light handler), after ``--work-us`` µs of CPU.
  Its activations go to ``<dir>/activations-<name>.log`` from the member's hooks, each
  line one ``write(2)`` (O_APPEND: a SIGKILL cannot leave half a line): ``A <partition>
  <start>`` when it starts consuming a partition, ``E <partition> <start> <end>`` when it
  stops. On SIGTERM it closes the member (its partitions are handed over), says goodbye
  and prints ``{"done": true, "intervals": ..., "stats": ..., "errors": ...}``.

The processes share the host's monotonic clock (CLOCK_MONOTONIC), so the test compares
their activation times with each other's and with its own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pykka_delivery import (
    ConsumerControllerSettings,
    ConsumerFenced,
    DeliveryTimeout,
    ProducerControllerSettings,
)
from pykka_delivery.coordinator import (
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorRefused,
    Refusal,
)
from pykka_delivery.delivery.stores.dedup_tx import SqliteTxDedupStore
from pykka_delivery.partitions import (
    GroupDelivery,
    GroupMember,
    GroupMemberSettings,
    PartitionedProducer,
    PartitionedProducerSettings,
)
from pykka_delivery.partitions.catalog import consumer_id
from pykka_delivery.transport import Node

NAMESPACE = "test"
WAIT = 60.0  # bound on each of a service's own waits (a send's demand, confirmations)
EFFECTS = (
    "CREATE TABLE IF NOT EXISTS effects (producer TEXT, key TEXT, n INTEGER, "
    "partition INTEGER, member TEXT, activation REAL, producer_id TEXT, seq_nr INTEGER)"
)


def key_of(i: int, keys: int) -> str:
    """The key of message ``i`` of a producer."""
    return f"k{i % keys}"


def message_of(name: str, i: int, keys: int) -> dict[str, Any]:
    """Message ``i`` of producer ``name``: its key and its number among that key's."""
    return {"producer": name, "key": key_of(i, keys), "n": i // keys}


# --- what was applied, and when who was active (the test side) ----------------------------


@dataclass(frozen=True, slots=True)
class Effect:
    """One row of the ``effects`` tables, in the order applied on its partition."""

    producer: str
    key: str
    n: int
    partition: int
    member: str
    activation: float
    producer_id: str
    seq_nr: int


def _select(directory: Path, partitions: int, sql: str) -> list[tuple[Any, ...]]:
    """``sql``'s rows from each partition's effects database in turn (none from one
    whose first member has not created its table yet)."""
    rows: list[tuple[Any, ...]] = []
    for partition in range(partitions):
        path = directory / f"effects-{partition}.db"
        if not path.exists():
            continue
        conn = sqlite3.connect(path, timeout=WAIT)
        try:
            rows.extend(conn.execute(sql).fetchall())
        except sqlite3.OperationalError as error:
            if "no such table" not in str(error):
                raise
        finally:
            conn.close()
    return rows


def read_effects(directory: Path, partitions: int) -> list[Effect]:
    """Every effect applied so far, partition by partition, each in the order applied
    (a key is on one partition, so its effects are in the order applied)."""
    sql = (
        "SELECT producer, key, n, partition, member, activation, producer_id, seq_nr "
        "FROM effects ORDER BY rowid"
    )
    return [Effect(*row) for row in _select(directory, partitions, sql)]


def count_effects(directory: Path, partitions: int) -> int:
    """How many effects were applied so far."""
    return sum(n for (n,) in _select(directory, partitions, "SELECT count(*) FROM effects"))


Interval = tuple[float, float | None]


def read_activations(path: Path) -> dict[int, list[Interval]]:
    """Per partition, a member's activations from its ``activations-<name>.log``: each
    ``(start, end)``, ``end`` None if it never stopped (the member was killed)."""
    found: dict[int, dict[float, float | None]] = {}
    lines = path.read_bytes().split(b"\n")[:-1] if path.exists() else []
    for line in lines:
        kind, partition, start, *end = line.decode().split()
        spans = found.setdefault(int(partition), {})
        if kind == "A":
            spans.setdefault(float(start), None)
        else:
            spans[float(start)] = float(end[0])
    return {p: sorted(spans.items()) for p, spans in found.items()}


# --- the services ---------------------------------------------------------------------------


def _emit(**fields: Any) -> None:
    print(json.dumps(fields, default=sorted), flush=True)


def _client(args: argparse.Namespace, node: Node) -> CoordinatorClient:
    settings = CoordinatorClientSettings(
        reconnect_backoff_min=0.05, reconnect_backoff_max=0.5, request_timeout=20.0
    )
    return CoordinatorClient(args.coordinator, node=node, owner=args.name, settings=settings)


def _open_producer(
    args: argparse.Namespace, client: CoordinatorClient, node: Node
) -> PartitionedProducer:
    """The named producer; a restart may find its name still held by its killed self
    until the coordinator saw that connection end: then it tries again, for a while."""
    settings = PartitionedProducerSettings(
        producer=ProducerControllerSettings(resend_first_interval=0.2),
        registration_timeout=20.0,
        leave_timeout=WAIT,
    )
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return PartitionedProducer.from_coordinator(
                client,
                args.stream,
                args.group,
                name=args.name,
                node=node,
                durable_queue=args.durable or None,
                create_with=args.partitions,
                namespace=NAMESPACE,
                settings=settings,
                timeout=20.0,
            )
        except CoordinatorRefused as refused:
            if refused.refusal is not Refusal.PRODUCER_CONFLICT or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _send(producer: PartitionedProducer, message: Any, key: str) -> None:
    """Send, waiting for demand as long as it takes within `WAIT` (a timeout sent it to
    no group, so sending again duplicates nothing)."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            producer.send(message, key=key, timeout=1.0)
            return
        except DeliveryTimeout:
            if time.monotonic() > deadline:
                raise


def _stored(producer: PartitionedProducer) -> int:
    """Messages its queues hold already: the sum of its partitions' last seq_nrs (each
    message goes to one partition, for every group alike)."""
    group = producer.groups[0]
    return sum(
        producer.producer(group, p).snapshot().sent_seq_nr for p in range(producer.partitions)
    )


def produce(args: argparse.Namespace) -> None:
    stop = threading.Event()
    go = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: go.set())
    with Node() as node:
        client = _client(args, node)
        producer = _open_producer(args, client, node)
        start = _stored(producer)
        _emit(ready=True, address=node.address, start=start)
        if args.warmup:
            for w in range(args.warmup):
                _send(producer, {"warmup": w}, f"w{w}")
            producer.wait_confirmed(WAIT)
            _emit(warm=True)
            while not go.wait(0.01):  # short waits: the signal handler runs in between
                pass
        began = time.monotonic()
        _emit(go=began)
        pace = 1 / args.rate if args.rate else 0.0
        for i in range(start, args.count):
            if pace:
                ahead = began + (i - start) * pace - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            _send(producer, message_of(args.name, i, args.keys), key_of(i, args.keys))
        _emit(sent=args.count, seconds=round(time.monotonic() - began, 3))
        producer.wait_confirmed(WAIT * 2)
        _emit(confirmed=True, seconds=round(time.monotonic() - began, 3))
        while not stop.wait(0.1):
            pass
        producer.close()  # drains, then leaves the catalog
        client.close()
        _emit(done=True)


class _Handler:
    """A member's handler: the effect in the delivery's transaction (``tx``), or a line in
    the partition's log (``log``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.name = args.name
        self.stream, self.group = args.stream, args.group
        self.directory = Path(args.dir)
        self.sink = args.sink
        self.work = args.work_us / 1e6
        self.member: GroupMember | None = None
        self.ready = threading.Event()  # `member` is set
        self._local = threading.local()  # per partition thread: its connection or fd
        self._activations = os.open(
            self.directory / f"activations-{self.name}.log",
            os.O_WRONLY | os.O_APPEND | os.O_CREAT,
            0o644,
        )

    def store(self, partition: int) -> SqliteTxDedupStore:
        """A new store for one activation of ``partition``."""
        return SqliteTxDedupStore(
            self.directory / f"effects-{partition}.db",
            consumer_id(self.stream, partition, self.group),
        )

    def _conn(self, partition: int) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            path = self.directory / f"effects-{partition}.db"
            conn = sqlite3.connect(path, isolation_level=None, timeout=WAIT)
            conn.execute("PRAGMA synchronous = OFF")  # a killed process loses nothing committed
            conn.execute(EFFECTS)
            self._local.conn = conn
        return conn

    def _fd(self, partition: int) -> int:
        fd: int | None = getattr(self._local, "fd", None)
        if fd is None:
            path = self.directory / f"{self.group}-{partition}.log"
            fd = self._local.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return fd

    def __call__(self, delivery: GroupDelivery) -> None:
        message = delivery.message
        if "warmup" in message:
            return
        if self.work:
            end = time.thread_time() + self.work
            while time.thread_time() < end:
                pass
        partition = delivery.partition
        if self.sink == "log":
            line = f"{message['producer']} {message['key']} {message['n']} {time.monotonic()!r}\n"
            os.write(self._fd(partition), line.encode())
            return
        assert self.member is not None
        activation = self.member.intervals()[partition][-1].start
        conn = self._conn(partition)
        row = (
            message["producer"],
            message["key"],
            message["n"],
            partition,
            self.name,
            activation,
            delivery.producer_id,
            delivery.seq_nr,
        )
        # Fenced: a newer activation took the partition over; it applies the message.
        with contextlib.suppress(ConsumerFenced), delivery.transaction(conn):
            conn.execute("INSERT INTO effects VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)

    def activated(self, partition: int) -> None:
        # Only a first activation may come between the member's start and `member` being
        # set just after: a wait of microseconds.
        self.ready.wait(WAIT)
        assert self.member is not None
        start = self.member.intervals()[partition][-1].start
        os.write(self._activations, f"A {partition} {start!r}\n".encode())

    def deactivated(self, partition: int) -> None:
        self.ready.wait(WAIT)
        assert self.member is not None
        span = self.member.intervals()[partition][-1]
        os.write(self._activations, f"E {partition} {span.start!r} {span.end!r}\n".encode())


def member(args: argparse.Namespace) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    settings = GroupMemberSettings(
        consumer=ConsumerControllerSettings(
            flow_control_window=args.window, resend_interval_min=0.2, resend_interval_max=2.0
        ),
        close_grace=5.0,
        registration_timeout=20.0,
    )
    handler = _Handler(args)
    with Node() as node:
        client = _client(args, node)
        group_member = GroupMember.from_coordinator(
            client,
            args.stream,
            args.group,
            handler=handler,
            node=node,
            namespace=NAMESPACE,
            settings=settings,
            create_with=args.partitions,
            timeout=20.0,
            dedup_store=handler.store if args.sink == "tx" else None,
            on_activated=handler.activated,
            on_deactivated=handler.deactivated,
        )
        handler.member = group_member
        handler.ready.set()
        _emit(ready=True, address=node.address, partitions=group_member.partitions)
        while not stop.wait(0.1):
            pass
        group_member.close()
        client.close()
        intervals = group_member.intervals()
        _emit(
            done=True,
            intervals={p: [[i.start, i.end] for i in spans] for p, spans in intervals.items()},
            stats=dataclasses.asdict(group_member.statistics()),
            errors=[repr(e) for e in group_member.errors],
            producers=list(group_member.producers()),
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="services for many producers per stream")
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser, run: Callable[[argparse.Namespace], None]) -> None:
        sub.add_argument("--coordinator", required=True, help="host:port of the coordinator")
        sub.add_argument("--name", required=True, help="the producer's or member's name")
        sub.add_argument("--stream", default="orders")
        sub.add_argument("--partitions", type=int, default=8, help="if it creates the stream")
        sub.set_defaults(run=run)

    sub = commands.add_parser("produce", help="a named producer registered in the catalog")
    common(sub, produce)
    sub.add_argument("--group", action="append", required=True)
    sub.add_argument("--durable", default="", help="SQLite file of its queues ('': none)")
    sub.add_argument("--count", type=int, required=True, help="messages in all (0 .. N-1)")
    sub.add_argument("--keys", type=int, default=16, help="distinct keys")
    sub.add_argument("--rate", type=float, default=0.0, help="most messages/s (0: no limit)")
    sub.add_argument("--warmup", type=int, default=0, help="then wait for SIGUSR1")

    sub = commands.add_parser("member", help="a group member finding producers in the catalog")
    common(sub, member)
    sub.add_argument("--group", required=True)
    sub.add_argument("--dir", required=True)
    sub.add_argument("--sink", choices=("tx", "log"), default="tx")
    sub.add_argument("--work-us", type=float, default=0.0, help="CPU µs per message")
    sub.add_argument("--window", type=int, default=50, help="flow-control window")

    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
