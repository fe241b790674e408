"""A partitioned stream consumed by a group of 1, 2 and 4 processes; the rebalance pause.

The coordinator (in memory, its gRPC server) and the stream's `PartitionedProducer` (8
partitions, one group, keyed messages) run in this process; each group member is a process
of its own (``python -m tests.partitions.procs member``) whose handler spends ``--work-us``
µs of CPU per message (a busy loop on the thread's CPU clock) and appends the message to
its partition's file, so that the work, not the transport, is the bottleneck.

Throughput: the members join one after the other (the coordinator's sticky rule gives each
8/N partitions); ``--warmup`` messages are sent and handled, then ``--messages`` more are
sent as fast as the group takes them, timed from the first send to the last message
handled (the members write each message's CLOCK_MONOTONIC; the processes share it).
Every message is checked handled, each partition in order.

Rebalance pause: one member handles the stream, sent at ``--rate`` messages/s; a second
joins, and half the partitions (the upper four, by the sticky rule) move to it by
step-down. A moved partition's pause is the time from the last message its old owner
handled to the first its new owner handled; an unmoved partition's is the longest time
between two of its messages during the rebalance (from the first moved partition's stop
to the last one's resumption), which at the paced rate is about ``partitions / rate``
when nothing stops. Medians over the partitions of each
kind (and the maxima) are printed, with the unmoved partitions' longest gap in a steady
stretch as long, before the join (the jitter of the flow itself, for comparison).

Producers: one, then three named producer processes (`tests.partitions.replica_procs`,
each registered in the coordinator's stream catalog) send ``--producer-messages`` together
(each its share) to a group of ``--producer-members`` member processes that are given
only the coordinator's address and find the producers in the catalog (one session per
producer and partition), with the same members, partitions and handler for both, so the
ratio compares the producers only. Each producer first warms up (its sessions open), then
all start at once; timed from the first send to the last message handled, every message
checked handled, per (producer, key) in the order sent.

The machine is shared, so each configuration runs ``--repeat`` times, interleaved, and the
best run counts (another process's load only ever slows a run down).

The last line printed is one JSON object with ``consumers_1_msgs_per_s``,
``consumers_2_msgs_per_s``, ``consumers_4_msgs_per_s``, ``pause_ms_moved_partition``,
``pause_ms_unmoved_partition`` (and the ratios to one consumer, the maxima of the pauses),
``producers_1_msgs_per_s``, ``producers_3_msgs_per_s`` and their ratio ``producers_3_vs_1``,
``moved_partitions_2_to_3`` and ``moved_partitions_2_to_3_modulo``: how many of the 8
partitions change owner when a third member joins a group of two, by the sticky rule (the
default; 2 is the fewest balance allows) and by RabbitMQ's modulo rule, on the real
coordinator with every step-down answered.

Usage: python bench/partitions.py [--messages N] [--work-us U] [--repeat K] [--rate R]
[--producer-messages N] [--producer-members M] [--quick]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import logging
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pykka_delivery.coordinator import (  # noqa: E402
    Activity,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorServer,
    CoordinatorSettings,
    GroupId,
    SendConsumerUpdate,
)
from pykka_delivery.partitions import (  # noqa: E402
    PartitionedProducer,
    PartitionedProducerSettings,
)
from pykka_delivery.transport import Node  # noqa: E402
from tests.partitions.procs import (  # noqa: E402
    check_group,
    handled,
    key_for,
    read_logs,
)
from tests.partitions.replica_procs import key_of  # noqa: E402
from tests.transport.procs import Proc  # noqa: E402

STREAM, GROUP, PARTITIONS, KEYS = "orders", "bench", 8, 256
WAIT = 120.0  # bound on every single wait
WINDOW = 200  # the members' flow-control window


def _wait(condition: Callable[[], bool], what: str, procs: list[Proc], poll: float = 0.02) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        for proc in procs:
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited\n{proc.output()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {what} within {WAIT} s")
        time.sleep(poll)


class Stream:
    """A coordinator, a node with the stream's producer, member processes; `close` ends
    them all."""

    def __init__(self, directory: Path, work_us: float) -> None:
        self.directory = directory
        self.work_us = work_us
        self.coordinator = CoordinatorActor.start(
            settings=CoordinatorSettings(disconnected_timeout=1.0)
        )
        self.server = CoordinatorServer(self.coordinator).start()
        self.node = Node().start()
        self.producer = PartitionedProducer(
            STREAM, PARTITIONS, [GROUP], node=self.node, settings=PartitionedProducerSettings()
        )
        self.members: list[Proc] = []
        self.sent = 0

    def join(self) -> Proc:
        name = f"m{len(self.members) + 1}"
        argv = ["-m", "tests.partitions.procs", "member", "--stream", STREAM]
        argv += ["--partitions", str(PARTITIONS), "--group", GROUP, "--name", name]
        argv += ["--coordinator", self.server.address, "--producer", self.node.address]
        argv += ["--dir", str(self.directory), "--work-us", str(self.work_us)]
        argv += ["--window", str(WINDOW)]
        proc = Proc(name, argv)
        self.members.append(proc)
        proc.ready(WAIT)
        return proc

    def send(self, count: int, rate: float = 0.0) -> None:
        start = time.perf_counter()
        for i in range(count):
            if rate:
                ahead = start + i / rate - time.perf_counter()
                if ahead > 0:
                    time.sleep(ahead)
            number = self.sent + i
            self.producer.send(number, key=key_for(number, KEYS), timeout=WAIT)
        self.sent += count

    def wait_handled(self) -> None:
        _wait(
            lambda: handled(read_logs(self.directory, GROUP, PARTITIONS)) >= self.sent,
            "handling of every message",
            self.members,
            poll=0.05,
        )

    def check(self) -> dict[int, Any]:
        logs = read_logs(self.directory, GROUP, PARTITIONS)
        check_group({p: log.entries for p, log in logs.items()}, PARTITIONS, self.sent, KEYS)
        return logs

    def close(self) -> None:
        for proc in self.members:
            proc.popen.terminate()
        for proc in self.members:
            with contextlib.suppress(AssertionError):
                proc.expect(lambda line: bool(line.get("done")), 30.0)
            proc.kill()
        self.producer.close()
        self.node.stop()
        self.server.stop()
        self.coordinator.stop()


def throughput(members: int, count: int, warmup: int, work_us: float) -> dict[str, Any]:
    """One timed run with ``members`` member processes."""
    with tempfile.TemporaryDirectory(prefix="partitions-bench-") as tmp:
        stream = Stream(Path(tmp), work_us)
        try:
            for _ in range(members):
                stream.join()
            stream.send(warmup)
            stream.wait_handled()
            started = time.monotonic()
            stream.send(count)
            stream.wait_handled()
            logs = stream.check()
        finally:
            stream.close()
    last = max(e.at for log in logs.values() for e in log.entries)
    seconds = last - started
    per_member = {}
    for log in logs.values():
        for entry in log.entries:
            per_member[entry.member] = per_member.get(entry.member, 0) + 1
    return {"msgs_per_s": count / seconds, "seconds": seconds, "handled": per_member}


def pause(rate: float, work_us: float) -> dict[str, Any]:
    """One member, then a second joins while the stream flows at ``rate``: the pause of
    the moved partitions and of the unmoved ones."""
    with tempfile.TemporaryDirectory(prefix="partitions-pause-") as tmp:
        stream = Stream(Path(tmp), work_us)
        try:
            stream.join()
            # Five seconds of steady flow from a thread; the second member joins after one.
            sender = threading.Thread(target=stream.send, args=(int(rate * 5), rate))
            sender.start()
            time.sleep(1.0)
            joined = time.monotonic()
            second = stream.join()  # ready once registered: the rebalance has begun
            registered = time.monotonic()
            sender.join(WAIT)
            stream.wait_handled()
            logs = stream.check()
        finally:
            stream.close()
    moved: dict[int, tuple[float, float]] = {}  # partition -> (old's last, new's first)
    for partition, log in logs.items():
        new = [e.at for e in log.entries if e.member == second.name]
        if new:
            old = [e.at for e in log.entries if e.member != second.name and e.at < min(new)]
            moved[partition] = (max(old), min(new))
    unmoved = [p for p in range(PARTITIONS) if p not in moved]
    # The rebalance: from the first moved partition's stop to the last one's resumption.
    start = min(stop for stop, _ in moved.values())
    end = max(resume for _, resume in moved.values())
    return {
        "moved": sorted(moved),
        "pause_ms_moved": [(resume - stop) * 1000 for stop, resume in moved.values()],
        "pause_ms_unmoved": [_longest_gap(logs[p], start, end) for p in unmoved],
        # The same measure over stretches as long in the steady flow before the join
        # (the median of them): the jitter of the flow itself, for comparison.
        "steady_gap_ms_unmoved": [_steady_gap(logs[p], joined, end - start) for p in unmoved],
        "rebalance_ms": (end - start) * 1000,
        "join_to_registered_s": registered - joined,
    }


def producers(count: int, total: int, members: int, work_us: float) -> dict[str, Any]:
    """One timed run of ``count`` named producer processes (`tests.partitions.replica_procs`,
    registered in the coordinator's catalog) sending ``total`` messages together to a
    group of ``members`` member processes that find them through the coordinator. Each
    producer warms up (its sessions to every member open, a message confirmed on each
    partition), then all are started at once (SIGUSR1); timed from the first producer's
    first send to the last message handled."""
    with tempfile.TemporaryDirectory(prefix="partitions-producers-") as tmp:
        directory = Path(tmp)
        coordinator = CoordinatorActor.start(settings=CoordinatorSettings(disconnected_timeout=1.0))
        server = CoordinatorServer(coordinator).start()
        procs: list[Proc] = []
        try:
            with CoordinatorClient(server.address) as client:
                client.create_stream(STREAM, PARTITIONS, timeout=WAIT)
            common = ["--coordinator", server.address, "--stream", STREAM]
            common += ["--partitions", str(PARTITIONS), "--group", GROUP]
            for m in range(1, members + 1):
                argv = ["-m", "tests.partitions.replica_procs", "member", *common]
                argv += ["--name", f"m{m}", "--dir", tmp, "--sink", "log"]
                argv += ["--work-us", str(work_us), "--window", str(WINDOW)]
                procs.append(Proc(f"m{m}", argv))
            for proc in procs:
                proc.ready(WAIT)
            shares = [total // count + (p < total % count) for p in range(count)]
            senders = []
            for p, share in enumerate(shares, start=1):
                argv = ["-m", "tests.partitions.replica_procs", "produce", *common]
                argv += ["--name", f"p{p}", "--count", str(share), "--keys", str(KEYS)]
                argv += ["--warmup", str(PARTITIONS * 4)]
                senders.append(Proc(f"p{p}", argv))
            procs += senders
            for proc in senders:
                proc.expect(lambda line: bool(line.get("warm")), WAIT)
            for proc in senders:
                os.kill(proc.pid, signal.SIGUSR1)
            started = min(proc.expect(lambda line: "go" in line, WAIT)["go"] for proc in senders)
            for proc in senders:
                proc.expect(lambda line: bool(line.get("confirmed")), WAIT)
            last = _last_handled(directory, {f"p{p}": n for p, n in enumerate(shares, start=1)})
        finally:
            for proc in procs:
                proc.kill()
            server.stop()
            coordinator.stop()
    seconds = last - started
    return {"msgs_per_s": total / seconds, "seconds": seconds}


def _last_handled(directory: Path, shares: dict[str, int]) -> float:
    """When the last message was handled, from what the members logged (``<producer>
    <key> <n> <time>`` per message), having checked that each message of each producer
    (``shares``: how many it sent) was handled once, per (producer, key) in the order
    sent."""
    order: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    last = 0.0
    for partition in range(PARTITIONS):
        path = directory / f"{GROUP}-{partition}.log"
        for line in path.read_text().splitlines() if path.exists() else []:
            name, key, n, at = line.split()
            order[name, key].append(int(n))
            last = max(last, float(at))
    expected: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for name, share in shares.items():
        for i in range(share):
            expected[name, key_of(i, KEYS)].append(i // KEYS)
    if dict(order) != dict(expected):
        wrong = [k for k in expected.keys() | order.keys() if order.get(k) != expected.get(k)]
        raise RuntimeError(f"handled wrong or out of order for (producer, key) {wrong[:5]}")
    return last


def moved_partitions_2_to_3(assignment: str) -> int:
    """Partitions whose active owner changes when a third member joins a group of two on
    `PARTITIONS` partitions, on the real coordinator (its gRPC server, a client per member
    answering each step-down as a member does), counted once every hand-over settled."""
    coordinator = CoordinatorActor.start(
        settings=CoordinatorSettings(partition_assignment=assignment)
    )
    server = CoordinatorServer(coordinator).start()
    clients: list[CoordinatorClient] = []
    groups = [GroupId("bench", f"{STREAM}-{p}", GROUP) for p in range(PARTITIONS)]

    def join() -> CoordinatorClient:
        client = CoordinatorClient(server.address, owner=f"m{len(clients) + 1}")
        clients.append(client)

        def on_update(update: SendConsumerUpdate) -> None:
            if not update.active:  # nothing in flight here: stopped at once
                client.send_activate(update.group, update.subscription_id, epoch=update.epoch)

        for partition, group in enumerate(groups):
            client.register(group, partition, on_update, partition_index=partition, timeout=WAIT)
        return client

    def owners() -> dict[int, str]:
        """partition -> its active member's connection, once no step-down is pending."""
        infos = {i.group: i for i in clients[0].list_groups("bench", timeout=WAIT)}
        out = {}
        for partition, group in enumerate(groups):
            consumers = infos[group].consumers
            if any(c.activity is Activity.DEACTIVATING for c in consumers):
                return {}
            active = [c.connection for c in consumers if c.activity is Activity.ACTIVE]
            if len(active) != 1:
                return {}
            out[partition] = active[0]
        return out

    def settled(members: int) -> dict[int, str]:
        found: dict[int, str] = {}

        def check() -> bool:
            nonlocal found
            found = owners()
            return len(found) == PARTITIONS and len(set(found.values())) == members

        _wait(check, f"{members} members to settle", [])
        return found

    try:
        join()
        join()
        before = settled(2)
        join()
        after = settled(3)
    finally:
        for client in clients:
            client.close()
        server.stop()
        coordinator.stop()
    return sum(1 for p in range(PARTITIONS) if before[p] != after[p])


def _steady_gap(log: Any, joined: float, length: float) -> float:
    """The median `_longest_gap` of the stretches of ``length`` s in the 0.8 s before
    ``joined``."""
    length = max(length, 0.01)
    starts = [joined - 0.8 + k * length for k in range(int(0.8 / length))]
    return statistics.median([_longest_gap(log, a, a + length) for a in starts] or [0.0])


def _longest_gap(log: Any, start: float, end: float) -> float:
    """The longest time, in ms, between two consecutive messages of a partition, among
    those that overlap ``start`` .. ``end``."""
    times = [e.at for e in log.entries]
    gaps = [b - a for a, b in itertools.pairwise(times) if b >= start and a <= end]
    return max(gaps, default=0.0) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40_000, help="timed messages per run")
    parser.add_argument("--warmup", type=int, default=2_000)
    parser.add_argument("--work-us", type=float, default=50.0, help="CPU µs per message")
    parser.add_argument("--rate", type=float, default=2_000.0, help="msgs/s in the pause run")
    parser.add_argument("--repeat", type=int, default=2, help="runs per configuration")
    parser.add_argument(
        "--producer-messages", type=int, default=60_000, help="timed messages per producers run"
    )
    parser.add_argument(
        "--producer-members", type=int, default=2, help="members in the producers runs"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    count = 5_000 if args.quick else args.messages
    producer_count = 3_000 if args.quick else args.producer_messages
    repeat = 1 if args.quick else args.repeat
    # grpc.aio calls back into the event loops of clients already closed, and asyncio
    # logs that at ERROR when they close: noise.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    best: dict[int, dict[str, Any]] = {}
    best_producers: dict[int, dict[str, Any]] = {}
    for attempt in range(1, repeat + 1):
        for members in (1, 2, 4):
            result = throughput(members, count, min(args.warmup, count), args.work_us)
            print(f"{members} consumer process(es), run {attempt}: {json.dumps(result)}")
            if members not in best or result["msgs_per_s"] > best[members]["msgs_per_s"]:
                best[members] = result
        for senders in (1, 3):
            result = producers(senders, producer_count, args.producer_members, 0.0)
            print(f"{senders} producer process(es), run {attempt}: {json.dumps(result)}")
            if senders not in best_producers or (
                result["msgs_per_s"] > best_producers[senders]["msgs_per_s"]
            ):
                best_producers[senders] = result
    moved = {rule: moved_partitions_2_to_3(rule) for rule in ("sticky", "modulo")}
    print(f"partitions moved when a third member joins two: {json.dumps(moved)}")
    pauses = pause(args.rate, args.work_us)
    print(f"rebalance 1 -> 2 consumers at {args.rate:.0f} msgs/s: {json.dumps(pauses)}")
    figures: dict[str, float] = {}
    for members, result in best.items():
        figures[f"consumers_{members}_msgs_per_s"] = result["msgs_per_s"]
    for members in (2, 4):
        figures[f"consumers_{members}_vs_1"] = (
            figures[f"consumers_{members}_msgs_per_s"] / figures["consumers_1_msgs_per_s"]
        )
    for senders, result in best_producers.items():
        figures[f"producers_{senders}_msgs_per_s"] = result["msgs_per_s"]
    figures["producers_3_vs_1"] = (
        figures["producers_3_msgs_per_s"] / figures["producers_1_msgs_per_s"]
    )
    figures["pause_ms_moved_partition"] = statistics.median(pauses["pause_ms_moved"])
    figures["pause_ms_moved_partition_max"] = max(pauses["pause_ms_moved"])
    figures["pause_ms_unmoved_partition"] = statistics.median(pauses["pause_ms_unmoved"])
    figures["pause_ms_unmoved_partition_max"] = max(pauses["pause_ms_unmoved"])
    figures["steady_gap_ms_unmoved_partition"] = statistics.median(pauses["steady_gap_ms_unmoved"])
    figures["pause_ms_paced_gap"] = PARTITIONS / args.rate * 1000
    figures["moved_partitions_2_to_3"] = moved["sticky"]
    figures["moved_partitions_2_to_3_modulo"] = moved["modulo"]
    for key, value in figures.items():
        print(f"{key:<36}{value:>14,.2f}" if "_vs_" in key else f"{key:<36}{value:>14,.1f}")
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
