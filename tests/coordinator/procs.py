"""Services for the coordinator's multi-process tests (test_service_processes.py), and the
helpers that read what they wrote.

Each service is a process on 127.0.0.1 (or on ``--host``, an address of the network
namespace it runs in: tests/netns.py) printing JSON lines on stdout (a
``{"ready": true, ...}`` line once it is reachable)::

    python -m tests.coordinator.procs coordinator --disconnected-timeout 1.0
    python -m tests.coordinator.procs produce --stream orders-0 --stream orders-1 --count N
    python -m tests.coordinator.procs consume --coordinator HOST:PORT \\
        --producer HOST:PORT/orders-0 --producer HOST:PORT/orders-1 --file F-{stream}.txt

* ``coordinator``: a `CoordinatorActor` behind a `CoordinatorServer`, on ``--port`` (0:
  any free one; the ready line gives the address and ``serving_from``, the monotonic time
  just before it started listening), its state in memory or, with ``--store``, in a
  `SqliteCommandLog` (a new process on the same file and port is the same coordinator,
  restarted). It runs until it is killed.
* ``produce``: one transport `Node` with a `Producer` per ``--stream``, exposed under the
  stream's name, each sending the numbers 1, 2, ... (the first 8 bytes of each payload,
  big-endian, as examples/remote_producer.py sends them) from its own thread: ``--count``
  of them, or with ``--count 0`` until SIGTERM. Once each has every message it sent
  confirmed, it prints ``{"sent": {stream: last number}}``, then runs until killed.
* ``consume``: a transport `Node`, one `CoordinatorClient` (one connection) and a
  `CoordinatedConsumer` per ``--producer``, in group ``test/<stream>/billing`` (the stream
  is the producer's exposed name), each consumed on its own thread. With
  ``--partitioned`` the n-th producer's group is partition n, as the partitions of a super
  stream are; otherwise each group is simple. The ready line says, per group, whether the
  registration made it active. To ``--file`` (``{stream}`` in it is replaced by the
  stream) each thread appends, each with a single ``write(2)`` (O_APPEND: a SIGKILL cannot
  leave a partial line), ``start <monotonic seconds>`` when it sees an activation begin,
  then each number *before* confirming it (``<number> <epoch>`` when the consumer has a
  fencing ``epoch``), and when it stops, ``interval <start> <end>``
  per activation, with or without deliveries. With ``--sink`` (``{stream}`` replaced
  too) each number is then committed to that SQLite database (table ``processed``: number,
  epoch, consumer) in one transaction with its position in a `SqliteTxDedupStore` (one per
  activation, the group's consumer id): a number already applied is skipped, and a
  write of an activation fenced by a newer one is refused (`sink_rows` reads it). A thread
  stops after number ``--count`` (0: never); on SIGTERM every thread stops. The consumers
  are then closed (unregistered: the next consumer takes over), the client says goodbye,
  and the process prints ``{"done": true, ...}`` and exits.
* ``watch``: prints ``{"groups": {stream: [{"owner", "activity", "connected"}, ...]}}``,
  the coordinator's listing of namespace ``test``, every ``--interval`` seconds (for tests
  whose coordinator is in a network namespace they cannot reach themselves).

The processes share the host's monotonic clock (CLOCK_MONOTONIC), so the test compares
their activation times with each other's and with its own.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pykka_delivery import (
    ConsumerControllerSettings,
    ConsumerFenced,
    DeliveryTimeout,
    Producer,
    ProducerControllerSettings,
)
from pykka_delivery.coordinator import (
    SIMPLE,
    CoordinatedConsumer,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
    SqliteCommandLog,
)
from pykka_delivery.coordinator.store import DEFAULT_SNAPSHOT_EVERY
from pykka_delivery.delivery.stores.dedup_tx import SqliteTxDedupStore
from pykka_delivery.transport import Node, NodeSettings

NAMESPACE = "test"
GROUP_NAME = "billing"

Interval = tuple[float, float | None]  # (start, end); end None: open (or killed)


# --- the test side ---------------------------------------------------------------------


class Log:
    """What one consumer thread wrote to its file.

    Attributes:
        starts: its activations' starts, as it saw them (only those with deliveries).
        numbers: ``(activation, number)`` per number processed, ``activation`` the index
            in ``starts``.
        epochs: per entry of ``numbers``, the consumer's fencing epoch when it processed
            that number (None: the consumer had none).
        intervals: every activation ``(start, end)``, from the ``interval`` lines written
            when it stopped; a killed process wrote none: then ``(start, None)`` for each
            start.
    """

    def __init__(self, path: Path) -> None:
        self.starts: list[float] = []
        self.numbers: list[tuple[int, int]] = []
        self.epochs: list[int | None] = []
        closed: list[Interval] = []
        lines = path.read_bytes().splitlines() if path.exists() else []
        for line in lines:
            if line.startswith(b"start "):
                self.starts.append(float(line.split()[1]))
            elif line.startswith(b"interval "):
                _, start, end = line.split()
                closed.append((float(start), float(end)))
            else:
                number, *epoch = line.split()
                self.numbers.append((len(self.starts) - 1, int(number)))
                self.epochs.append(int(epoch[0]) if epoch else None)
        self.intervals: list[Interval] = closed or [(start, None) for start in self.starts]

    def processed(self) -> list[int]:
        return [number for _, number in self.numbers]

    def runs(self) -> list[tuple[float, list[int]]]:
        """Per activation with deliveries: its start and the numbers it processed."""
        return [
            (self.starts[activation], [number for _, number in numbers])
            for activation, numbers in itertools.groupby(self.numbers, key=lambda n: n[0])
        ]


def assert_no_overlap(intervals_by_consumer: Mapping[str, Iterable[Interval]]) -> None:
    """Assert that no two activations of one group overlap, whoever held them.

    Args:
        intervals_by_consumer: each consumer's activations ``(start, end)`` in
            CLOCK_MONOTONIC seconds (comparable across the processes of one host); an end
            of None is open, allowed only for the activation that starts last.
    """
    ordered = sorted(
        (interval, name)
        for name, intervals in intervals_by_consumer.items()
        for interval in intervals
    )
    for ((start_a, end_a), a), ((start_b, _), b) in itertools.pairwise(ordered):
        assert end_a is not None, f"{a}'s activation from {start_a} is open, {b} started {start_b}"
        assert end_a <= start_b, (
            f"{a}'s activation {start_a}..{end_a} overlaps {b}'s from {start_b} "
            f"by {end_a - start_b:.6f} s"
        )


def free_port() -> int:
    """A port free on 127.0.0.1 now, below the kernel's ephemeral range: no outgoing
    connection takes it while its server is down between two runs (clients reconnecting to
    it could otherwise get it as their own port and connect to themselves)."""
    low = 32768
    ranges = Path("/proc/sys/net/ipv4/ip_local_port_range")
    if ranges.exists():
        low = int(ranges.read_text().split()[0])
    for port in random.sample(range(max(1024, low - 12_000), low), 200):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    msg = f"no free port on 127.0.0.1 below {low}"
    raise AssertionError(msg)


# --- the services ------------------------------------------------------------------------


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _stop_on_sigterm() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def _join(threads: Sequence[threading.Thread]) -> None:
    """Join in short waits, so that the main thread still runs signal handlers."""
    for thread in threads:
        while thread.is_alive():
            thread.join(0.1)


def coordinator(args: argparse.Namespace) -> None:
    timeout = args.disconnected_timeout
    settings = CoordinatorSettings(
        disconnected_timeout=timeout,
        recovery_min_delay=timeout,
        partition_assignment=args.partition_assignment,
    )
    server_settings = CoordinatorServerSettings(
        host=args.host,
        port=args.port,
        allow_insecure=_off_loopback(args.host),
        keepalive_time=args.keepalive_time,
        keepalive_timeout=args.keepalive_timeout,
    )
    log = None
    if args.store:
        log = SqliteCommandLog(args.store, snapshot_every=args.snapshot_every)
    actor = CoordinatorActor.start(log, settings)
    serving_from = time.monotonic()
    with CoordinatorServer(actor, server_settings) as server:
        _emit(ready=True, address=server.address, serving_from=serving_from)
        threading.Event().wait()  # until killed


def _send(producer: Producer, count: int, stop: threading.Event, sent: dict[str, int]) -> None:
    payload = bytes(92)
    number = 0
    while not stop.is_set() and (count == 0 or number < count):
        try:
            producer.send((number + 1).to_bytes(8, "big") + payload, timeout=0.2)
        except DeliveryTimeout:
            continue  # no demand (no active consumer): check for the stop, then try again
        number += 1
    producer.wait_confirmed(timeout=60.0)
    sent[producer.producer_id] = number


def produce(args: argparse.Namespace) -> None:
    stop = _stop_on_sigterm()
    settings = ProducerControllerSettings(resend_first_interval=0.2)
    node_settings = NodeSettings(
        host=args.host,
        port=args.port,
        advertised_address=args.advertise or None,
        allow_insecure=_off_loopback(args.host),
    )
    with Node(node_settings) as node:
        producers = [
            Producer(stream, settings, self_ref_factory=node.expose(stream))
            for stream in args.stream
        ]
        _emit(ready=True, address=node.address)
        sent: dict[str, int] = {}
        senders = [
            threading.Thread(target=_send, args=(p, args.count, stop, sent), daemon=True)
            for p in producers
        ]
        for sender in senders:
            sender.start()
        _join(senders)
        _emit(sent=sent)
        threading.Event().wait()  # until killed: the consumers may still talk to it


def open_sink(path: str) -> sqlite3.Connection:
    """The ``--sink`` database: table ``processed (number, epoch, consumer)``."""
    conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
    conn.execute("CREATE TABLE IF NOT EXISTS processed (number INTEGER, epoch INTEGER, consumer)")
    return conn


def sink_rows(path: Path) -> list[tuple[int, int, str]]:
    """What the consumers of one group committed to their ``--sink``: ``(number, epoch,
    consumer)`` per row, by number."""
    conn = sqlite3.connect(path)
    try:
        return list(conn.execute("SELECT number, epoch, consumer FROM processed ORDER BY number"))
    finally:
        conn.close()


def _consume(
    consumer: CoordinatedConsumer,
    path: str,
    count: int,
    pause: float,
    stop: threading.Event,
    *,
    sink_path: str = "",
    name: str = "",
) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    sink = open_sink(sink_path) if sink_path else None  # used on this thread only
    try:
        seen = 0
        while not stop.is_set():
            try:
                delivery = consumer.receive(timeout=0.1)
            except DeliveryTimeout:
                continue  # not active, or nothing sent: check for the stop
            intervals = consumer.intervals()
            if len(intervals) > seen:
                seen = len(intervals)
                os.write(fd, b"start %r\n" % intervals[-1].start)
            number = int.from_bytes(delivery.message[:8], "big")
            epoch = getattr(consumer, "epoch", None)  # fencing epochs, where the consumer has them
            if epoch is None:
                os.write(fd, b"%d\n" % number)  # recorded before it is confirmed
            else:
                os.write(fd, b"%d %d\n" % (number, epoch))
            if sink is not None:
                # Refused when a newer activation wrote to the store: not applied here.
                with contextlib.suppress(ConsumerFenced), consumer.transaction(sink, delivery):
                    sink.execute("INSERT INTO processed VALUES (?, ?, ?)", (number, epoch, name))
            delivery.confirm()
            if pause:
                time.sleep(pause)  # a steady flow: a kill or a hand-over lands anywhere in it
            if number == count:
                break
        consumer.close()  # from the consuming thread, nothing in flight
        for interval in consumer.intervals():
            os.write(fd, b"interval %r %r\n" % (interval.start, interval.end))
    finally:
        os.close(fd)
        if sink is not None:
            sink.close()


def consume(args: argparse.Namespace) -> None:
    stop = _stop_on_sigterm()
    client_settings = CoordinatorClientSettings(
        reconnect_backoff_min=0.05,
        reconnect_backoff_max=0.5,
        request_timeout=10.0,
        **_keepalive(args),
    )
    consumer_settings = ConsumerControllerSettings(
        flow_control_window=args.window, resend_interval_min=0.2, resend_interval_max=2.0
    )
    with Node(NodeSettings(host=args.host, allow_insecure=_off_loopback(args.host))) as node:
        client = CoordinatorClient(
            args.coordinator,
            node=node.address if args.no_probe else node,
            owner=args.name,
            settings=client_settings,
        )
        consumers = {}
        sinks: dict[str, str] = {}
        for index, producer in enumerate(args.producer):
            stream = producer.rsplit("/", 1)[1]
            sinks[stream] = args.sink.replace("{stream}", stream)
            consumers[stream] = CoordinatedConsumer(
                client,
                NAMESPACE,
                stream,
                GROUP_NAME,
                node.ref(producer),
                partition_index=index if args.partitioned else SIMPLE,
                settings=consumer_settings,
                node=node,
                dedup_store=_sink_store(sinks[stream], stream),
            )
        _emit(
            ready=True,
            active=[c.registered.active for c in consumers.values()],
            connection=client.connection_id,
        )
        pause = 1 / args.throttle if args.throttle else 0.0
        threads = [
            threading.Thread(
                target=_consume,
                args=(c, args.file.replace("{stream}", s), args.count, pause, stop),
                kwargs={"sink_path": sinks[s], "name": args.name},
                name=f"consume-{s}",
            )
            for s, c in consumers.items()
        ]
        for thread in threads:
            thread.start()
        while not stop.wait(0.05) and any(t.is_alive() for t in threads):
            pass
        stop.set()
        _join(threads)
        client.close()
        _emit(done=True, confirmed={s: c.confirmed for s, c in consumers.items()})


def _sink_store(path: str, stream: str) -> Callable[[], SqliteTxDedupStore] | None:
    """Each activation's deduplication store in the ``--sink`` database (one consumer id
    per group, whichever process consumes it); None without a sink."""
    if not path:
        return None
    open_sink(path).close()  # the table, before any store opens the file
    return lambda: SqliteTxDedupStore(path, f"{NAMESPACE}/{stream}/{GROUP_NAME}")


def watch(args: argparse.Namespace) -> None:
    """Print the coordinator's listing every ``--interval`` seconds, from inside a test
    host the test process itself cannot reach (tests/netns.py)."""
    with CoordinatorClient(args.coordinator) as client:
        _emit(ready=True, address=args.coordinator)
        while True:
            try:
                listed = client.list_groups(NAMESPACE, timeout=args.interval * 10)
            except DeliveryTimeout:
                continue
            groups = {
                info.group.stream: [
                    {"owner": c.owner, "activity": c.activity.name, "connected": c.is_connected}
                    for c in info.consumers
                ]
                for info in listed
            }
            _emit(groups=groups, at=time.monotonic())
            time.sleep(args.interval)


def _off_loopback(host: str) -> bool:
    """Plaintext off loopback: only on a test host's private address (tests/netns.py)."""
    return host != "127.0.0.1"


def _keepalive(args: argparse.Namespace) -> dict[str, float]:
    """The client's keepalive options given on the command line (the defaults otherwise)."""
    given = {"keepalive_time": args.keepalive_time, "keepalive_timeout": args.keepalive_timeout}
    return {name: value for name, value in given.items() if value is not None}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="services for tests/coordinator")
    commands = parser.add_subparsers(dest="command", required=True)

    sub = commands.add_parser("coordinator", help="a coordinator actor behind its server")
    sub.add_argument("--port", type=int, default=0)
    sub.add_argument("--disconnected-timeout", type=float, default=1.0)
    sub.add_argument("--store", default="", help="a SQLite command log (default: in memory)")
    sub.add_argument("--snapshot-every", type=int, default=DEFAULT_SNAPSHOT_EVERY)
    sub.add_argument("--host", default="127.0.0.1", help="the address to bind")
    sub.add_argument("--keepalive-time", type=float, default=10.0, help="server pings, s")
    sub.add_argument("--keepalive-timeout", type=float, default=5.0, help="ping answer, s")
    sub.add_argument("--partition-assignment", default="sticky", help="sticky or modulo")
    sub.set_defaults(run=coordinator)

    sub = commands.add_parser("produce", help="a producer per stream on one node")
    sub.add_argument("--stream", action="append", required=True, help="a producer's name")
    sub.add_argument("--count", type=int, default=0, help="numbers to send (0: until SIGTERM)")
    sub.add_argument("--port", type=int, default=0)
    sub.add_argument("--host", default="127.0.0.1", help="the address to bind")
    sub.add_argument("--advertise", default="", help="host:port others reach it at (a proxy)")
    sub.set_defaults(run=produce)

    sub = commands.add_parser("consume", help="coordinated consumers writing to --file")
    sub.add_argument("--coordinator", required=True, help="host:port of the coordinator")
    sub.add_argument(
        "--producer", action="append", required=True, help="host:port/stream, one per group"
    )
    sub.add_argument("--partitioned", action="store_true", help="group n is partition n")
    sub.add_argument(
        "--sink", default="", help="SQLite file ({stream} replaced) each number is committed to"
    )
    sub.add_argument("--file", required=True, help="{stream} is replaced by the stream")
    sub.add_argument("--count", type=int, default=0, help="stop after this number (0: never)")
    sub.add_argument("--name", default="consumer")
    sub.add_argument("--window", type=int, default=100, help="flow-control window")
    sub.add_argument("--throttle", type=float, default=0.0, help="most messages/s (0: no limit)")
    sub.add_argument("--host", default="127.0.0.1", help="the address its node binds")
    sub.add_argument(
        "--no-probe",
        action="store_true",
        help="give the client the node's address only: the coordinator cannot probe it",
    )
    sub.add_argument("--keepalive-time", type=float, help="client pings, s (default: client's)")
    sub.add_argument("--keepalive-timeout", type=float, help="ping answer, s (default: client's)")
    sub.set_defaults(run=consume)

    sub = commands.add_parser("watch", help="print the coordinator's listing, again and again")
    sub.add_argument("--coordinator", required=True, help="host:port of the coordinator")
    sub.add_argument("--interval", type=float, default=0.1, help="seconds between listings")
    sub.set_defaults(run=watch)

    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
