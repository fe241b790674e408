"""Partitioned producers and consumer groups, in one process.

One coordinator server, and transport nodes with their own `CoordinatorClient` standing
for processes (as tests/coordinator/test_service_registry.py does): a producer "process"
with a `PartitionedProducer`, and member "processes" each with a `GroupMember` per group.
Handlers record what they handle in a `Ledger`; the checks are those of the process test
(`tests.partitions.procs.check_group`): every message handled, each partition in order and
without gaps, per-key order kept, and the activations of each partition never overlapping.
A "crash" here stops a member's node (its Acks are lost) and drops its coordinator
connection without goodbye; the real SIGKILL is in test_group_processes.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pykka_delivery import (
    Consumer,
    ConsumerControllerSettings,
    DeliveryTimeout,
    Producer,
    ProducerControllerSettings,
)
from pykka_delivery.coordinator import (
    ActivationInterval,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)
from pykka_delivery.delivery.core.consumer import ConsumerCore
from pykka_delivery.delivery.messages import Confirmed, Delivery, ProducerStart, RequestNext
from pykka_delivery.delivery.stores.dedup import (
    DedupStore,
    DedupStoreError,
    MemoryDedupStore,
    SqliteDedupSettings,
    SqliteDedupStore,
)
from pykka_delivery.delivery.stores.dedup_postgres import PostgresDedupStore
from pykka_delivery.partitions import (
    KEYED_MESSAGE_NAME,
    GroupDelivery,
    GroupMember,
    GroupMemberSettings,
    PartitionedProducer,
    PartitionedProducerSettings,
    load_config,
    partition_for_key,
    partition_stream,
    producer_id,
)
from pykka_delivery.partitions._member_parts import dedup_factory
from pykka_delivery.partitions.envelope import unwrap, wrap
from pykka_delivery.protocol.messages import (
    Ack,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
)
from pykka_delivery.protocol.serialization import default_serialization
from pykka_delivery.transport import Node
from tests.coordinator.procs import assert_no_overlap
from tests.harness import FakeClock, Probe, consumer_driver, producer_driver, wait_until
from tests.partitions.procs import Entry, check_group, key_for

WAIT = 20.0  # the most any wait lasts
TIMEOUT = 0.5  # the coordinator's disconnected timeout
NAMESPACE = "test"
STREAM = "orders"
WINDOW = 20
KEYS = 40
FAST_CLIENT = CoordinatorClientSettings(
    reconnect_backoff_min=0.01, reconnect_backoff_max=0.1, request_timeout=WAIT
)
MEMBER_SETTINGS = GroupMemberSettings(
    consumer=ConsumerControllerSettings(
        flow_control_window=WINDOW, resend_interval_min=0.1, resend_interval_max=0.5
    ),
    close_grace=5.0,
    retry_backoff_min=0.01,
    retry_backoff_max=0.05,
    registration_timeout=WAIT,
)
PRODUCER_SETTINGS = PartitionedProducerSettings(
    producer=ProducerControllerSettings(resend_first_interval=0.1)
)


# --- fixtures and helpers ------------------------------------------------------------------


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[CoordinatorServer]:
    """The coordinator; its partition assignment is the indirect parameter, if any."""
    settings = CoordinatorSettings(
        disconnected_timeout=TIMEOUT,
        recovery_min_delay=TIMEOUT,
        partition_assignment=getattr(request, "param", "sticky"),
    )
    actor = CoordinatorActor.start(settings=settings)
    server = CoordinatorServer(actor, CoordinatorServerSettings()).start()
    yield server
    server.stop()
    actor.stop()


class Process:
    """What one member process would hold: a node, a coordinator client, its members."""

    def __init__(self, name: str, coordinator: str) -> None:
        self.name = name
        self.node = Node().start()
        self.client = CoordinatorClient(
            coordinator, node=self.node.address, owner=name, settings=FAST_CLIENT
        )
        self.members: dict[str, GroupMember] = {}

    def crash(self) -> None:
        """Die as a killed process would, as far as the others can tell: its Acks and
        Requests are lost with its node, and its connection ends without goodbye."""
        self.node.stop()
        self.client.close(goodbye=False)

    def close(self) -> None:
        for member in self.members.values():
            member.close(grace=0.5)
        self.client.close()
        self.node.stop()


class Ledger:
    """What the handlers handled, per group and partition, in the order handled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, dict[int, list[Entry]]] = {}

    def handler(self, process: str, group: str) -> Callable[[GroupDelivery], None]:
        def handle(delivery: GroupDelivery) -> None:
            assert delivery.group == group and delivery.stream == STREAM
            assert delivery.producer_id == producer_id(STREAM, delivery.partition, group)
            entry = Entry(process, delivery.seq_nr, delivery.message, str(delivery.key))
            with self.lock:
                self.entries.setdefault(group, {}).setdefault(delivery.partition, []).append(entry)

        return handle

    def of(self, group: str) -> dict[int, list[Entry]]:
        with self.lock:
            return {p: list(e) for p, e in self.entries.get(group, {}).items()}

    def handled(self, group: str) -> int:
        with self.lock:
            return len({e.number for es in self.entries.get(group, {}).values() for e in es})


class World:
    """The coordinator, a producer node, member processes; everything closed at the end."""

    def __init__(self, server: CoordinatorServer) -> None:
        self.server = server
        self.producer_node = Node().start()
        self.processes: list[Process] = []
        self.producers: list[PartitionedProducer] = []
        self.ledger = Ledger()
        self.senders: list[threading.Thread] = []
        self.send_errors: list[BaseException] = []

    def producer(self, partitions: int, groups: list[str], **kw: Any) -> PartitionedProducer:
        kw.setdefault("settings", PRODUCER_SETTINGS)
        producer = PartitionedProducer(STREAM, partitions, groups, node=self.producer_node, **kw)
        self.producers.append(producer)
        return producer

    def process(self, name: str) -> Process:
        process = Process(name, self.server.address)
        self.processes.append(process)
        return process

    def join(
        self,
        process: Process,
        group: str,
        partitions: int,
        handler: Callable[[GroupDelivery], None] | None = None,
        **kw: Any,
    ) -> GroupMember:
        kw.setdefault("settings", MEMBER_SETTINGS)
        member = GroupMember(
            process.client,
            STREAM,
            partitions,
            group,
            producer=self.producer_node.address,
            handler=handler or self.ledger.handler(process.name, group),
            node=process.node,
            namespace=NAMESPACE,
            **kw,
        )
        process.members[group] = member
        return member

    def send(self, producer: PartitionedProducer, count: int, rate: float = 0.0) -> None:
        """Send 0 .. count-1 from a thread, number n with key ``key_for(n, KEYS)``."""

        def run() -> None:
            started = time.monotonic()
            try:
                for number in range(count):
                    if rate:
                        ahead = started + number / rate - time.monotonic()
                        if ahead > 0:
                            time.sleep(ahead)
                    producer.send(number, key=key_for(number, KEYS), timeout=WAIT)
            except BaseException as error:
                self.send_errors.append(error)
                raise

        sender = threading.Thread(target=run, daemon=True)
        sender.start()
        self.senders.append(sender)

    def wait_sent(self) -> None:
        for sender in self.senders:
            sender.join(WAIT)
            assert not sender.is_alive(), "the sender did not finish"
        assert not self.send_errors, self.send_errors

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(Exception):
                process.close()
        for producer in self.producers:
            producer.close()
        self.producer_node.stop()


@pytest.fixture
def world(server: CoordinatorServer) -> Iterator[World]:
    made = World(server)
    try:
        yield made
    finally:
        made.close()


def check_no_overlap(members: dict[str, GroupMember], partitions: int) -> None:
    """No partition ever had two active consumers, from the recorded intervals."""
    for partition in range(partitions):
        spans: dict[str, list[tuple[float, float | None]]] = {
            name: [(i.start, i.end) for i in member.intervals()[partition]]
            for name, member in members.items()
        }
        assert_no_overlap(spans)


def numbers(entries: list[Entry]) -> list[int]:
    return [e.number for e in entries]


# --- naming, the envelope, settings ----------------------------------------------------------


def test_producer_ids_and_partition_streams_tell_every_stream_partition_and_group_apart() -> None:
    names = [
        (stream, partition, group)
        for stream in ("a", "a-1", "a-1-0", "a.b")
        for partition in (0, 1, 10)
        for group in ("x", "1-x", "0-x", "p2.x")
    ]

    ids = {producer_id(*name) for name in names}
    streams = {partition_stream(stream, p) for stream, p, _ in names}

    assert len(ids) == len(names)
    assert len(streams) == 4 * 3
    assert producer_id("orders", 3, "billing") == "orders-3:billing"
    assert partition_stream("orders", 3) == "orders-3"


@pytest.mark.parametrize("key", [None, "customer-7", b"\x00\xffkey", ""])
@pytest.mark.parametrize("message", [b"bytes", "text", {"order": 42, "lines": [1, 2]}, 7])
def test_a_keyed_message_crosses_the_wire_with_its_key(key: Any, message: Any) -> None:
    wrapped = wrap(message, key)
    serializer_id, manifest, data = default_serialization.serialize(wrapped)

    read = default_serialization.deserialize(serializer_id, manifest, data)

    assert manifest == KEYED_MESSAGE_NAME
    assert unwrap(read) == (key, message)


def test_a_message_not_wrapped_is_delivered_as_it_is_without_a_key() -> None:
    assert unwrap({"plain": True}) == (None, {"plain": True})


@pytest.mark.parametrize(
    ("build", "setting"),
    [
        (lambda: GroupMemberSettings(close_grace=-1), "close_grace"),
        (lambda: GroupMemberSettings(retry_backoff_min=0), "retry_backoff_min"),
        (lambda: GroupMemberSettings(retry_backoff_max=0.01), "retry_backoff_max"),
        (lambda: GroupMemberSettings(registration_timeout=float("inf")), "registration_timeout"),
        (lambda: GroupMemberSettings(close_timeout=4000), "close_timeout"),
        (lambda: PartitionedProducerSettings(run_length=0), "run_length"),
    ],
)
def test_settings_refuse_values_out_of_range_naming_the_setting(
    build: Callable[[], object], setting: str
) -> None:
    with pytest.raises(ValueError, match=setting):
        build()


def test_a_producer_refuses_a_bad_stream_group_list_or_partition_count() -> None:
    with pytest.raises(ValueError, match="at least one consumer group"):
        PartitionedProducer(STREAM, 2, [])
    with pytest.raises(ValueError, match="listed twice"):
        PartitionedProducer(STREAM, 2, ["a", "a"])
    with pytest.raises(ValueError, match="write \\['billing'\\]"):
        PartitionedProducer(STREAM, 2, "billing")
    with pytest.raises(ValueError, match="not valid"):
        PartitionedProducer("orders:v1", 2, ["a"])
    with pytest.raises(ValueError, match="partitions"):
        PartitionedProducer(STREAM, 0, ["a"])


# --- the partitioned producer, without a coordinator -----------------------------------------


def plain_consumers(
    producer: PartitionedProducer, settings: ConsumerControllerSettings | None = None
) -> dict[tuple[str, int], Consumer]:
    """A plain `Consumer` registered to every (group, partition) producer."""
    consumers = {}
    for group in producer.groups:
        for partition in range(producer.partitions):
            consumer = Consumer(settings)
            consumer.register_to(producer.ref(group, partition))
            consumers[group, partition] = consumer
    return consumers


def test_a_send_reaches_every_group_on_the_partition_of_its_key() -> None:
    producer = PartitionedProducer(STREAM, 4, ["billing", "audit"])
    consumers = plain_consumers(producer)

    partition = producer.send({"order": 1}, key="customer-7", timeout=WAIT)

    assert partition == partition_for_key("customer-7", 4)
    for group in ("billing", "audit"):
        delivery = consumers[group, partition].receive(timeout=WAIT)
        assert unwrap(delivery.message) == ("customer-7", {"order": 1})
        assert delivery.producer_id == producer_id(STREAM, partition, group)
        delivery.confirm()
        for other in set(range(4)) - {partition}:
            with pytest.raises(DeliveryTimeout):
                consumers[group, other].receive(timeout=0.05)
    producer.close()
    for consumer in consumers.values():
        consumer.close()


def test_a_send_that_times_out_reaches_no_group_and_holds_only_its_partition() -> None:
    """Flow control: group "audit" has no consumer of partition 0, so a message for
    partition 0 waits for it and, timing out, is sent to no group; partition 1 flows."""
    producer = PartitionedProducer(STREAM, 2, ["billing", "audit"])
    billing = {p: Consumer() for p in range(2)}
    for p, consumer in billing.items():
        consumer.register_to(producer.ref("billing", p))
    audit_1 = Consumer()
    audit_1.register_to(producer.ref("audit", 1))
    key_0 = next(f"k{n}" for n in range(100) if partition_for_key(f"k{n}", 2) == 0)
    key_1 = next(f"k{n}" for n in range(100) if partition_for_key(f"k{n}", 2) == 1)

    with pytest.raises(DeliveryTimeout, match="group 'audit' had no room"):
        producer.send("held", key=key_0, timeout=0.2)
    producer.send("flows", key=key_1, timeout=WAIT)

    assert unwrap(billing[1].receive(timeout=WAIT).message) == (key_1, "flows")
    assert unwrap(audit_1.receive(timeout=WAIT).message) == (key_1, "flows")
    with pytest.raises(DeliveryTimeout):
        billing[0].receive(timeout=0.2)
    assert producer.statistics().sent == (0, 1)
    assert producer.producer("billing", 0).snapshot().current_seq_nr == 1, "nothing numbered"
    producer.close()


def test_unkeyed_messages_go_round_robin_over_the_partitions() -> None:
    producer = PartitionedProducer(STREAM, 3, ["billing"], start=1)
    consumers = plain_consumers(producer)

    placed = []
    for n in range(7):
        placed.append(producer.send(n, timeout=WAIT))
        delivery = consumers["billing", placed[-1]].receive(timeout=WAIT)
        assert unwrap(delivery.message) == (None, n)
        delivery.confirm()  # the consumer asks for more only when its first is confirmed

    assert placed == [1, 2, 0, 1, 2, 0, 1]
    assert producer.statistics().sent == (2, 3, 2)
    for consumer in consumers.values():
        consumer.close()
    producer.close()


def test_a_closed_producer_leaves_its_names_on_the_node_to_the_next_one() -> None:
    node = Node().start()
    try:
        first = PartitionedProducer(STREAM, 2, ["billing"], node=node)
        with pytest.raises(ValueError, match="already exposed"):
            PartitionedProducer(STREAM, 2, ["billing"], node=node)
        first.close()

        second = PartitionedProducer(STREAM, 2, ["billing"], node=node)

        assert second.ref("billing", 1).path == f"{node.address}/orders-1:billing"  # type: ignore[attr-defined]
        second.close()
    finally:
        node.stop()


def test_a_producer_and_a_member_take_partitions_and_groups_from_the_config() -> None:
    config = load_config(
        "[streams.orders]\npartitions = 3\n[streams.other]\npartitions = 1\n"
        '[groups.billing]\nstreams = ["orders"]\n[groups.audit]\nstreams = ["orders", "other"]\n'
        '[groups.lonely]\nstreams = ["other"]\n'
    )

    producer = PartitionedProducer.from_config(config, "orders")

    assert (producer.partitions, producer.groups) == (3, ("billing", "audit"))
    producer.close()
    with pytest.raises(ValueError, match="does not follow stream 'orders'"):
        GroupMember.from_config(
            config,
            "orders",
            "lonely",
            None,
            producer="x:1",
            handler=print,  # type: ignore[arg-type]
        )


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where a member's or a producer's stores live: an SQLite file's path, or the
    ``postgresql://`` URL of a database."""
    if request.param == "postgres":
        url: str = request.getfixturevalue("postgres_url")
        return url
    return tmp_path / "stores.db"


def dedup_store(where: Path | str, consumer_id: str) -> DedupStore:
    if isinstance(where, str):
        return PostgresDedupStore(where, consumer_id)
    return SqliteDedupStore(where, consumer_id)


def test_a_restarted_producer_resends_from_its_durable_queue_what_no_group_confirmed(
    where: Path | str,
) -> None:
    """DurableProducerControllerSpec "load initial state and resend unconfirmed", for
    every (group, partition) queue in one SQLite file or PostgreSQL database: what the
    consumers confirmed is not sent again, the rest is, with the same seq_nrs, and
    numbering continues."""
    path = where
    groups = ["billing", "audit"]
    first = PartitionedProducer(STREAM, 2, groups, durable_queue=path, start=0)
    consumers = plain_consumers(first)
    for n in range(6):  # unkeyed, round robin: 0, 2, 4 on partition 0; 1, 3, 5 on 1
        partition = first.send(n, timeout=WAIT)
        if n < 2:  # each consumer confirms its first message only (which opens its window)
            for group in groups:
                consumers[group, partition].receive(timeout=WAIT).confirm()
    for consumer in consumers.values():
        consumer.close()  # acks what each confirmed
    wait_until(
        lambda: all(
            first.producer(g, p).snapshot().confirmed_seq_nr == 1 for g in groups for p in (0, 1)
        ),
        "the acks to arrive",
    )
    first.close()

    second = PartitionedProducer(STREAM, 2, groups, durable_queue=path, start=0)
    consumers = plain_consumers(second)

    def take(group: str, partition: int, count: int) -> list[tuple[int, object]]:
        got = []
        for _ in range(count):
            delivery = consumers[group, partition].receive(timeout=WAIT)
            got.append((delivery.seq_nr, unwrap(delivery.message)[1]))
            delivery.confirm()
        return got

    for group in groups:
        assert take(group, 0, 2) == [(2, 2), (3, 4)]
        assert take(group, 1, 2) == [(2, 3), (3, 5)]
    assert second.send(6, timeout=WAIT) == 0
    for group in groups:
        assert take(group, 0, 1) == [(4, 6)], "numbering continues"
    for consumer in consumers.values():
        consumer.close()
    second.close()


# --- group members on the coordinator ----------------------------------------------------------


def test_one_member_handles_every_partition_and_sees_keys_and_partitions(world: World) -> None:
    producer = world.producer(8, ["billing"])
    process = world.process("m1")
    member = world.join(process, "billing", 8)

    world.send(producer, 800)
    wait_until(lambda: world.ledger.handled("billing") == 800, "every message")
    world.wait_sent()

    check_group(world.ledger.of("billing"), 8, 800, KEYS)
    assert member.owned() == frozenset(range(8))
    producer.wait_confirmed(timeout=WAIT)
    wait_until(lambda: sum(member.statistics().handled) == 800, "the counters to catch up")


def test_a_second_member_takes_the_upper_half_by_the_sticky_rule(world: World) -> None:
    """1 -> 2 members, sticky (the default): the first keeps its lowest four partitions,
    never stopped; the upper four move to the newcomer by step-down."""
    producer = world.producer(8, ["billing"])
    first = world.join(world.process("m1"), "billing", 8)
    world.send(producer, 3000, rate=3000)
    wait_until(lambda: world.ledger.handled("billing") >= 500, "the first member to consume")

    second = world.join(world.process("m2"), "billing", 8)
    wait_until(lambda: second.owned() == {4, 5, 6, 7}, "the upper half to move")
    wait_until(lambda: world.ledger.handled("billing") == 3000, "every message")
    world.wait_sent()

    report = check_group(world.ledger.of("billing"), 8, 3000, KEYS)
    assert first.owned() == {0, 1, 2, 3}
    assert first.statistics().activations == (1,) * 8
    assert second.statistics().activations == (0,) * 4 + (1,) * 4
    assert all(report.runs[p] == ["m1"] for p in (0, 1, 2, 3))
    check_no_overlap({"m1": first, "m2": second}, 8)


@pytest.mark.parametrize("server", ["modulo"], indirect=True)
def test_a_second_member_takes_only_the_partitions_the_modulo_rule_moves(world: World) -> None:
    """1 -> 2 members: the odd partitions move to the newcomer by step-down; the even ones
    keep their first activation, never stopped."""
    producer = world.producer(8, ["billing"])
    first = world.join(world.process("m1"), "billing", 8)
    world.send(producer, 3000, rate=3000)
    wait_until(lambda: world.ledger.handled("billing") >= 500, "the first member to consume")

    second = world.join(world.process("m2"), "billing", 8)
    wait_until(lambda: second.owned() == {1, 3, 5, 7}, "the odd partitions to move")
    wait_until(lambda: world.ledger.handled("billing") == 3000, "every message")
    world.wait_sent()

    report = check_group(world.ledger.of("billing"), 8, 3000, KEYS)
    assert first.owned() == {0, 2, 4, 6}
    assert first.statistics().activations == (1,) * 8
    assert second.statistics().activations == (0, 1) * 4
    assert all(report.runs[p] == ["m1"] for p in (0, 2, 4, 6))
    check_no_overlap({"m1": first, "m2": second}, 8)


def test_without_spread_the_first_member_takes_every_partition_and_the_next_stands_by(
    world: World,
) -> None:
    """spread=False (the Spark source's standby queries): every partition is a simple
    group, so the first member consumes all of them, the second none; when the first
    leaves, the second takes every partition and goes on from what was unconfirmed."""
    producer = world.producer(4, ["billing"])
    first = world.join(world.process("m1"), "billing", 4, spread=False)
    second = world.join(world.process("m2"), "billing", 4, spread=False)
    world.send(producer, 2000, rate=3000)
    wait_until(lambda: world.ledger.handled("billing") >= 500, "the first member to consume")
    assert first.owned() == {0, 1, 2, 3}
    assert second.owned() == frozenset()

    first.close()
    wait_until(lambda: second.owned() == {0, 1, 2, 3}, "the standby to take every partition")
    wait_until(lambda: world.ledger.handled("billing") >= 2000, "every message")
    world.wait_sent()
    report = check_group(world.ledger.of("billing"), 4, 2000, KEYS)
    assert all(report.runs[p] == ["m1", "m2"] for p in range(4))
    check_no_overlap({"m1": first, "m2": second}, 4)


def test_two_groups_on_one_stream_each_get_every_message(world: World) -> None:
    producer = world.producer(4, ["billing", "audit"])
    one, two = world.process("m1"), world.process("m2")
    for process in (one, two):
        world.join(process, "billing", 4)
    world.join(one, "audit", 4)

    world.send(producer, 1000)
    wait_until(lambda: world.ledger.handled("billing") == 1000, "billing to get everything")
    wait_until(lambda: world.ledger.handled("audit") == 1000, "audit to get everything")
    world.wait_sent()

    for group in ("billing", "audit"):
        check_group(world.ledger.of(group), 4, 1000, KEYS)
    # Sticky (the default): the first member keeps the lower half, the second takes the rest.
    assert one.members["billing"].owned() == {0, 1}
    assert two.members["billing"].owned() == {2, 3}
    assert one.members["audit"].owned() == {0, 1, 2, 3}


class Gate:
    """A handler that records like the ledger's, but holds message ``hold`` until opened."""

    def __init__(self, world: World, process: str, hold: int) -> None:
        self.record = world.ledger.handler(process, "billing")
        self.hold = hold
        self.reached = threading.Event()
        self.opened = threading.Event()
        self.finished = threading.Event()

    def __call__(self, delivery: GroupDelivery) -> None:
        if delivery.message == self.hold:
            self.reached.set()
            assert self.opened.wait(WAIT)
            self.record(delivery)
            self.finished.set()
        else:
            self.record(delivery)


def test_close_lets_the_handler_in_flight_finish_before_the_partition_moves(
    world: World,
) -> None:
    """Runnel's graceful leave: the member's delivery in flight is handled and confirmed
    within the grace, and only then does the next member start, after it."""
    producer = world.producer(1, ["billing"])
    gate = Gate(world, "m1", hold=100)
    first = world.join(world.process("m1"), "billing", 1, handler=gate)
    second = world.join(world.process("m2"), "billing", 1)
    world.send(producer, 300)
    assert gate.reached.wait(WAIT)

    closing = threading.Thread(target=first.close, daemon=True)
    closing.start()
    closing.join(0.3)
    assert closing.is_alive(), "close waits for the handler in flight"
    assert numbers(world.ledger.of("billing")[0]) == list(range(100)), "nobody took over"
    gate.opened.set()
    closing.join(WAIT)
    assert not closing.is_alive()

    wait_until(lambda: world.ledger.handled("billing") == 300, "the next member to finish")
    world.wait_sent()
    entries = world.ledger.of("billing")[0]
    assert numbers(entries) == list(range(300)), "handled once each, in order"
    assert {e.member for e in entries[101:]} == {"m2"}
    check_no_overlap({"m1": first, "m2": second}, 1)


def test_a_handler_still_running_after_the_grace_leaves_its_message_to_the_next_member(
    world: World,
) -> None:
    """Past the grace the member leaves anyway; the message in its handler was not
    confirmed, so the next member gets it (at least once: it is handled twice)."""
    producer = world.producer(1, ["billing"])
    gate = Gate(world, "m1", hold=50)
    first = world.join(world.process("m1"), "billing", 1, handler=gate)
    world.join(world.process("m2"), "billing", 1)
    world.send(producer, 100)
    assert gate.reached.wait(WAIT)

    first.close(grace=0.1)
    wait_until(lambda: world.ledger.handled("billing") == 100, "the next member to finish")
    gate.opened.set()
    assert gate.finished.wait(WAIT)
    world.wait_sent()

    entries = world.ledger.of("billing")[0]
    assert [(e.member, e.number) for e in entries[50:52]] == [("m2", 50), ("m2", 51)]
    assert entries[-1] == Entry("m1", 51, 50, key_for(50, KEYS)), "finished late, not confirmed"
    check_group({0: entries[:-1]}, 1, 100, KEYS)


def test_a_failing_handler_is_called_again_with_the_same_delivery(world: World) -> None:
    producer = world.producer(2, ["billing"])
    calls: list[int] = []
    record = world.ledger.handler("m1", "billing")

    def flaky(delivery: GroupDelivery) -> None:
        calls.append(delivery.message)
        if delivery.message == 7 and calls.count(7) <= 2:
            raise RuntimeError("a passing failure")
        record(delivery)

    member = world.join(world.process("m1"), "billing", 2, handler=flaky)
    world.send(producer, 40)
    wait_until(lambda: world.ledger.handled("billing") == 40, "every message")
    world.wait_sent()

    check_group(world.ledger.of("billing"), 2, 40, KEYS)
    assert calls.count(7) == 3
    assert member.statistics().handler_failures == 2
    wait_until(lambda: sum(member.statistics().handled) == 40, "the counters to catch up")


def test_a_new_active_consumer_continues_from_what_the_crashed_one_left_unconfirmed(
    world: World,
) -> None:
    """The producer is never told who is active: the next member registers itself when it
    is activated, and the producer resends from the first message not confirmed (here
    some that the crashed member handled but whose confirmations died with it)."""
    producer = world.producer(1, ["billing"])
    one, two = world.process("m1"), world.process("m2")
    first = world.join(one, "billing", 1)
    second = world.join(two, "billing", 1)
    world.send(producer, 2000, rate=4000)
    wait_until(lambda: world.ledger.handled("billing") >= 300, "the first member to consume")

    one.crash()
    crashed_at = time.monotonic()
    wait_until(lambda: world.ledger.handled("billing") == 2000, "the second member to finish")
    world.wait_sent()

    entries = world.ledger.of("billing")[0]
    report = check_group({0: entries}, 1, 2000, KEYS)
    last_first = max(e.seq_nr for e in entries if e.member == "m1")
    first_second = next(e.seq_nr for e in entries if e.member == "m2")
    assert report.runs[0] == ["m1", "m2"]
    assert first_second <= last_first + 1, "resent from the first unconfirmed message"
    assert report.duplicate_count <= WINDOW, "at most a window handled twice"
    assert second.intervals()[0][0].start >= crashed_at
    check_no_overlap({"m1": first, "m2": second}, 1)


class HeldRef:
    """A producer's self ref that can hold what the consumer side tells it, and let it
    through later (a slow link from a consumer that has stopped)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.holding = False
        self.held: list[Any] = []

    def tell(self, message: Any) -> None:
        if self.holding:
            self.held.append(message)
        else:
            self.inner.tell(message)

    def release(self) -> None:
        held, self.held = self.held, []
        for message in held:
            self.inner.tell(message)


def test_a_late_ack_of_the_previous_consumer_does_not_stall_the_next_one() -> None:
    """The hand-over's one race: the stopping consumer's last Ack travels on its own link,
    the next consumer's registration on another. Arriving after the registration, the Ack
    makes the producer drop seq_nrs 3 although the new session began at 2; the new
    consumer asks for 3, which the producer no longer has. Before the fix it resent from 4,
    which the consumer dropped waiting for 3, for ever (the in-process scaling run hit it
    under load); now the producer marks 4 first and the consumer starts over there."""
    settings = ConsumerControllerSettings(
        flow_control_window=10, resend_interval_min=0.05, resend_interval_max=0.1
    )
    refs: list[HeldRef] = []
    producer = Producer(
        "p",
        ProducerControllerSettings(resend_first_interval=0.05),
        self_ref_factory=lambda endpoint: refs.append(HeldRef(endpoint)) or refs[-1],
    )
    old = Consumer(settings)
    old.register_to(producer.ref)
    producer.send(1, timeout=WAIT)
    old.receive(timeout=WAIT).confirm()
    for n in range(2, 6):
        producer.send(n, timeout=WAIT)
    wait_until(lambda: producer.snapshot().confirmed_seq_nr == 1, "the first confirmation")
    refs[0].holding = True
    for _ in range(2):
        old.receive(timeout=WAIT).confirm()
    old.close()  # its Ack(3) is held
    refs[0].holding = False

    new = Consumer(settings)
    new.register_to(producer.ref)
    wait_until(lambda: producer.snapshot().first_seq_nr == 2, "the new session to begin")
    refs[0].release()
    got: list[int] = []
    while not got or got[-1] < 5:  # 2, 3, 4, 5; or 2, 4, 5 (3 was confirmed): no stall
        delivery = new.receive(timeout=1.0)
        got.append(delivery.seq_nr)
        delivery.confirm()

    assert got == [2, 4, 5], "3 was confirmed by the consumer before"
    new.close()
    producer.close()


def test_a_resend_from_below_the_unconfirmed_head_resends_the_head_marked_first() -> None:
    """ProducerCore: the seq_nrs asked for were confirmed (by an earlier consumer), so
    they cannot be resent: the head goes out marked first, for the consumer to restart."""
    clock = FakeClock()
    driver, _, producer = producer_driver(clock, "p")
    consumer = Probe("consumer")
    driver.feed(ProducerStart(producer))
    driver.feed(RegisterConsumer(consumer))
    for n in range(1, 6):
        producer.expect_type(RequestNext).send_next_to.tell(n)
        if n == 1:
            driver.feed(Request(1, 10, True, False))
    consumer.drain()
    driver.feed(Ack(3))

    driver.feed(Resend(2))

    resent = consumer.drain()
    assert [(m.seq_nr, m.first) for m in resent] == [(4, True), (5, False)]


def test_a_first_message_past_the_one_asked_for_restarts_a_resending_consumer() -> None:
    """ConsumerCore: waiting for 3 (it asked for it), a first-marked 4 from the same
    producer controller starts the session again at 4 instead of being dropped."""
    clock = FakeClock()
    driver, _ = consumer_driver(clock)
    core = driver.core
    assert isinstance(core, ConsumerCore)
    consumer, pc = Probe("consumer"), Probe("producer-controller")
    driver.apply(core.on_start(consumer))
    driver.feed(SequencedMessage("p", 1, "m1", True, False, pc))
    consumer.expect_type(Delivery).confirm_to.tell(Confirmed())
    driver.feed(SequencedMessage("p", 2, "m2", False, False, pc))
    consumer.expect_type(Delivery).confirm_to.tell(Confirmed())
    driver.feed(SequencedMessage("p", 4, "m4", False, False, pc))  # 3 missing: Resend(3)
    assert Resend(3) in pc.drain()
    consumer.expect_no_message()

    driver.feed(SequencedMessage("p", 4, "m4", True, False, pc))

    delivery = consumer.expect_type(Delivery)
    assert (delivery.seq_nr, delivery.message) == (4, "m4")


def test_a_postgresql_url_keeps_every_queue_of_the_producer_in_that_database(
    postgres_url: str,
) -> None:
    producer = PartitionedProducer(STREAM, 2, ["billing", "audit"], durable_queue=postgres_url)
    producer.close()

    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT producer_id FROM durable_producer ORDER BY 1").fetchall()
    assert [pid for (pid,) in rows] == sorted(
        producer_id(STREAM, p, g) for p in (0, 1) for g in ("billing", "audit")
    )


def test_a_postgresql_url_dedup_store_takes_the_members_flush_every_and_lock_timeout(
    postgres_url: str,
) -> None:
    settings = SqliteDedupSettings(flush_every=1, lock_timeout=0.5)

    make = dedup_factory(postgres_url, settings, STREAM, "billing", 1)
    assert make is not None
    store = make()

    assert isinstance(store, PostgresDedupStore)
    assert store.consumer_id == producer_id(STREAM, 1, "billing")
    assert (store.settings.flush_every, store.settings.lock_timeout) == (1, 0.5)
    store.close()


def test_with_a_dedup_store_messages_at_or_below_the_stored_position_are_not_handled(
    world: World, where: Path | str
) -> None:
    """The group's progress on a partition is the store's position for its producer id
    (in an SQLite file or a PostgreSQL database): a new member continues after it. A
    stream that restarts below it (here from seq_nr 1) is confirmed without being
    handled, and the position is never moved back."""
    path = where
    for partition, position in ((0, 5), (1, 50)):
        pid = producer_id(STREAM, partition, "billing")
        store = dedup_store(path, pid)
        store.record(pid, position)
        store.close()
    producer = world.producer(2, ["billing"], start=0)
    member = world.join(world.process("m1"), "billing", 2, dedup_store=path)

    for n in range(20):  # unkeyed, round robin: even numbers on 0, odd on 1
        producer.send(n, timeout=WAIT)
    producer.wait_confirmed(timeout=WAIT)
    member.close()

    entries = world.ledger.of("billing")
    assert [e.seq_nr for e in entries[0]] == [6, 7, 8, 9, 10]
    assert numbers(entries[0]) == [10, 12, 14, 16, 18]
    assert 1 not in entries, "partition 1: everything at or below position 50"
    positions = {}
    for partition in (0, 1):
        pid = producer_id(STREAM, partition, "billing")
        store = dedup_store(path, pid)
        positions[partition] = store.load()[pid]
        store.close()
    assert positions == {0: 10, 1: 50}


class FlakyStores:
    """A dedup store per activation, in memory, sharing what was flushed: the first
    ``failed_opens`` fail to open, and recording ``fail_seq_nr`` fails every attempt once."""

    def __init__(self, failed_opens: int, fail_seq_nr: int) -> None:
        self.positions: dict[str, int] = {}
        self.opened = 0
        self.failed_opens = failed_opens
        self.fail_seq_nr = fail_seq_nr
        self.record_failures = 0
        self.stores: list[MemoryDedupStore] = []

    def __call__(self, partition: int) -> MemoryDedupStore:
        self.opened += 1
        if self.opened <= self.failed_opens:
            msg = "injected: cannot open"
            raise DedupStoreError(msg)
        if self.stores:
            self.positions = dict(self.stores[-1].positions)
        store = MemoryDedupStore(self.positions, fail_when=self.fail_when)
        self.stores.append(store)
        return store

    def fail_when(self, op: str, arg: object) -> bool:
        if op == "record" and isinstance(arg, tuple) and arg[1] == self.fail_seq_nr:
            self.record_failures += 1
            return self.record_failures <= 3  # every attempt of the first confirmation
        return False


def test_a_partition_whose_dedup_store_fails_tries_again_and_loses_nothing(
    world: World,
) -> None:
    """A store that fails to open is opened again after a backoff; one that gives up on a
    confirmation ends the activation (the message stays unconfirmed), and the partition
    joins its group again and continues from the message not confirmed."""
    producer = world.producer(1, ["billing"])
    stores = FlakyStores(failed_opens=2, fail_seq_nr=30)
    settings = dataclasses.replace(
        MEMBER_SETTINGS,
        consumer=dataclasses.replace(MEMBER_SETTINGS.consumer, dedup_store_backoff=0.001),
    )
    member = world.join(world.process("m1"), "billing", 1, dedup_store=stores, settings=settings)

    world.send(producer, 100)
    wait_until(lambda: world.ledger.handled("billing") == 100, "every message")
    world.wait_sent()

    entries = world.ledger.of("billing")[0]
    report = check_group({0: entries}, 1, 100, KEYS)
    assert [d.seq_nr for d in report.duplicates[0]] == [30], "handled, not confirmed: again"
    assert stores.opened >= 4
    assert len(member.intervals()[0]) == 2, "two activations: before and after joining again"
    assert [type(e).__name__ for e in member.errors] == ["DedupStoreError"]
    assert member.statistics().handler_failures >= 3


@pytest.mark.parametrize("server", ["sticky", "modulo"], indirect=True)
def test_scaling_from_1_to_4_to_2_members_with_a_crash_keeps_every_message_and_key_order(
    world: World, tmp_path: Path, server: CoordinatorServer, request: pytest.FixtureRequest
) -> None:
    """Two groups follow a stream of 8 partitions while their members go from 1 to 4
    (joins), then to 2 (one crash, one graceful leave). Both groups handle every message,
    each partition in order without gaps, each key in the order sent; no partition ever
    has two active consumers. "billing" has a dedup store: nothing is handled twice;
    "audit" has none: only a hand-over may repeat messages, at most a window each."""
    count, partitions = 6000, 8
    producer = world.producer(partitions, ["billing", "audit"])
    dedup = tmp_path / "dedup.db"
    processes = [world.process(f"m{n}") for n in range(1, 5)]

    def join(process: Process) -> None:
        world.join(process, "billing", partitions, dedup_store=dedup)
        world.join(process, "audit", partitions)

    def progress() -> int:
        return min(world.ledger.handled("billing"), world.ledger.handled("audit"))

    join(processes[0])
    world.send(producer, count, rate=2000)
    wait_until(lambda: progress() >= 1000, "the first member to consume")
    for process in processes[1:]:
        join(process)
    wait_until(lambda: progress() >= 2500, "four members to consume")
    processes[3].crash()
    wait_until(lambda: progress() >= 3500, "the crashed member's partitions to move")
    for member in processes[2].members.values():
        member.close()
    processes[2].client.close()
    wait_until(lambda: progress() == count, "every message", timeout=40)
    world.wait_sent()

    for group in ("billing", "audit"):
        members = {p.name: p.members[group] for p in processes}
        report = check_group(world.ledger.of(group), partitions, count, KEYS)
        check_no_overlap(members, partitions)
        if request.node.callspec.params["server"] == "modulo":
            assert members["m1"].owned() == {0, 2, 4, 6}
            assert members["m2"].owned() == {1, 3, 5, 7}
        else:  # which four depends on the order the crash and the leave reached it
            assert len(members["m1"].owned()) == len(members["m2"].owned()) == 4
            assert members["m1"].owned() | members["m2"].owned() == set(range(partitions))
        for partition in range(partitions):
            handovers = len(report.runs[partition]) - 1
            assert len(report.duplicates[partition]) <= WINDOW * handovers, (group, partition)
        if group == "billing":
            assert report.duplicate_count == 0, report.duplicates
        print(f"\n{group}: runs {report.runs}, duplicates {report.duplicate_count}")
    assert {e.member for es in world.ledger.of("billing").values() for e in es} == {
        "m1",
        "m2",
        "m3",
        "m4",
    }


def test_intervals_are_recorded_per_partition(world: World) -> None:
    world.producer(2, ["billing"])
    member = world.join(world.process("m1"), "billing", 2)

    wait_until(lambda: member.owned() == {0, 1}, "both partitions active")

    spans = member.intervals()
    assert set(spans) == {0, 1}
    assert all(len(s) == 1 and isinstance(s[0], ActivationInterval) for s in spans.values())
