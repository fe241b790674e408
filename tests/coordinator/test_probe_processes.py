"""Crash, not partition: the active consumer's process SIGKILLed, with the coordinator's
DEFAULT ``disconnected_timeout``, is handed over as soon as the coordinator's probe finds
its node's port refused, long before the timeout. Real processes on 127.0.0.1
(`tests.coordinator.procs`); every process is killed and reaped when the test ends.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pykka_delivery.coordinator import CoordinatorClient, CoordinatorSettings
from tests.coordinator.procs import NAMESPACE, Log, assert_no_overlap
from tests.coordinator.test_service_processes import (  # noqa: F401 - spawn: the fixture
    PROCS,
    PRODUCER,
    Spawn,
    spawn,
    wait_for,
)

pytestmark = pytest.mark.slow

DEFAULT_TIMEOUT = CoordinatorSettings().disconnected_timeout
BOUND = 5.0  # seconds from the kill to the successor's first message: far below the timeout
COUNT = 3_000
THROTTLE = 1_000  # messages/s: the kill lands mid-stream


def test_a_killed_active_consumer_is_replaced_long_before_the_disconnected_timeout(
    spawn: Spawn,  # noqa: F811 - the fixture
    tmp_path: Path,
) -> None:
    assert BOUND <= DEFAULT_TIMEOUT / 4, "the bound must tell a probe from the timeout"
    deadline = time.monotonic() + 60.0
    coordinator = spawn(
        "coordinator", *PROCS, "coordinator", "--disconnected-timeout", str(DEFAULT_TIMEOUT)
    )
    coordinator_address = coordinator.ready()
    producer = spawn("producer", PRODUCER, "--port", "0", "--count", str(COUNT), "--timeout", "60")
    producer_address = producer.ready()
    files = [tmp_path / "consumer-0.txt", tmp_path / "consumer-1.txt"]
    consumers = []
    for n, path in enumerate(files):
        proc = spawn(
            f"consumer {n}",
            *PROCS,
            "consume",
            "--coordinator",
            coordinator_address,
            "--producer",
            producer_address,
            "--file",
            str(path),
            "--name",
            f"consumer-{n}",
            "--throttle",
            str(THROTTLE),
        )
        assert proc.expect(lambda line: bool(line.get("ready")), 30.0)["active"] == [n == 0]
        consumers.append(proc)
    wait_for(lambda: len(Log(files[0]).numbers) >= 200, "the first to consume", consumers, deadline)

    # Read before the kill: the successor may start before this process has reaped it.
    killed_at = time.monotonic()
    consumers[0].kill()

    wait_for(
        lambda: bool(Log(files[1]).numbers),
        "the standby to take over",
        consumers[1:],
        killed_at + BOUND,
    )
    with CoordinatorClient(coordinator_address) as client:
        owners = [c.owner for info in client.list_groups(NAMESPACE) for c in info.consumers]
    assert owners == ["consumer-1"], "the killed consumer left its group"
    dead, alive = Log(files[0]), Log(files[1])
    assert alive.processed()[0] <= dead.processed()[-1] + 1, "nothing lost across the crash"
    assert_no_overlap({"consumer-0": [(dead.starts[0], killed_at)], "consumer-1": alive.intervals})
