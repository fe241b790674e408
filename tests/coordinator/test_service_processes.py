"""The coordinator across real processes on 127.0.0.1: SIGKILLs, a restart, a rebalance.

A coordinator process, producer processes and consumer processes (`tests.coordinator.procs`),
each consumer process one client connection with a `CoordinatedConsumer` per group. Each
consumer writes its activations and every number it processes to a file before confirming
it, so the test reads exactly what was processed, even by a killed process; the processes
share CLOCK_MONOTONIC, so the activations of different processes are compared directly
(`assert_no_overlap`). Every process is killed and reaped when the test ends; every wait is
bounded.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from pykka_delivery.coordinator import Activity, Consumer, CoordinatorClient
from tests.coordinator.procs import NAMESPACE, Log, assert_no_overlap, free_port
from tests.transport.procs import Proc, left, wait_for

pytestmark = pytest.mark.slow

PROCS = ("-m", "tests.coordinator.procs")
PRODUCER = "examples/remote_producer.py"
BOUND = 50.0  # seconds for the whole run
TIMEOUT = 1.0  # the coordinator's disconnected timeout
COUNT = 6_000
THROTTLE = 3_000  # messages/s per consumer: the kill lands mid-stream

Groups = dict[str, tuple[Consumer, ...]]  # stream -> the group's consumers, as listed


class Spawn:
    """Starts processes; `kill_all` SIGKILLs and reaps them (a no-op for those that
    exited)."""

    def __init__(self) -> None:
        self.started: list[Proc] = []

    def __call__(self, name: str, *argv: str) -> Proc:
        proc = Proc(name, argv)
        self.started.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.started:
            proc.kill(timeout=10)


@pytest.fixture
def spawn() -> Iterator[Spawn]:
    spawner = Spawn()
    try:
        yield spawner
    finally:
        spawner.kill_all()


def wait_for_groups(
    address: str, check: Callable[[Groups], bool], what: str, procs: Sequence[Proc], deadline: float
) -> Groups:
    """Poll the coordinator's listing until ``check`` accepts it; returns it."""
    with CoordinatorClient(address) as client:
        while True:
            listed = client.list_groups(NAMESPACE, timeout=left(deadline))
            groups = {info.group.stream: info.consumers for info in listed}
            if check(groups):
                return groups
            for proc in procs:
                assert proc.alive(), f"{proc.name} exited early\n{proc.output()}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {groups}"
            time.sleep(0.02)


def actives(groups: Groups, owner: Mapping[str, str]) -> dict[str, str | None]:
    """Per stream, the name (``owner[connection]``) of its group's one active consumer;
    None unless every consumer is connected, one is active and the others wait (nobody is
    stepping down)."""
    names: dict[str, str | None] = {}
    for stream, consumers in groups.items():
        active = [c for c in consumers if c.activity is Activity.ACTIVE]
        waiting = [c for c in consumers if c.activity is Activity.WAITING]
        settled = len(active) == 1 and len(waiting) == len(consumers) - 1
        connected = all(c.is_connected for c in consumers)
        names[stream] = owner[active[0].connection] if settled and connected else None
    return names


def check_stream(logs: Mapping[str, Log], last: int) -> list[tuple[str, int, int]]:
    """Check one group's stream, consumed by the consumers whose logs are ``logs``: each
    activation processed consecutive numbers; each started at most one past where the one
    before it stopped (nothing lost at a hand-over); together they processed 1..last;
    no two activations overlapped.

    Returns:
        The activations with deliveries, in time order: ``(consumer, first, last)``.
    """
    runs = sorted(
        (start, name, numbers) for name, log in logs.items() for start, numbers in log.runs()
    )
    for _, name, numbers in runs:
        assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), (
            f"{name}: an activation out of order or with a gap"
        )
    for (_, a, before), (_, b, after) in itertools.pairwise(runs):
        assert after[0] <= before[-1] + 1, f"{b} started at {after[0]}, {a} stopped at {before[-1]}"
    assert {n for log in logs.values() for n in log.processed()} == set(range(1, last + 1))
    assert_no_overlap({name: log.intervals for name, log in logs.items()})
    return [(name, numbers[0], numbers[-1]) for _, name, numbers in runs]


def stop_consumers(consumers: Sequence[Proc], deadline: float) -> None:
    """SIGTERM: each closes its consumers (writing its activations) and exits."""
    for proc in consumers:
        proc.popen.terminate()
    for proc in consumers:
        proc.expect(lambda line: bool(line.get("done")), left(deadline))
        assert proc.wait(10) == 0, proc.output()


def test_killing_the_active_consumer_process_hands_its_group_to_another_without_gaps(
    spawn: Spawn, tmp_path: Path
) -> None:
    deadline = time.monotonic() + BOUND
    coordinator = spawn(
        "coordinator", *PROCS, "coordinator", "--disconnected-timeout", str(TIMEOUT)
    )
    coordinator_address = coordinator.ready()
    producer = spawn("producer", PRODUCER, "--port", "0", "--count", str(COUNT), "--timeout", "60")
    producer_address = producer.ready()
    consumers, files = [], []
    for n in range(3):
        files.append(tmp_path / f"consumer-{n}.txt")
        proc = spawn(
            f"consumer {n}",
            *PROCS,
            "consume",
            "--coordinator",
            coordinator_address,
            "--producer",
            producer_address,
            "--file",
            str(files[-1]),
            "--count",
            str(COUNT),
            "--name",
            f"consumer-{n}",
            "--throttle",
            str(THROTTLE),
            "--no-probe",  # the detection by the timeout: no node to probe
        )
        ready = proc.expect(lambda line: bool(line.get("ready")), 30.0)
        assert ready["active"] == [n == 0], "the first registered is the active one"
        consumers.append(proc)

    first = consumers[0]
    wait_for(
        lambda: len(Log(files[0]).numbers) >= 2_000, "the first to consume", consumers, deadline
    )
    first.kill()
    killed_at = time.monotonic()
    assert first.popen.returncode == -9
    wait_for(
        lambda: any(Log(files[n]).numbers for n in (1, 2)),
        "another consumer to take over",
        consumers[1:],
        deadline,
    )
    successor = next(n for n in (1, 2) if Log(files[n]).numbers)
    with CoordinatorClient(coordinator_address) as client:
        labels = [c.label for c in client.list_groups()[0].consumers]
    done = consumers[successor].expect(
        lambda line: bool(line.get("done")), deadline - time.monotonic()
    )
    sent = producer.expect(lambda line: "sent" in line, 20.0)

    logs = [Log(path) for path in files]
    dead, alive, idle = logs[0], logs[successor], logs[3 - successor]
    print(f"\nkilled at {dead.processed()[-1]}, successor {successor} {done}, producer {sent}")
    assert sent["sent"] == COUNT
    assert labels == ["active (presumed down)", "active (connected)", "waiting (connected)"]
    assert idle.numbers == [] and idle.starts == [], "the third never consumed"
    before, after = dead.processed(), alive.processed()
    assert before == list(range(1, len(before) + 1)), "the first run is in order, without gaps"
    assert after == list(range(after[0], COUNT + 1)), "the second run is in order, without gaps"
    assert after[0] <= before[-1] + 1, "nothing lost across the crash"
    assert len(dead.starts) == 1 and len(alive.starts) == 1
    assert dead.starts[0] < killed_at < alive.starts[0]
    # The killed process consumed at most until it was killed.
    assert_no_overlap({"consumer-0": [(dead.starts[0], killed_at)], "successor": alive.intervals})
    assert alive.starts[0] - killed_at <= TIMEOUT + 5.0, "taken over within the detection time"
    assert alive.starts[0] - killed_at >= TIMEOUT * 0.9, "after the disconnected timeout"


RESTART_COUNT = 2_000  # per producer
RESTART_THROTTLE = 500  # messages/s per consumer: the restart lands mid-stream


def test_coordinator_restart_keeps_groups_and_one_active_per_group(
    spawn: Spawn, tmp_path: Path
) -> None:
    """Two simple groups of two consumer processes, each group on its own producer. The
    coordinator (its state in SQLite) is SIGKILLed mid-stream and started again on the
    same file and port: the groups come back as they were, the active consumers stop
    while cut off and resume with the new coordinator, and every message is processed,
    in order within each activation."""
    deadline = time.monotonic() + 40.0
    port, store = free_port(), tmp_path / "coordinator.sqlite"
    argv = (*PROCS, "coordinator", "--port", str(port), "--disconnected-timeout", "2")
    # A snapshot after 3 commands: the restart reads a snapshot and the log's tail.
    argv = (*argv, "--store", str(store), "--snapshot-every", "3")
    coordinator = spawn("coordinator", *argv)
    address = coordinator.ready(left(deadline))
    streams = ("orders-a", "orders-b")
    producer = spawn(
        "producer",
        *PROCS,
        "produce",
        "--count",
        str(RESTART_COUNT),
        "--stream",
        streams[0],
        "--stream",
        streams[1],
    )
    node = producer.ready(left(deadline))
    names = {stream: [f"{stream}-{n}" for n in range(2)] for stream in streams}
    files = {name: tmp_path / f"{name}.txt" for name in itertools.chain(*names.values())}
    consumers = {
        name: spawn(
            name,
            *PROCS,
            "consume",
            *("--coordinator", address, "--producer", f"{node}/{stream}"),
            *("--file", str(files[name]), "--name", name),
            *("--throttle", str(RESTART_THROTTLE)),
        )
        for stream in streams
        for name in names[stream]
    }
    ready = {
        name: proc.expect(lambda line: bool(line.get("ready")), left(deadline))
        for name, proc in consumers.items()
    }
    owner = {ready[name]["connection"]: name for name in consumers}
    procs = [coordinator, producer, *consumers.values()]
    for stream in streams:
        assert sorted(ready[n]["active"] for n in names[stream]) == [[False], [True]]

    def one_active_each(groups: Groups) -> bool:
        return set(groups) == set(streams) and None not in actives(groups, owner).values()

    wait_for(
        lambda: all(sum(len(Log(files[n]).numbers) for n in names[s]) >= 300 for s in streams),
        "both groups to consume",
        procs,
        deadline,
    )
    before = wait_for_groups(address, one_active_each, "the groups", procs, deadline)
    coordinator.kill()
    killed_at = time.monotonic()
    coordinator = spawn("coordinator again", *argv)
    restarted = coordinator.expect(lambda line: bool(line.get("ready")), left(deadline))
    serving_from = restarted["serving_from"]
    assert restarted["address"] == address
    procs[0] = coordinator
    after = wait_for_groups(address, one_active_each, "the groups back", procs, deadline)
    sent = producer.expect(lambda line: "sent" in line, left(deadline))
    stop_consumers(list(consumers.values()), deadline)

    assert sent["sent"] == dict.fromkeys(streams, RESTART_COUNT), "every message confirmed"
    assert actives(after, owner) == actives(before, owner), "the same active consumers"
    for stream in streams:
        keys = [c.key for c in before[stream]]
        assert [c.key for c in after[stream]] == keys, "the same consumers, in the same order"
        active = actives(after, owner)[stream]
        logs = {name: Log(files[name]) for name in names[stream]}
        runs = check_stream(logs, RESTART_COUNT)
        print(f"\n{stream}: {runs}")
        # The active one stopped while cut off, and resumed with the new coordinator.
        assert {name for name, _, _ in runs} == {active}, "only the active one consumed"
        assert active is not None
        starts = [start for start, _ in logs[active].runs()]
        assert starts[0] < killed_at < serving_from < starts[-1], "consumed before and after"
        for start, end in logs[active].intervals:
            assert end is not None
            assert end <= serving_from or start >= serving_from, (
                f"{active} consumed from {start} to {end}, across the restart "
                f"(killed at {killed_at}, serving again from {serving_from})"
            )


PARTITIONS = 4
PARTITION_THROTTLE = 250  # messages/s per partition and consumer


def test_partitioned_group_spreads_by_modulo_with_hand_overs(spawn: Spawn, tmp_path: Path) -> None:
    """A super stream of 4 partitions (groups ``invoices-0`` .. ``invoices-3``, each its
    partition index) and one consumer process subscribed to all four, then a second, then
    a third. After each join, partition i is consumed by ``consumers[i % len(consumers)]``
    (the machine's rule), reached through step-downs while the producers keep sending:
    the old consumer stops, answers, and only then the new one starts."""
    deadline = time.monotonic() + 40.0
    coordinator = spawn(
        "coordinator",
        *PROCS,
        "coordinator",
        *("--disconnected-timeout", "2", "--partition-assignment", "modulo"),
    )
    address = coordinator.ready(left(deadline))
    streams = [f"invoices-{i}" for i in range(PARTITIONS)]
    producer = spawn(
        "producer", *PROCS, "produce", *itertools.chain(*(("--stream", s) for s in streams))
    )
    node = producer.ready(left(deadline))
    members: list[str] = []
    owner: dict[str, str] = {}  # connection -> consumer name
    procs = [coordinator, producer]
    assignment: dict[str, str] = {}  # stream -> the name of its active consumer

    def log(name: str, stream: str) -> Log:
        return Log(tmp_path / f"{name}-{stream}.txt")

    def assigned(groups: Groups) -> bool:
        """Every partition's group has every member, and its active one is the expected."""
        sizes = {len(consumers) for consumers in groups.values()}
        return actives(groups, owner) == assignment and sizes == {len(members)}

    def join(name: str) -> None:
        """Start consumer process ``name``; wait until the partitions are spread by the
        modulo rule and each partition's consumer processes messages in it."""
        joined_at = time.monotonic()
        proc = spawn(
            name,
            *PROCS,
            "consume",
            *("--coordinator", address, "--partitioned"),
            *itertools.chain(*(("--producer", f"{node}/{s}") for s in streams)),
            *("--file", str(tmp_path / f"{name}-{{stream}}.txt"), "--name", name),
            *("--throttle", str(PARTITION_THROTTLE)),
        )
        procs.append(proc)
        ready = proc.expect(lambda line: bool(line.get("ready")), left(deadline))
        first = not members
        assert ready["active"] == [first] * PARTITIONS, "only a group's first is active at once"
        members.append(name)
        owner[ready["connection"]] = name
        before = dict(assignment)
        assignment.update({s: members[i % len(members)] for i, s in enumerate(streams)})
        wait_for_groups(address, assigned, f"the assignment {assignment}", procs, deadline)

        def consuming() -> bool:
            for stream, holder in assignment.items():
                runs = log(holder, stream).runs()
                moved = before.get(stream, holder) != holder
                if not runs or len(runs[-1][1]) < 50 or (moved and runs[-1][0] < joined_at):
                    return False
            return True

        wait_for(consuming, f"the consumers of {assignment} to consume", procs, deadline)

    for n in range(3):
        join(f"consumer-{n}")
    producer.popen.terminate()
    sent = producer.expect(lambda line: "sent" in line, left(deadline))["sent"]
    stop_consumers(procs[2:], deadline)

    history = {}
    for stream in streams:
        logs = {name: log(name, stream) for name in members}
        runs = check_stream(logs, sent[stream])
        print(f"\n{stream}: {sent[stream]} sent, {runs}")
        history[stream] = [name for name, _, _ in runs]
    assert history == {
        "invoices-0": ["consumer-0"],
        "invoices-1": ["consumer-0", "consumer-1"],
        "invoices-2": ["consumer-0", "consumer-2"],
        "invoices-3": ["consumer-0", "consumer-1", "consumer-0"],
    }
