"""Growing a running partitioned stream: `PartitionedProducer.grow` and `GroupMember.grow`.

In one process, with the transport nodes and coordinator clients of test_groups.py standing
for processes (its `World`, `Process` and `wait_until`, imported). The producer's growth is
a barrier: it waits until everything sent before it is confirmed by every group, then
adds the new partitions and routes with the new count, so a key that moves to a new
partition is never handled out of the order sent. No original scenario (Pekko has no
partitioned streams; see docs/partitions.md, "Growth").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery import DeliveryTimeout
from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)
from pykka_delivery.partitions import GroupDelivery, GroupMember, partition_for_key
from tests.harness import wait_until
from tests.partitions.procs import key_for
from tests.partitions.test_groups import KEYS, STREAM, TIMEOUT, WAIT, World


@pytest.fixture
def world() -> Iterator[World]:
    """test_groups.py's world, on a coordinator of its own."""
    settings = CoordinatorSettings(disconnected_timeout=TIMEOUT, recovery_min_delay=TIMEOUT)
    actor = CoordinatorActor.start(settings=settings)
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    made = World(server)
    try:
        yield made
    finally:
        made.close()
        server.stop()
        actor.stop()


@dataclass(frozen=True, slots=True)
class Handled:
    member: str
    partition: int
    number: Any
    key: str


class Record:
    """Every handling of every group, in the one order they happened (across partitions:
    a key's order across a growth spans two partitions)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handled: dict[str, list[Handled]] = {}
        self.held_below = 0  # partitions below it wait for `released` in their handler
        self.released = threading.Event()
        self.holding = threading.Event()  # a handler waits for `released`

    def handler(self, member: str, group: str) -> Callable[[GroupDelivery], None]:
        def handle(delivery: GroupDelivery) -> None:
            if delivery.partition < self.held_below and not self.released.is_set():
                self.holding.set()
                assert self.released.wait(WAIT), "never released"
            entry = Handled(member, delivery.partition, delivery.message, str(delivery.key))
            with self.lock:
                self.handled.setdefault(group, []).append(entry)

        return handle

    def of(self, group: str) -> list[Handled]:
        with self.lock:
            return list(self.handled.get(group, []))

    def count(self, group: str) -> int:
        return len({h.number for h in self.of(group)})


def check_growth(handled: list[Handled], count: int, old: int, new: int) -> None:
    """Every number handled; per key, the first handlings in the order sent; each on its
    key's partition of the old count or the new one, with one boundary for all keys: every
    number on a moved key's old partition comes before every number on a new one."""
    assert {h.number for h in handled} == set(range(count))
    first: dict[str, list[int]] = {}
    seen: set[int] = set()
    for h in handled:
        assert h.key == key_for(h.number, KEYS)
        if h.number not in seen:
            seen.add(h.number)
            first.setdefault(h.key, []).append(h.number)
    for key, numbers in first.items():
        assert numbers == sorted(numbers), f"key {key} handled out of order: {numbers}"
    before, after = [], []
    for h in handled:
        was, now = partition_for_key(h.key, old), partition_for_key(h.key, new)
        assert h.partition in (was, now), h
        if was != now:
            (before if h.partition == was else after).append(h.number)
    assert before and after, "no key moved, or none was sent on both sides of the growth"
    assert max(before) < min(after), "a moved key's new partition overtook its old one"


def test_a_running_stream_grows_from_4_to_8_partitions_keeping_every_message_and_key_order(
    world: World, tmp_path: Path
) -> None:
    """Keyed messages flow on 4 partitions to two groups of two members; the stream grows
    to 8 mid-stream (the producer, then each member). Every message is handled, "billing"
    (dedup store) exactly once, "audit" at least once; per key, in the order sent across
    the growth; the new partitions get messages and are spread by the sticky rule (the
    first member keeps its two and takes two new ones, the second the same)."""
    count, old, new = 2000, 4, 8
    record = Record()
    producer = world.producer(old, ["billing", "audit"])
    dedup = tmp_path / "dedup.db"
    members: dict[str, dict[str, GroupMember]] = {"billing": {}, "audit": {}}
    for name in ("m1", "m2"):
        process = world.process(name)
        for group, of_group in members.items():
            of_group[name] = world.join(
                process,
                group,
                old,
                handler=record.handler(name, group),
                dedup_store=dedup if group == "billing" else None,
            )

    def progress() -> int:
        return min(record.count("billing"), record.count("audit"))

    def grow() -> None:
        assert producer.grow(new, timeout=WAIT) is True
        for name in ("m1", "m2"):
            for of_group in members.values():
                assert of_group[name].grow(new) is True
        grown.set()

    grown = threading.Event()
    world.send(producer, count, rate=1000)
    wait_until(lambda: progress() >= 400, "messages on the first 4 partitions")
    # Hold the old partitions' handlers while the stream grows: without the barrier, the
    # moved keys' next messages would then be handled on the new partitions first.
    record.held_below = old
    assert record.holding.wait(WAIT)
    growing = threading.Thread(target=grow, daemon=True)
    growing.start()
    growing.join(0.3)  # time for a growth without a barrier to finish (none with it)
    record.released.set()
    growing.join(WAIT)
    assert grown.is_set(), "the growth did not finish"
    assert producer.partitions == new
    wait_until(lambda: progress() == count, "every message")
    world.wait_sent()
    producer.wait_confirmed(timeout=WAIT)

    for group, of_group in members.items():
        handled = record.of(group)
        check_growth(handled, count, old, new)
        assert {h.partition for h in handled} == set(range(new)), group
        assert of_group["m1"].owned() == {0, 1, 4, 5}, group
        assert of_group["m2"].owned() == {2, 3, 6, 7}, group
        assert all(m.partitions == new for m in of_group.values())
    assert len(record.of("billing")) == count, "billing (dedup store) handled one twice"
    sent = producer.statistics().sent
    assert len(sent) == new and sum(sent) == count
    assert all(sent[p] > 0 for p in range(old, new)), sent


class Gate:
    def __init__(self) -> None:
        self.open = threading.Event()
        self.entered = threading.Event()

    def handler(self, delivery: GroupDelivery) -> None:
        self.entered.set()
        assert self.open.wait(WAIT), "the gate was never opened"


def test_growth_waits_for_the_confirmation_of_every_message_sent_before_it(
    world: World,
) -> None:
    """A message still in its handler holds the growth: grow times out and changes
    nothing (same count, same routing); once the handler returns, grow succeeds."""
    gate = Gate()
    producer = world.producer(2, ["billing"])
    member = world.join(world.process("m1"), "billing", 2, handler=gate.handler)
    producer.send("held", key="a", timeout=WAIT)
    assert gate.entered.wait(WAIT)

    with pytest.raises(DeliveryTimeout, match="had not confirmed every message"):
        producer.grow(4, timeout=0.3)
    assert producer.partitions == 2
    assert len(producer.statistics().sent) == 2
    with pytest.raises(KeyError):
        producer.producer("billing", 2)

    gate.open.set()
    assert producer.grow(4, timeout=WAIT) is True
    assert producer.producer("billing", 3).producer_id == f"{STREAM}-3:billing"
    member.grow(4)
    key = next(k for k in (f"k{n}" for n in range(100)) if partition_for_key(k, 4) == 3)
    assert producer.send("moved", key=key, timeout=WAIT) == 3
    producer.wait_confirmed(timeout=WAIT)
    wait_until(lambda: sum(member.statistics().handled) == 2, "the two messages counted")
    assert member.statistics().handled[3] == 1


def test_a_shrink_is_refused_and_the_same_count_changes_nothing(world: World) -> None:
    producer = world.producer(4, ["billing"])
    member = world.join(world.process("m1"), "billing", 4)

    with pytest.raises(ValueError, match="cannot shrink from 4 to 2 partitions"):
        producer.grow(2)
    with pytest.raises(ValueError, match="cannot shrink from 4 to 3 partitions"):
        member.grow(3)
    with pytest.raises(ValueError):
        producer.grow(0)
    assert producer.grow(4) is False
    assert member.grow(4) is False
    assert producer.partitions == member.partitions == 4
    assert len(producer.statistics().producers) == 4


def test_producer_and_member_follow_the_catalog_when_the_stream_grows(world: World) -> None:
    """`grow_from_catalog`: after ``create_stream`` with a larger count, the producer and
    the member grow to it, and a key of a new partition is delivered there."""
    record = Record()
    process = world.process("m1")
    process.client.create_stream(STREAM, 2)
    producer = world.producer(2, ["billing"])
    member = world.join(process, "billing", 2, handler=record.handler("m1", "billing"))
    assert producer.grow_from_catalog(process.client, timeout=WAIT) is False

    process.client.create_stream(STREAM, 4)
    assert producer.grow_from_catalog(process.client, timeout=WAIT) is True
    assert member.grow_from_catalog(timeout=WAIT) is True
    key = next(k for k in (f"k{n}" for n in range(100)) if partition_for_key(k, 4) == 2)
    assert producer.send("new", key=key, timeout=WAIT) == 2
    wait_until(lambda: record.count("billing") == 1, "the message on the new partition")
    assert record.of("billing") == [Handled("m1", 2, "new", key)]
    assert member.owned() == {0, 1, 2, 3}
