"""Many producers of one stream, found through the coordinator, across real processes on
127.0.0.1: producer replicas come, crash, restart and join while a group grows 1 -> 4 -> 2.

A coordinator process (`tests.coordinator.procs`), named producer processes and member
processes (`tests.partitions.replica_procs`). Each producer is a
`PartitionedProducer.from_coordinator` with its own name and SQLite durable queue; each
member a `GroupMember.from_coordinator` given only the coordinator's address and its own
node, which finds the producers in the stream's catalog. The members apply each message
exactly once: its effect row and its position (a `SqliteTxDedupStore` per partition and
activation) commit in one transaction, so the ``effects`` tables are the truth even across
SIGKILLs. The members that leave print their activations; those of the killed one come
from the lines its hooks wrote (an open one ends at the moment of the kill), and the
processes share CLOCK_MONOTONIC, so the activations of different processes are compared
directly. Every process is killed and reaped when the
test ends; every wait is bounded.

Scale: each of p1, p2, p3 sends ``COUNT`` messages at ``RATE`` per second and p4
``LATE_COUNT``, about 20 s of sending, so that every join, kill, restart and leave lands
mid-stream while the whole run stays well under ``BOUND`` (90 s) on the project's
2-core machine shared with other work: nine Python processes, each message one SQLite
transaction. bench/partitions.py measures throughput.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.coordinator import Activity, CoordinatorClient
from tests.coordinator.procs import Interval, assert_no_overlap
from tests.partitions.replica_procs import (
    NAMESPACE,
    Effect,
    count_effects,
    key_of,
    read_activations,
    read_effects,
)
from tests.transport.procs import Proc, left, wait_for

pytestmark = pytest.mark.slow

STREAM, GROUP = "orders", "billing"
PARTITIONS = 8
KEYS = 16
COUNT = 2_000  # messages from each of p1, p2, p3
LATE_COUNT = 600  # from p4, started mid-run
RATE = 100  # messages/s from each producer
WINDOW = 20  # the members' flow-control window
TIMEOUT = 1.0  # the coordinator's disconnected timeout
BOUND = 90.0  # seconds for the whole run, at most
TOTAL = 3 * COUNT + LATE_COUNT


def test_producers_that_crash_restart_and_join_reach_a_scaling_group_exactly_once_in_key_order(
    spawn: Callable[..., Proc], tmp_path: Path
) -> None:
    """Three named producers (p1, p2, p3) on one stream of 8 partitions, and a group
    whose members find them through the coordinator: 1 member, then 4; p2 is SIGKILLed
    and restarted under its name on its durable queue; p4 joins; then m4 is SIGKILLed and
    m3 leaves (-> 2). Every message of every producer is applied exactly once, per
    (producer, key) in the order sent, and no partition ever had two active owners."""
    deadline = time.monotonic() + BOUND
    coordinator = spawn(
        "coordinator",
        *("-m", "tests.coordinator.procs", "coordinator"),
        *("--disconnected-timeout", str(TIMEOUT)),
    )
    address = coordinator.ready(left(deadline))
    common = ("--coordinator", address, "--stream", STREAM, "--partitions", str(PARTITIONS))
    members: dict[str, Proc] = {}
    producers: dict[str, Proc] = {}

    def start_member(name: str) -> Proc:
        members[name] = spawn(
            name,
            *("-m", "tests.partitions.replica_procs", "member", *common, "--name", name),
            *("--group", GROUP, "--dir", str(tmp_path), "--window", str(WINDOW)),
        )
        return members[name]

    def start_producer(name: str, count: int) -> Proc:
        producers[name] = spawn(
            name,
            *("-m", "tests.partitions.replica_procs", "produce", *common, "--name", name),
            *("--group", GROUP, "--durable", str(tmp_path / f"{name}.db")),
            *("--count", str(count), "--rate", str(RATE), "--keys", str(KEYS)),
        )
        return producers[name]

    def ready(*procs: Proc) -> list[dict[str, Any]]:
        return [proc.expect(lambda line: bool(line.get("ready")), left(deadline)) for proc in procs]

    gone: set[str] = set()  # killed or stopped on purpose

    def alive() -> list[Proc]:
        everyone = (coordinator, *producers.values(), *members.values())
        return [proc for proc in everyone if proc.name not in gone]

    def reach(count: int, what: str) -> None:
        wait_for(lambda: count_effects(tmp_path, PARTITIONS) >= count, what, alive(), deadline)

    ready(start_member("m1"))  # it creates the stream
    ready(*(start_producer(name, COUNT) for name in ("p1", "p2", "p3")))
    reach(TOTAL // 10, "m1 to apply from the three producers")
    ready(*(start_member(name) for name in ("m2", "m3", "m4")))
    reach(TOTAL // 4, "four members to apply")

    producers["p2"].kill()  # SIGKILL; restarted under its name on its durable queue
    (restarted,) = ready(start_producer("p2", COUNT))
    ready(start_producer("p4", LATE_COUNT))
    reach(TOTAL // 2, "the restarted p2 and the new p4 to be applied")

    members["m4"].popen.kill()
    killed_at = time.monotonic()  # m4 runs nothing after the signal (reaping it takes longer)
    members["m4"].kill()
    gone.update(("m4", "m3"))
    done = {"m3": stop(members["m3"], deadline)}
    for name, proc in producers.items():
        assert proc.expect(lambda line: bool(line.get("confirmed")), left(deadline)), name
    reach(TOTAL, "every message")
    active = actives(address)
    gone.update(("m1", "m2"))
    for name in ("m1", "m2"):
        done[name] = stop(members[name], deadline)

    effects = read_effects(tmp_path, PARTITIONS)
    check_effects(effects, {"p1": COUNT, "p2": COUNT, "p3": COUNT, "p4": LATE_COUNT})
    assert restarted["start"] > 0, "p2 restarted from nothing: its durable queue was lost"
    assert {e.member for e in effects} == {"m1", "m2", "m3", "m4"}
    assert sorted(done["m1"]["producers"]) == ["p1", "p2", "p3", "p4"], done["m1"]
    check_intervals(done, read_activations(tmp_path / "activations-m4.log"), killed_at)
    owners = sorted(active[p] for p in range(PARTITIONS))
    assert owners == ["m1"] * 4 + ["m2"] * 4, active


def check_effects(effects: Sequence[Effect], sent: dict[str, int]) -> None:
    """Each message of each producer (``sent``: how many) applied exactly once, and per
    (producer, key) in the order sent (`read_effects` lists them in the order applied)."""
    applied = collections.Counter((e.producer, e.key, e.n) for e in effects)
    twice = [what for what, times in applied.items() if times > 1]
    assert twice == [], f"{len(twice)} applied twice, e.g. {twice[:5]}"
    expected = {
        (name, key_of(i, KEYS), i // KEYS) for name, count in sent.items() for i in range(count)
    }
    missing = sorted(expected - set(applied))
    assert missing == [], f"{len(missing)} never applied, the first {missing[:10]}"
    assert set(applied) == expected
    by_key: dict[tuple[str, str], list[int]] = collections.defaultdict(list)
    for effect in effects:
        by_key[effect.producer, effect.key].append(effect.n)
    for (name, key), numbers in by_key.items():
        assert numbers == sorted(numbers), f"{name}'s key {key} applied as {numbers}"


def stop(proc: Proc, deadline: float) -> dict[str, Any]:
    """SIGTERM: the member closes (handing its partitions over) and prints its
    activations."""
    proc.popen.terminate()
    done = proc.expect(lambda line: bool(line.get("done")), left(deadline))
    assert proc.wait(left(deadline)) == 0, proc.output()
    assert done["errors"] == [], done["errors"]
    return done


def actives(address: str) -> dict[int, str]:
    """Per partition, the owner (member name) of its active consumer, as the coordinator
    lists them."""
    with CoordinatorClient(address) as client:
        listed = client.list_groups(NAMESPACE, timeout=10.0)
    found = {}
    for info in listed:
        partition = int(info.group.stream.rsplit("-", 1)[1])
        active = [
            c.owner for c in info.consumers if c.activity is Activity.ACTIVE and c.is_connected
        ]
        found[partition] = active[0] if len(active) == 1 else str(active)
    return found


def check_intervals(
    done: dict[str, dict[str, Any]], killed: dict[int, list[Interval]], killed_at: float
) -> None:
    """No two activations of a partition overlap: those the members that left printed,
    and those of the killed m4 from its hooks' lines, open ones ending at the kill."""
    assert killed, "m4 wrote no activation"
    for partition in range(PARTITIONS):
        spans: dict[str, list[Interval]] = {
            name: [(start, end) for start, end in lines["intervals"].get(str(partition), [])]
            for name, lines in done.items()
        }
        spans["m4"] = [
            (start, killed_at if end is None else end) for start, end in killed.get(partition, [])
        ]
        assert all(start < killed_at for start, _ in spans["m4"])
        assert_no_overlap(spans)
