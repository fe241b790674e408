"""Services for the consumer-group tests across processes (test_group_processes.py), and
the checks both group tests (and bench/partitions.py) apply to what was handled.

Services, each a process on 127.0.0.1 printing JSON lines on stdout (a
``{"ready": true, ...}`` line once it is reachable); the coordinator is
``python -m tests.coordinator.procs coordinator``::

    python -m tests.partitions.procs produce --stream orders --partitions 8 \\
        --group billing --group audit --count N --rate R
    python -m tests.partitions.procs member --coordinator HOST:PORT --producer HOST:PORT \\
        --stream orders --partitions 8 --group billing --group audit --dir D --name m1

* ``produce``: a transport `Node` and a `PartitionedProducer` of the stream for the
  groups, sending the numbers 0 .. N-1, number n with key ``key_for(n, keys)``, at most
  ``--rate`` per second (0: as fast as the groups take them). It prints
  ``{"sent": N, "seconds": ...}`` when all are sent, ``{"confirmed": true, ...}`` when
  every group confirmed them, then runs until killed.
* ``member``: a transport `Node`, one `CoordinatorClient` and a `GroupMember` per
  ``--group`` (those also given as ``--dedup-group`` with a `SqliteDedupStore` in
  ``--dedup-file``, ``flush_every=1``). The handler burns ``--work-us`` µs of CPU, then
  appends to ``<dir>/<group>-<partition>.log``, with one ``write(2)`` each (O_APPEND: a
  SIGKILL cannot leave half a line): ``S <member> <activation start>`` before the first
  message of each activation, then ``D <member> <seq_nr> <number> <key> <time>`` per
  message (its monotonic time), *before* it returns (the message is confirmed after).
  Only one member is active on a partition at a time, so a partition's file is in the
  order its messages were handled.
  On SIGTERM it closes its members (the handlers finish, the partitions are handed over),
  says goodbye and prints ``{"done": true, "intervals": ..., "stats": ...}``.

The processes share the host's monotonic clock (CLOCK_MONOTONIC), so the test compares
their activation times with each other's and with its own.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pykka_delivery import ConsumerControllerSettings, ProducerControllerSettings
from pykka_delivery.coordinator import CoordinatorClient, CoordinatorClientSettings
from pykka_delivery.delivery.stores.dedup import SqliteDedupSettings
from pykka_delivery.partitions import (
    GroupDelivery,
    GroupMember,
    GroupMemberSettings,
    PartitionedProducer,
    PartitionedProducerSettings,
    partition_for_key,
)
from pykka_delivery.transport import Node, NodeSettings

NAMESPACE = "test"


def key_for(number: int, keys: int) -> str:
    """The key of message ``number`` in these tests."""
    return f"k{number % keys}"


# --- what was handled, and the checks ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Entry:
    """One handled message of a partition: by whom, its seq_nr, number and key, and when
    (CLOCK_MONOTONIC; 0 where not recorded)."""

    member: str
    seq_nr: int
    number: int
    key: str
    at: float = 0.0


@dataclass
class PartitionLog:
    """A partition's log of one group: what was handled, in order, and the activation
    starts each member wrote (``(member, start)``, in order)."""

    entries: list[Entry] = dataclasses.field(default_factory=list)
    starts: list[tuple[str, float]] = dataclasses.field(default_factory=list)


def read_log(path: Path) -> PartitionLog:
    log = PartitionLog()
    # The last line may be half written while the file is read: leave it for next time.
    lines = path.read_bytes().split(b"\n")[:-1] if path.exists() else []
    for line in lines:
        kind, member, *rest = line.decode().split()
        if kind == "S":
            log.starts.append((member, float(rest[0])))
        else:
            seq_nr, number, key, at = rest
            log.entries.append(Entry(member, int(seq_nr), int(number), key, float(at)))
    return log


def read_logs(directory: Path, group: str, partitions: int) -> dict[int, PartitionLog]:
    return {p: read_log(directory / f"{group}-{p}.log") for p in range(partitions)}


def handled(logs: Mapping[int, PartitionLog]) -> int:
    """Distinct numbers handled so far."""
    return len({e.number for log in logs.values() for e in log.entries})


@dataclass(frozen=True, slots=True)
class GroupReport:
    """What `check_group` found besides its assertions.

    Attributes:
        duplicates: per partition, the entries that repeat an earlier one.
        runs: per partition, the members that handled it in turn (consecutive entries by
            one member form a run).
    """

    duplicates: dict[int, list[Entry]]
    runs: dict[int, list[str]]

    @property
    def duplicate_count(self) -> int:
        return sum(len(d) for d in self.duplicates.values())


def check_group(
    entries: Mapping[int, Sequence[Entry]], partitions: int, count: int, keys: int
) -> GroupReport:
    """Check what one group handled, each partition's entries in the order handled:

    * every number from 0 to ``count - 1`` was handled, each on the partition of its key;
    * each partition starts at seq_nr 1 and never skips one: each entry's seq_nr is at
      most one past the highest handled before it (a smaller one is a redelivery, after a
      hand-over), and a seq_nr always carries the same number;
    * per key, the numbers, taken at their first handling, come in the order sent.
    """
    duplicates: dict[int, list[Entry]] = {}
    runs: dict[int, list[str]] = {}
    seen_numbers: set[int] = set()
    for partition in range(partitions):
        got = list(entries.get(partition, ()))
        runs[partition] = [member for member, _ in itertools.groupby(e.member for e in got)]
        if not got:
            continue
        assert got[0].seq_nr == 1, f"partition {partition} starts at seq_nr {got[0].seq_nr}"
        by_seq: dict[int, int] = {}
        seen: set[int] = set()
        last_by_key: dict[str, int] = {}
        duplicates[partition] = []
        highest = 0
        for entry in got:
            assert entry.seq_nr <= highest + 1, (
                f"partition {partition}: seq_nr {entry.seq_nr} ({entry.member}) when the "
                f"highest handled was {highest}: a gap"
            )
            highest = max(highest, entry.seq_nr)
        for entry in got:
            assert by_seq.setdefault(entry.seq_nr, entry.number) == entry.number, entry
            assert entry.key == key_for(entry.number, keys), entry
            assert partition_for_key(entry.key, partitions) == partition, entry
            if entry.number in seen:
                duplicates[partition].append(entry)
                continue
            seen.add(entry.number)
            assert last_by_key.get(entry.key, -1) < entry.number, (
                f"key {entry.key}: {entry.number} handled after {last_by_key[entry.key]}"
            )
            last_by_key[entry.key] = entry.number
        seen_numbers |= seen
    missing = sorted(set(range(count)) - seen_numbers)
    assert not missing, f"{len(missing)} never handled, the first {missing[:10]}"
    assert seen_numbers == set(range(count))
    return GroupReport(duplicates, runs)


# --- the services ------------------------------------------------------------------------


def _sorted(value: object) -> object:
    """JSON for the sets in statistics (`GroupMemberStats.owned`)."""
    if isinstance(value, frozenset | set):
        return sorted(value)
    msg = f"not JSON-able: {value!r}"
    raise TypeError(msg)


def _emit(**fields: Any) -> None:
    print(json.dumps(fields, default=_sorted), flush=True)


def _stop_on_sigterm() -> threading.Event:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return stop


def produce(args: argparse.Namespace) -> None:
    settings = PartitionedProducerSettings(
        producer=ProducerControllerSettings(resend_first_interval=0.2)
    )
    with Node(NodeSettings(port=args.port)) as node:
        producer = PartitionedProducer(
            args.stream, args.partitions, args.group, node=node, settings=settings
        )
        _emit(ready=True, address=node.address)
        started = time.perf_counter()
        pace = 1 / args.rate if args.rate else 0.0
        for number in range(args.count):
            if pace:
                ahead = started + number * pace - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
            producer.send(number, key=key_for(number, args.keys), timeout=60.0)
        seconds = time.perf_counter() - started
        _emit(sent=args.count, seconds=round(seconds, 3))
        producer.wait_confirmed(timeout=120.0)
        _emit(confirmed=True, seconds=round(time.perf_counter() - started, 3))
        threading.Event().wait()  # until killed: consumers may still ack


class _Recorder:
    """A member's handler: simulated work, then one line per message."""

    def __init__(self, args: argparse.Namespace, group: str) -> None:
        self.name = args.name
        self.group = group
        self.work = args.work_us / 1e6
        self.fds = [
            os.open(
                Path(args.dir) / f"{group}-{p}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
            )
            for p in range(args.partitions)
        ]
        self.seen = [0] * args.partitions
        self.member: GroupMember | None = None

    def __call__(self, delivery: GroupDelivery) -> None:
        if self.work:
            end = time.thread_time() + self.work
            while time.thread_time() < end:
                pass
        partition = delivery.partition
        fd = self.fds[partition]
        assert self.member is not None
        spans = self.member.intervals()[partition]
        if len(spans) > self.seen[partition]:
            self.seen[partition] = len(spans)
            os.write(fd, f"S {self.name} {spans[-1].start!r}\n".encode())
        line = (
            f"D {self.name} {delivery.seq_nr} {delivery.message} {delivery.key} "
            f"{time.monotonic()!r}\n"
        )
        os.write(fd, line.encode())


def member(args: argparse.Namespace) -> None:
    stop = _stop_on_sigterm()
    client_settings = CoordinatorClientSettings(
        reconnect_backoff_min=0.05, reconnect_backoff_max=0.5, request_timeout=20.0
    )
    settings = GroupMemberSettings(
        consumer=ConsumerControllerSettings(
            flow_control_window=args.window, resend_interval_min=0.2, resend_interval_max=2.0
        ),
        close_grace=5.0,
        dedup=SqliteDedupSettings(flush_every=1),
    )
    with Node() as node:
        client = CoordinatorClient(
            args.coordinator, node=node.address, owner=args.name, settings=client_settings
        )
        members: dict[str, GroupMember] = {}
        for group in args.group:
            recorder = _Recorder(args, group)
            members[group] = recorder.member = GroupMember(
                client,
                args.stream,
                args.partitions,
                group,
                producer=args.producer,
                handler=recorder,
                node=node,
                namespace=NAMESPACE,
                settings=settings,
                dedup_store=args.dedup_file if group in args.dedup_group else None,
            )
        _emit(ready=True, address=node.address, connection=client.connection_id)
        stop.wait()
        for group_member in members.values():
            group_member.close()
        client.close()
        _emit(
            done=True,
            intervals={
                group: {p: [[i.start, i.end] for i in spans] for p, spans in m.intervals().items()}
                for group, m in members.items()
            },
            stats={g: dataclasses.asdict(m.statistics()) for g, m in members.items()},
            errors={g: [repr(e) for e in m.errors] for g, m in members.items()},
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="services for tests/partitions")
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--stream", default="orders")
        sub.add_argument("--partitions", type=int, default=8)
        sub.add_argument("--group", action="append", required=True)

    sub = commands.add_parser("produce", help="a partitioned producer sending numbers")
    common(sub)
    sub.add_argument("--port", type=int, default=0)
    sub.add_argument("--count", type=int, required=True)
    sub.add_argument("--keys", type=int, default=64, help="distinct keys")
    sub.add_argument("--rate", type=float, default=0.0, help="most messages/s (0: no limit)")
    sub.set_defaults(run=produce)

    sub = commands.add_parser("member", help="group members logging what they handle")
    common(sub)
    sub.add_argument("--coordinator", required=True)
    sub.add_argument("--producer", required=True, help="host:port of the producer's node")
    sub.add_argument("--dir", required=True)
    sub.add_argument("--name", required=True)
    sub.add_argument("--dedup-group", action="append", default=[])
    sub.add_argument("--dedup-file", default="")
    sub.add_argument("--work-us", type=float, default=0.0)
    sub.add_argument("--window", type=int, default=50)
    sub.set_defaults(run=member)

    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
