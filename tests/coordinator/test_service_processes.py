"""The coordinator across real processes on 127.0.0.1, one of them killed with SIGKILL.

A coordinator process, a producer process (examples/remote_producer.py) and three
consumer processes (`procs consume`), each a `CoordinatedConsumer` in one simple group.
Each consumer writes its activations and every number it processes to a file before
confirming it, so the test reads exactly what was processed, even by a killed process.
Every process is killed and reaped when the test ends; every wait is bounded.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pykka_delivery.coordinator import CoordinatorClient, GroupId
from tests.transport.procs import Proc

pytestmark = pytest.mark.slow

PROCS = ("-m", "tests.coordinator.procs")
PRODUCER = "examples/remote_producer.py"
BOUND = 50.0  # seconds for the whole run
TIMEOUT = 1.0  # the coordinator's disconnected timeout
COUNT = 6_000
THROTTLE = 3_000  # messages/s per consumer: the kill lands mid-stream
GROUP = GroupId("test", "orders", "billing")


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


class Log:
    """What one consumer process wrote: its activations' starts and ends, and the numbers
    it processed, each with the index of its activation."""

    def __init__(self, path: Path) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []
        self.numbers: list[tuple[int, int]] = []
        lines = path.read_bytes().splitlines() if path.exists() else []
        for line in lines:
            if line.startswith(b"start "):
                self.starts.append(float(line.split()[1]))
            elif line.startswith(b"end "):
                self.ends.append(float(line.split()[1]))
            else:
                self.numbers.append((len(self.starts) - 1, int(line)))

    def processed(self) -> list[int]:
        return [number for _, number in self.numbers]


def wait_for(check: Callable[[], bool], what: str, procs: list[Proc], deadline: float) -> None:
    while not check():
        for proc in procs:
            assert proc.alive(), f"{proc.name} exited early\n{proc.output()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


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
        )
        ready = proc.expect(lambda line: bool(line.get("ready")), 30.0)
        assert ready["active"] is (n == 0), "the first registered is the active one"
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
    assert dead.starts[0] < killed_at < alive.starts[0], "the two activations never overlap"
    assert alive.starts[0] - killed_at <= TIMEOUT + 5.0, "taken over within the detection time"
    assert alive.starts[0] - killed_at >= TIMEOUT * 0.9, "after the disconnected timeout"
    assert alive.ends and alive.ends[0] >= alive.starts[0]
