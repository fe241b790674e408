"""The coordinator's gRPC service and client, in one process on 127.0.0.1.

A `CoordinatorActor` behind a `CoordinatorServer` (port 0), and `CoordinatorClient`s, each
one connection. Updates are recorded by `Member`s; tests wait on them with bounded
timeouts. The only sleeps prove that something does *not* happen within the (short)
disconnected timeout. The end-to-end tests run `CoordinatedConsumer`s against a `Producer`
on transport nodes and check the hand-over: every message delivered, in order within each
activation, and no two activations of a group overlapping.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import gc
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

import grpc
import pykka
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pykka_delivery import ConsumerControllerSettings, Producer, ProducerControllerSettings
from pykka_delivery.coordinator import (
    OK,
    SIMPLE,
    ActivationInterval,
    Activity,
    Command,
    ConnectionRejected,
    Connectivity,
    CoordinatedConsumer,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorRefused,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
    CoordinatorUnavailable,
    EvaluateGroup,
    Execute,
    GroupId,
    GroupInfo,
    MemoryCommandLog,
    Refusal,
    Registered,
    SendConsumerUpdate,
    wire,
)
from pykka_delivery.errors import ClosedError, DeliveryTimeout
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.protocol import coordinator_pb2_grpc as pb_grpc
from pykka_delivery.testing import TcpProxy
from pykka_delivery.transport import Node
from tests.coordinator.servers import FAST
from tests.harness import wait_until

WAIT = 10.0  # the most any wait lasts
TIMEOUT = 0.3  # the coordinator's disconnected timeout in these tests, seconds
GROUP = GroupId("test", "orders", "billing")
GROUP_FIELDS = (GROUP.namespace, GROUP.stream, GROUP.name)


# --- fixtures and helpers ------------------------------------------------------------------


Serve = Callable[..., CoordinatorServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """``serve(timeout=TIMEOUT, **server_settings)``: a coordinator actor behind a server
    on 127.0.0.1, both stopped at the end of the test."""
    started: list[tuple[CoordinatorServer, pykka.ActorRef[Any]]] = []

    def start(timeout: float = TIMEOUT, **settings: Any) -> CoordinatorServer:
        # Modulo placement: a second consumer of one partition takes it over (a step-down).
        coordinator_settings = CoordinatorSettings(
            disconnected_timeout=timeout, recovery_min_delay=timeout, partition_assignment="modulo"
        )
        actor = CoordinatorActor.start(settings=coordinator_settings)
        server = CoordinatorServer(actor, CoordinatorServerSettings(**settings)).start()
        started.append((server, actor))
        return server

    yield start
    for server, actor in started:
        server.stop()
        actor.stop()


@pytest.fixture
def server(serve: Serve) -> CoordinatorServer:
    return serve()


@pytest.fixture
def clients() -> Iterator[list[CoordinatorClient]]:
    """Every client a test opens (via `connect`) is closed at its end."""
    opened: list[CoordinatorClient] = []
    yield opened
    for client in opened:
        client.close()


def connect(clients: list[CoordinatorClient], address: str, **kw: Any) -> CoordinatorClient:
    kw.setdefault("settings", FAST)
    client = CoordinatorClient(address, **kw)
    clients.append(client)
    return client


class Member:
    """One subscription of a client, recording its updates; ``answer`` makes it answer
    every step-down at once, as a consumer with nothing in flight does."""

    def __init__(self, client: CoordinatorClient, *, answer: bool = False) -> None:
        self.client = client
        self.answer = answer
        self.updates: queue.Queue[SendConsumerUpdate] = queue.Queue()
        self.links: queue.Queue[bool] = queue.Queue()
        client.add_listener(self.links.put)

    def on_update(self, update: SendConsumerUpdate) -> None:
        self.updates.put(update)
        if self.answer and update.stepping_down:
            self.client.send_activate(update.group, update.subscription_id)

    def register(
        self, group: GroupId = GROUP, subscription_id: int = 1, partition_index: int = SIMPLE
    ) -> Registered:
        return self.client.register(
            group, subscription_id, self.on_update, partition_index=partition_index
        )

    def next_update(self, timeout: float = WAIT) -> SendConsumerUpdate:
        try:
            return self.updates.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no update for {self.client.connection_id} within {timeout} s")

    def next_link_event(self, timeout: float = WAIT) -> bool:
        try:
            return self.links.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"no link event for {self.client.connection_id} within {timeout} s")


def members(clients: list[CoordinatorClient], address: str, count: int) -> list[Member]:
    """``count`` clients with one `Member` each."""
    return [Member(connect(clients, address)) for _ in range(count)]


def statuses(client: CoordinatorClient, group: GroupId = GROUP) -> list[tuple[str, str]]:
    """``(connection, label)`` of each consumer of ``group``, in the group's order."""
    infos = {info.group: info for info in client.list_groups()}
    info = infos.get(group)
    return [] if info is None else [(c.connection, c.label) for c in info.consumers]


def raw_stub(address: str) -> tuple[grpc.Channel, pb_grpc.CoordinatorStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]


def hello(connection_id: str = "raw", request_id: int = 1) -> pb.ClientMessage:
    return pb.ClientMessage(
        request_id=request_id, hello=pb.Hello(connection_id=connection_id, node="test")
    )


# --- registration and liveness ---------------------------------------------------------------


def test_three_clients_in_a_simple_group_have_exactly_one_active(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    three = members(clients, server.address, 3)

    replies = [m.register() for m in three]

    assert replies == [Registered(True), Registered(False), Registered(False)]
    # An update is written before the reply on the same stream: it is in already.
    assert three[0].updates.get_nowait().active
    assert three[1].updates.empty() and three[2].updates.empty()
    assert [label for _, label in statuses(three[0].client)] == [
        "active (connected)",
        "waiting (connected)",
        "waiting (connected)",
    ]


def test_a_stream_broken_without_goodbye_hands_the_group_over_after_the_disconnected_timeout(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    first, second = members(clients, server.address, 2)
    first.register()
    second.register()

    broken = time.monotonic()
    first.client.close(goodbye=False)  # the call is cancelled: as if the process died

    assert second.next_update().active
    assert time.monotonic() - broken >= TIMEOUT * 0.9
    assert [label for _, label in statuses(second.client)] == [
        "active (presumed down)",
        "active (connected)",
    ]
    assert server.statistics().streams_lost == 1


def test_closing_without_goodbye_leaves_no_grpc_task_pending(
    server: CoordinatorServer, clients: list[CoordinatorClient], caplog: pytest.LogCaptureFixture
) -> None:
    # A cancelled call's own gRPC tasks used to be destroyed pending when the client's
    # loop closed, and asyncio logged an error for each.
    group_members = members(clients, server.address, 12)
    for member in group_members:
        member.register()
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        for member in group_members:
            member.client.close(goodbye=False)
        gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


def test_a_goodbye_hands_the_group_over_at_once(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    first, second = members(clients, server.address, 2)
    first.register()
    second.register()

    first.client.close()

    assert second.next_update(timeout=TIMEOUT * 0.9).active, "before the disconnected timeout"
    assert statuses(second.client) == [(second.client.connection_id, "active (connected)")]
    assert server.statistics().streams_closed == 1


def test_a_client_that_reconnects_within_the_timeout_keeps_its_consumers(
    serve: Serve, clients: list[CoordinatorClient]
) -> None:
    server = serve(timeout=1.0)
    port = int(server.address.rsplit(":", 1)[1])
    with TcpProxy(("127.0.0.1", port)) as proxy:
        proxied = Member(connect(clients, f"{proxy.address[0]}:{proxy.address[1]}"))
        direct = Member(connect(clients, server.address))
        assert proxied.register().active
        assert proxied.next_link_event() and proxied.next_update().active
        direct.register()

        proxy.cut()

        assert proxied.next_link_event() is False
        assert proxied.next_link_event() is True, "reconnected"
        assert proxied.next_update().active, "its status is sent again"
        time.sleep(1.3)  # longer than the disconnected timeout: nothing is handed over
        assert direct.updates.empty()
        assert [label for _, label in statuses(direct.client)] == [
            "active (connected)",
            "waiting (connected)",
        ]


def test_a_stalled_connection_is_lost_by_keepalive_and_its_group_handed_over(
    serve: Serve, clients: list[CoordinatorClient]
) -> None:
    """No heartbeat message: HTTP/2 pings go unanswered, and both sides end the stream."""
    server = serve(keepalive_time=0.2, keepalive_timeout=0.2, min_ping_interval=0.1)
    port = int(server.address.rsplit(":", 1)[1])
    pinging = CoordinatorClientSettings(
        keepalive_time=0.2,
        keepalive_timeout=0.2,
        reconnect_backoff_min=0.01,
        reconnect_backoff_max=0.1,
        connect_timeout=0.5,
    )
    with TcpProxy(("127.0.0.1", port)) as proxy:
        address = f"{proxy.address[0]}:{proxy.address[1]}"
        stalled = Member(connect(clients, address, settings=pinging), answer=True)
        direct = Member(connect(clients, server.address))
        stalled.register()
        direct.register()
        assert stalled.next_link_event() and stalled.next_update().active

        proxy.stall(True)

        assert stalled.next_link_event() is False, "the client saw its pings unanswered"
        assert direct.next_update().active, "the server lost it too, then timed it out"
        proxy.stall(False)
        assert stalled.next_link_event() is True
        assert stalled.next_update().stepping_down, "back after the timeout: it steps down"
        assert [label for _, label in statuses(direct.client)] == [
            "active (connected)",
            "waiting (connected)",
        ]


def test_a_restarted_client_with_its_connection_id_gets_its_active_consumer_back(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    first, second = members(clients, server.address, 2)
    first.register()
    second.register()
    first.client.close(goodbye=False)

    again = Member(connect(clients, server.address, connection_id=first.client.connection_id))
    reply = again.register()

    assert reply == Registered(True)
    assert again.next_update().active, "the activation it was sent on attaching"
    time.sleep(TIMEOUT * 1.5)
    assert second.updates.empty()


def test_an_activation_nobody_registers_again_is_given_back_after_the_grace(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    first, second = members(clients, server.address, 2)
    first.register()
    second.register()
    first.client.close(goodbye=False)

    settings = CoordinatorClientSettings(orphan_grace=0.1, request_timeout=WAIT)
    connect(clients, server.address, connection_id=first.client.connection_id, settings=settings)

    assert second.next_update().active
    assert statuses(second.client) == [(second.client.connection_id, "active (connected)")]


def test_a_step_down_answered_with_activate_activates_the_next_consumer(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    group = GroupId("test", "orders-1", "billing")  # partition 1 of a super stream
    first = Member(connect(clients, server.address), answer=True)
    second = Member(connect(clients, server.address), answer=True)
    first.register(group, partition_index=1)

    second.register(group, partition_index=1)  # now eligible[1 % 2] is the second

    assert first.next_update().active
    assert first.next_update().stepping_down
    assert second.next_update().active
    assert [label for _, label in statuses(first.client, group)] == [
        "waiting (connected)",
        "active (connected)",
    ]


def test_only_the_answer_of_the_consumer_stepping_down_hands_over(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    group = GroupId("test", "orders-1", "billing")
    first, second = members(clients, server.address, 2)
    first.register(group, partition_index=1)
    second.register(group, partition_index=1)
    assert first.next_update().active and first.next_update().stepping_down

    second.client.activate(group, 1)  # a late answer of another consumer: nothing
    deactivating = [label for _, label in statuses(first.client, group)]
    first.client.activate(group, 1)

    assert deactivating == ["deactivating (connected)", "waiting (connected)"]
    assert second.next_update().active


def test_a_registration_with_another_partition_index_is_refused_with_the_reason(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    first, second = members(clients, server.address, 2)
    first.register()

    with pytest.raises(CoordinatorRefused) as refused:
        second.register(partition_index=2)

    assert refused.value.refusal is Refusal.PARTITION_INDEX_CONFLICT
    assert "partition index -1" in refused.value.message
    assert len(statuses(first.client)) == 1


def test_unregister_and_activate_of_unknown_things(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    client = connect(clients, server.address)

    client.unregister(GROUP, 7)  # already gone: done

    with pytest.raises(CoordinatorRefused) as refused:
        client.activate(GROUP)
    assert refused.value.refusal is Refusal.GROUP_NOT_FOUND


def test_list_groups_shows_each_consumers_status_and_filters_by_namespace(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    one = connect(clients, server.address, node="node-a", owner="svc-a")
    two = connect(clients, server.address, node="node-b")
    other = GroupId("other", "orders-3", "audit")
    Member(one).register()
    Member(two).register()
    Member(two).register(other, subscription_id=2, partition_index=3)

    groups = one.list_groups()
    only_other = one.list_groups("other")

    assert [info.group for info in groups] == [other, GROUP]  # sorted by key
    assert only_other == (groups[0],)
    billing = groups[1]
    assert isinstance(billing, GroupInfo) and billing.partition_index == SIMPLE
    assert [(c.connection, c.subscription_id, c.node, c.owner) for c in billing.consumers] == [
        (one.connection_id, 1, "node-a", "svc-a"),
        (two.connection_id, 1, "node-b", ""),
    ]
    assert [(c.connectivity, c.activity) for c in billing.consumers] == [
        (Connectivity.CONNECTED, Activity.ACTIVE),
        (Connectivity.CONNECTED, Activity.WAITING),
    ]
    assert groups[0].partition_index == 3


# --- refusals ------------------------------------------------------------------------------


def test_a_client_without_the_token_is_refused_with_unauthenticated(
    serve: Serve, clients: list[CoordinatorClient]
) -> None:
    server = serve(token="s3cret")
    channel, stub = raw_stub(server.address)
    with channel:
        stream = stub.Connect(iter([hello()]), timeout=WAIT)
        with pytest.raises(grpc.RpcError) as raw:
            list(stream)
    wrong = connect(clients, server.address, settings=CoordinatorClientSettings(token="nope"))
    right = connect(clients, server.address, settings=CoordinatorClientSettings(token="s3cret"))

    assert raw.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "token" in (raw.value.details() or "")
    with pytest.raises(ConnectionRejected) as rejected:
        Member(wrong).register()
    assert rejected.value.code == "UNAUTHENTICATED"
    with pytest.raises(ConnectionRejected):
        wrong.list_groups()
    assert Member(right).register().active
    assert server.statistics().rejected >= 2


def test_a_stream_whose_first_message_is_not_hello_is_refused(server: CoordinatorServer) -> None:
    register = pb.ClientMessage(
        request_id=1, register=pb.Register(group=pb.GroupKey(namespace="a", stream="b", name="c"))
    )
    channel, stub = raw_stub(server.address)
    with channel:
        stream = stub.Connect(iter([register]), timeout=WAIT)
        with pytest.raises(grpc.RpcError) as refused:
            list(stream)

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "must be a hello" in (refused.value.details() or "")


def test_a_connect_message_that_does_not_parse_ends_the_stream_with_invalid_argument(
    server: CoordinatorServer,
) -> None:
    # Regression (issue 19, defect 4): gRPC's deserializer failed before the server saw the
    # message: the stream ended with UNKNOWN naming a Python exception, and nothing counted.
    with grpc.insecure_channel(server.address) as channel:
        connect = channel.stream_stream(
            "/pykka_delivery.coordinator.v1.Coordinator/Connect",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        with pytest.raises(grpc.RpcError) as refused:
            list(connect(iter([b"\xff\xfe not a message"]), timeout=WAIT))

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = refused.value.details() or ""
    assert "does not parse as a coordinator ClientMessage" in details
    assert "Error" not in details  # no Python exception's name
    stats = server.statistics()
    assert (stats.malformed, stats.rejected) == (1, 1)


def test_an_invalid_request_is_refused_and_the_stream_goes_on(server: CoordinatorServer) -> None:
    requests: queue.Queue[pb.ClientMessage | None] = queue.Queue()
    bad = pb.Register(group=pb.GroupKey(namespace="", stream="b", name="c"), subscription_id=1)
    good = pb.Register(group=pb.GroupKey(namespace="a", stream="b", name="c"), subscription_id=1)
    channel, stub = raw_stub(server.address)
    with channel:
        replies = stub.Connect(iter(requests.get, None), timeout=WAIT)
        requests.put(hello())
        welcome = next(replies)
        requests.put(pb.ClientMessage(request_id=2, register=bad))
        refused = next(replies)
        requests.put(pb.ClientMessage(request_id=3, register=good))
        registered, update = next(replies), next(replies)  # the update follows the reply
        requests.put(pb.ClientMessage(goodbye=pb.Goodbye()))
        requests.put(None)
        assert list(replies) == []

    assert welcome.reply.request_id == 1 and welcome.reply.HasField("ok")
    assert refused.reply.request_id == 2
    assert refused.reply.refused.reason == pb.REFUSAL_INVALID_REQUEST
    assert "namespace" in refused.reply.refused.message
    assert update.update.active and update.update.subscription_id == 1
    assert registered.reply.request_id == 3 and registered.reply.registered.active


def test_plaintext_on_a_public_interface_is_refused_unless_allowed() -> None:
    with pytest.raises(ValueError, match="allow_insecure"):
        CoordinatorServerSettings(host="0.0.0.0")
    CoordinatorServerSettings(host="0.0.0.0", allow_insecure=True)


def test_the_health_service_reports_serving(server: CoordinatorServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="pykka_delivery.coordinator.v1.Coordinator")
        reply = health.Check(request, timeout=WAIT)

    assert reply.status == health_pb2.HealthCheckResponse.SERVING


# --- CoordinatedConsumer end to end ----------------------------------------------------------

COUNT = 2_000
CONSUMER_SETTINGS = ConsumerControllerSettings(
    flow_control_window=50, resend_interval_min=0.05, resend_interval_max=0.2
)


class Ledger:
    """Every delivery processed, by every consumer: ``(name, interval, message)``."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self.entries: list[tuple[str, int, int]] = []

    def record(self, name: str, interval: int, message: int) -> None:
        with self.lock:
            self.entries.append((name, interval, message))
            self.lock.notify_all()

    def wait_until(self, check: Callable[[], bool], what: str) -> None:
        with self.lock:
            assert self.lock.wait_for(check, WAIT), f"{what}; got {len(self.entries)}"

    def distinct(self) -> int:
        return len({m for _, _, m in self.entries})

    def by(self, name: str) -> int:
        return sum(1 for n, _, _ in self.entries if n == name)


class Run:
    """Consumes a `CoordinatedConsumer` on a thread, a little slowly, and records each
    delivery; with ``stop_after`` it closes the consumer after that many."""

    def __init__(
        self, name: str, consumer: CoordinatedConsumer, ledger: Ledger, stop_after: int = 0
    ) -> None:
        self.name, self.consumer, self.ledger, self.stop_after = name, consumer, ledger, stop_after
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for done, delivery in enumerate(self.consumer, start=1):
            interval = len(self.consumer.intervals()) - 1
            time.sleep(0.0002)  # "processing": a hand-over lands in the middle of it
            self.ledger.record(self.name, interval, delivery.message)
            delivery.confirm()
            if done == self.stop_after:
                self.consumer.close()

    def join(self) -> None:
        self.consumer.close(unregister=False)
        self.thread.join(WAIT)
        assert not self.thread.is_alive()


def start_sending(producer_node: Node, count: int = COUNT) -> tuple[Producer, threading.Thread]:
    """A producer exposed as "orders" on ``producer_node``, sending 0..count-1 from a
    thread of its own."""
    producer = Producer(
        "orders",
        ProducerControllerSettings(resend_first_interval=0.05),
        self_ref_factory=producer_node.expose("orders"),
    )

    def send_all() -> None:
        for number in range(count):
            producer.send(number, timeout=WAIT)

    sender = threading.Thread(target=send_all, daemon=True)
    sender.start()
    return producer, sender


def coordinated(
    client: CoordinatorClient, nodes: tuple[Node, Node], partition_index: int = SIMPLE
) -> CoordinatedConsumer:
    producer_node, consumer_node = nodes
    group = GROUP if partition_index == SIMPLE else GroupId("test", "orders-1", "billing")
    return CoordinatedConsumer(
        client,
        group.namespace,
        group.stream,
        group.name,
        consumer_node.ref(f"{producer_node.address}/orders"),
        partition_index=partition_index,
        settings=CONSUMER_SETTINGS,
        node=consumer_node,
    )


def check_hand_over(ledger: Ledger, consumers: dict[str, CoordinatedConsumer]) -> None:
    """Every message processed; within each activation in order without gaps, each
    activation starting at most where the previous stopped; activations never overlap."""
    runs: dict[tuple[str, int], list[int]] = {}
    for name, interval, message in ledger.entries:
        runs.setdefault((name, interval), []).append(message)
    for key, messages in runs.items():
        assert messages == list(range(messages[0], messages[0] + len(messages))), key
    intervals: list[tuple[ActivationInterval, str]] = sorted(
        ((i, name) for name, c in consumers.items() for i in c.intervals()),
        key=lambda pair: pair[0].start,
    )
    for (before, a), (after, b) in itertools.pairwise(intervals):
        assert before.end is not None and before.end <= after.start, f"{a} and {b} overlap"
    assert {m for _, _, m in ledger.entries} == set(range(COUNT))


def test_a_coordinated_consumer_that_is_not_active_yields_nothing(
    server: CoordinatorServer, clients: list[CoordinatorClient], nodes: tuple[Node, Node]
) -> None:
    first = coordinated(connect(clients, server.address), nodes)
    second = coordinated(connect(clients, server.address), nodes)

    with pytest.raises(DeliveryTimeout):
        second.receive(timeout=0.2)

    assert first.registered.active and not second.registered.active
    assert second.intervals() == ()
    first.close()
    second.close()


def test_coordinated_consumers_hand_over_on_step_down_and_on_a_lost_connection(
    server: CoordinatorServer, clients: list[CoordinatorClient], nodes: tuple[Node, Node]
) -> None:
    """A partitioned group: the second consumer's registration makes the first step down;
    then the second's connection breaks and the first takes over after the timeout."""
    ledger = Ledger()
    producer, sender = start_sending(nodes[0])
    first = coordinated(connect(clients, server.address), nodes, partition_index=1)
    first_run = Run("first", first, ledger)
    ledger.wait_until(lambda: ledger.distinct() >= 500, "the first consumes")

    second_client = connect(clients, server.address)
    second = coordinated(second_client, nodes, partition_index=1)
    second_run = Run("second", second, ledger)
    ledger.wait_until(lambda: ledger.by("second") >= 300, "the second takes over")
    second_client.close(goodbye=False)  # the second's process "dies"
    ledger.wait_until(lambda: ledger.distinct() == COUNT, "every message is processed")

    producer.wait_confirmed(timeout=WAIT)
    sender.join(WAIT)
    first_run.join()
    second_run.join()
    check_hand_over(ledger, {"first": first, "second": second})
    assert len(first.intervals()) == 2 and len(second.intervals()) == 1
    gap = first.intervals()[1].start - (second.intervals()[0].end or 0.0)
    assert gap >= TIMEOUT * 0.9, "the first waited for the disconnected timeout"
    producer.close()


def test_closing_the_active_coordinated_consumer_hands_a_simple_group_over(
    server: CoordinatorServer, clients: list[CoordinatorClient], nodes: tuple[Node, Node]
) -> None:
    ledger = Ledger()
    producer, sender = start_sending(nodes[0])
    first = coordinated(connect(clients, server.address), nodes)
    second = coordinated(connect(clients, server.address), nodes)
    runs = [Run("first", first, ledger, stop_after=700), Run("second", second, ledger)]

    ledger.wait_until(lambda: ledger.distinct() == COUNT, "every message is processed")

    producer.wait_confirmed(timeout=WAIT)
    sender.join(WAIT)
    for run in runs:
        run.join()
    check_hand_over(ledger, {"first": first, "second": second})
    assert ledger.by("first") == 700
    assert [len(first.intervals()), len(second.intervals())] == [1, 1]
    producer.close()


# --- review regressions ----------------------------------------------------------------------


class _NoProducer:
    """A producer ref for consumers that never get to consume."""

    def tell(self, message: object) -> None:
        pass


def test_a_coordinated_consumer_whose_registration_timed_out_leaves_no_consumer_behind(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    # The registration stays queued after the timeout; without clean-up it was applied
    # once the client connected, and the abandoned consumer became the group's active one
    # for good: nobody iterates it, and a simple group never steps its active one down.
    port = int(server.address.rsplit(":", 1)[1])
    with TcpProxy(("127.0.0.1", port)) as proxy:
        proxy.refuse(True)
        client = connect(clients, f"{proxy.address[0]}:{proxy.address[1]}")
        with pytest.raises(DeliveryTimeout):
            CoordinatedConsumer(
                client, GROUP.namespace, GROUP.stream, GROUP.name, _NoProducer(), timeout=0.2
            )
        proxy.refuse(False)
        assert client.wait_connected(WAIT)
        client.unregister(GroupId("test", "other", "other"), 1)  # after what was queued

        other = Member(connect(clients, server.address))

        assert other.register() == Registered(True)
        assert statuses(other.client) == [(other.client.connection_id, "active (connected)")]


def test_a_server_that_fails_to_start_releases_its_loop_and_threads() -> None:
    actor = CoordinatorActor.start()
    try:
        server = CoordinatorServer(
            actor, CoordinatorServerSettings(host="256.0.0.1", allow_insecure=True)
        )
        with pytest.raises(RuntimeError, match="bind"):
            server.start()

        assert server._loop.is_closed()  # its selector's descriptors are freed
        assert not server._thread.is_alive()
        server.stop()  # still harmless
    finally:
        actor.stop()


def test_list_groups_of_a_closed_client_raises_closed_error(server: CoordinatorServer) -> None:
    client = CoordinatorClient(server.address, settings=FAST)
    client.close()

    with pytest.raises(ClosedError):
        client.list_groups(timeout=1.0)


def test_a_client_closed_from_its_own_callback_closes_its_loop(server: CoordinatorServer) -> None:
    client = CoordinatorClient(server.address, settings=FAST)
    closed = threading.Event()

    def close_when_up(up: bool) -> None:
        if up:
            client.close(goodbye=False)  # from the client's thread: it finishes later
            closed.set()

    client.add_listener(close_when_up)
    assert client.wait_connected(WAIT) and closed.wait(WAIT)
    client._thread.join(WAIT)

    assert client._loop.is_closed()  # its selector's descriptors are freed


def test_a_second_stream_of_a_connection_ends_the_first_one(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    # The newest stream of a connection gets its updates; the older one was left open,
    # so a process still on it (a hung process its supervisor replaced, reusing its
    # connection id) went on consuming, never told it had been replaced, while the new
    # one was told active too.
    old = Member(connect(clients, server.address, connection_id="svc-1"))
    assert old.register() == Registered(True)
    assert old.next_link_event() is True and old.next_update().active

    new = Member(connect(clients, server.address, connection_id="svc-1"))
    new.register()

    assert new.next_update().active
    assert old.next_link_event(timeout=2.0) is False, "the old stream was ended"
    old.client.close(goodbye=False)  # a hung process would be killed now


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (CoordinatorServerSettings, "keepalive_time"),
        (CoordinatorServerSettings, "request_timeout"),
        (CoordinatorServerSettings, "shutdown_grace"),
        (CoordinatorClientSettings, "keepalive_timeout"),
        (CoordinatorClientSettings, "reconnect_backoff_max"),
        (CoordinatorClientSettings, "close_timeout"),
    ],
)
def test_durations_must_be_finite(settings: Any, field: str) -> None:
    # An infinite duration passed the checks and failed later, far from its cause: in
    # gRPC's options (OverflowError on the client's thread, which then never connected).
    with pytest.raises(ValueError, match=field):
        settings(**{field: float("inf")})


class _FakeClient:
    """Just enough of a `CoordinatorClient` to drive a `CoordinatedConsumer` by hand."""

    connection_id = "fake"

    def __init__(self) -> None:
        self.on_update: Callable[[SendConsumerUpdate], None] | None = None
        self.answers: list[tuple[GroupId, int | None]] = []
        self.answered_epochs: list[int] = []
        self.refuse = False

    def next_subscription_id(self) -> int:
        return 1

    def add_listener(self, listener: Callable[[bool], None]) -> None:
        pass

    def remove_listener(self, listener: Callable[[bool], None]) -> None:
        pass

    def add_position_source(self, source: Callable[[], Any]) -> None:
        pass

    def remove_position_source(self, source: Callable[[], Any]) -> None:
        pass

    def register(
        self, group: GroupId, subscription_id: int, on_update: Any, **kw: Any
    ) -> Registered:
        self.on_update = on_update
        return Registered(False)

    def unregister(self, group: GroupId, subscription_id: int, **kw: Any) -> None:
        pass

    def send_activate(
        self, group: GroupId, subscription_id: int | None = None, *, epoch: int = 0
    ) -> concurrent.futures.Future[Any]:
        self.answers.append((group, subscription_id))
        self.answered_epochs.append(epoch)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self.refuse:
            future.set_exception(ConnectionRejected("UNAUTHENTICATED", "wrong token"))
        else:
            future.set_result(None)
        return future


def test_a_repeated_step_down_is_answered_once_per_activation() -> None:
    # The machine tells a deactivating consumer again whenever its group re-checks, and
    # an Attach re-sends it. Answering each copy sent a second, late answer that counts
    # for the next step-down of the same consumer once it is active again: the next
    # consumer then started while this one still processed.
    client = _FakeClient()
    consumer = CoordinatedConsumer(
        cast(CoordinatorClient, client), *GROUP_FIELDS, _NoProducer(), subscription_id=1
    )
    assert client.on_update is not None
    step_down = SendConsumerUpdate("fake", 1, GROUP, active=False)

    client.on_update(step_down)
    client.on_update(step_down)  # told again before its answer arrived

    assert client.answers == [(GROUP, 1)]
    client.on_update(SendConsumerUpdate("fake", 1, GROUP, active=True))
    client.on_update(step_down)  # a new step-down, after a new activation
    assert client.answers == [(GROUP, 1), (GROUP, 1)]
    consumer.close(unregister=False)


def test_a_step_down_whose_answer_was_refused_is_answered_again() -> None:
    client = _FakeClient()
    consumer = CoordinatedConsumer(
        cast(CoordinatorClient, client), *GROUP_FIELDS, _NoProducer(), subscription_id=1
    )
    assert client.on_update is not None
    step_down = SendConsumerUpdate("fake", 1, GROUP, active=False)
    client.refuse = True
    client.on_update(step_down)  # its answer fails at once: never delivered
    client.refuse = False

    client.on_update(step_down)

    assert client.answers == [(GROUP, 1), (GROUP, 1)]
    consumer.close(unregister=False)


# --- review regressions: closing, reconnecting, refusals -------------------------------------


def test_a_goodbye_waits_until_the_delivery_in_flight_is_confirmed(
    serve: Serve, clients: list[CoordinatorClient], nodes: tuple[Node, Node]
) -> None:
    # The goodbye went out while the active consumer still processed a delivery: the
    # coordinator activated the next consumer at once, the producer resent it the
    # unconfirmed message, and two processes handled it at the same time.
    server = serve(timeout=WAIT)  # a hand-over before WAIT can only come from a goodbye
    producer, sender = start_sending(nodes[0], 10)
    closing = connect(clients, server.address)
    first = coordinated(closing, nodes)
    second = coordinated(connect(clients, server.address), nodes)
    held = first.receive(timeout=WAIT)  # being processed

    closer = threading.Thread(target=closing.close)  # with goodbye
    closer.start()

    with pytest.raises(DeliveryTimeout):  # proves a negative: nothing while it is held
        second.receive(timeout=0.5)
    assert closer.is_alive(), "close waits for the delivery in flight"
    held.confirm()
    closer.join(WAIT)
    assert not closer.is_alive()
    second.receive(timeout=WAIT).confirm()  # the goodbye handed the group over at once
    assert server.statistics().streams_closed == 1
    [before], [after] = first.intervals(), second.intervals()
    assert before.end is not None and before.end <= after.start
    first.close(unregister=False)
    second.close()
    sender.join(WAIT)
    producer.close()


def test_a_client_whose_consumers_do_not_stop_within_close_timeout_leaves_without_goodbye(
    serve: Serve,
    clients: list[CoordinatorClient],
    nodes: tuple[Node, Node],
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = serve(timeout=WAIT)
    producer, sender = start_sending(nodes[0], 10)
    client = connect(clients, server.address, settings=dataclasses.replace(FAST, close_timeout=0.2))
    first = coordinated(client, nodes)
    held = first.receive(timeout=WAIT)  # never confirmed in time

    with caplog.at_level(logging.WARNING, logger="pykka_delivery.coordinator.client"):
        client.close()

    assert any("without goodbye" in r.getMessage() for r in caplog.records)
    # The safe side: the coordinator sees a lost connection and waits disconnected_timeout.
    wait_until(lambda: server.statistics().streams_lost == 1, "the connection is lost")
    assert server.statistics().streams_closed == 0
    held.confirm()
    first.close(unregister=False)
    sender.join(WAIT)
    producer.close()


def test_a_client_closed_from_its_callback_also_waits_for_the_delivery_in_flight(
    serve: Serve, clients: list[CoordinatorClient], nodes: tuple[Node, Node]
) -> None:
    server = serve(timeout=WAIT)
    producer, sender = start_sending(nodes[0], 10)
    closing = connect(clients, server.address)
    first = coordinated(closing, nodes)
    second = coordinated(connect(clients, server.address), nodes)
    held = first.receive(timeout=WAIT)
    trigger = GroupId("test", "trigger-1", "close")
    closing.register(
        trigger, 99, lambda u: closing.close() if u.stepping_down else None, partition_index=1
    )

    # A second consumer in the trigger's group steps it down: on the closing client's
    # thread, which calls close there (it returns at once and finishes on that thread).
    Member(connect(clients, server.address)).register(trigger, partition_index=1)

    wait_until(lambda: not closing.connected, "the client is closing")
    with pytest.raises(DeliveryTimeout):  # proves a negative: nothing while it is held
        second.receive(timeout=0.5)
    held.confirm()
    closing._thread.join(WAIT)
    assert not closing._thread.is_alive(), "the client's thread finished closing"
    second.receive(timeout=WAIT).confirm()
    assert server.statistics().streams_closed == 1
    first.close(unregister=False)
    second.close()
    sender.join(WAIT)
    producer.close()


def test_an_answer_to_a_step_down_is_not_sent_again_on_a_new_stream(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    # Re-sent after a reconnect, an answer to an earlier step-down could count for a
    # later step-down of the same consumer (active again by then) while it consumes.
    group = GroupId("test", "orders-1", "billing")
    port = int(server.address.rsplit(":", 1)[1])
    with TcpProxy(("127.0.0.1", port)) as proxy:
        first = Member(connect(clients, f"{proxy.address[0]}:{proxy.address[1]}"))
        second = Member(connect(clients, server.address))
        first.register(group, partition_index=1)
        assert first.next_link_event() is True
        second.register(group, partition_index=1)
        assert first.next_update().active and first.next_update().stepping_down
        proxy.stall(True)
        answer = first.client.send_activate(group, 1)  # held in the proxy, then lost

        proxy.cut()
        proxy.stall(False)

        assert first.next_link_event() is False and first.next_link_event() is True
        assert isinstance(answer.exception(timeout=WAIT), CoordinatorUnavailable)
        first.client.activate(group, 1)  # the answer on the new stream (told again or not)
        assert second.next_update().active


class _LinkedFakeClient(_FakeClient):
    """A `_FakeClient` whose connection can be lost by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.listeners: list[Callable[[bool], object]] = []

    def add_listener(self, listener: Callable[[bool], object]) -> None:
        self.listeners.append(listener)

    def lose_connection(self) -> list[object]:
        return [listener(False) for listener in self.listeners]


def test_a_step_down_sent_again_after_a_lost_connection_is_answered_again() -> None:
    # The client does not re-send an answer of a broken stream; the coordinator re-sends
    # the step-down if it is still pending, and that copy must be answered.
    client = _LinkedFakeClient()
    consumer = CoordinatedConsumer(
        cast(CoordinatorClient, client), *GROUP_FIELDS, _NoProducer(), subscription_id=1
    )
    assert client.on_update is not None
    step_down = SendConsumerUpdate("fake", 1, GROUP, active=False)
    client.on_update(step_down)

    assert client.lose_connection() == [None], "nothing in flight: nothing to wait for"
    client.on_update(step_down)  # re-sent on attaching

    assert client.answers == [(GROUP, 1), (GROUP, 1)]
    consumer.close(unregister=False)


def test_a_refused_re_registration_ends_the_coordinated_consumer_with_the_refusal(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    # The refusal was only logged: the subscription stayed, and its consumer waited for
    # ever for an activation that could not come.
    port = int(server.address.rsplit(":", 1)[1])
    with TcpProxy(("127.0.0.1", port)) as proxy:
        client = connect(clients, f"{proxy.address[0]}:{proxy.address[1]}")
        consumer = CoordinatedConsumer(client, *GROUP_FIELDS, _NoProducer())
        assert consumer.registered.active
        proxy.refuse(True)
        proxy.cut()
        wait_until(lambda: not client.connected, "the client saw the cut")
        # Meanwhile an operator drops the consumer, and the group comes back partitioned.
        command = EvaluateGroup(*GROUP_FIELDS, dead_connections=(client.connection_id,))
        assert server.coordinator.ask(Execute(command)) == OK
        Member(connect(clients, server.address)).register(GROUP, partition_index=0)

        proxy.refuse(False)

        with pytest.raises(CoordinatorRefused) as refused:
            consumer.receive(timeout=WAIT)
        assert refused.value.refusal is Refusal.PARTITION_INDEX_CONFLICT
        with pytest.raises(CoordinatorRefused):
            list(consumer)  # the iterator ends with it too
        assert client._requests.subscriptions == {}, "the subscription is dropped"
        consumer.close()


def test_a_coordinated_consumer_closed_from_a_callback_leaves_its_group(
    server: CoordinatorServer, clients: list[CoordinatorClient]
) -> None:
    client = connect(clients, server.address)
    consumer = CoordinatedConsumer(client, *GROUP_FIELDS, _NoProducer())
    errors: list[Exception] = []
    closed = threading.Event()

    def close_consumer(update: SendConsumerUpdate) -> None:
        try:
            consumer.close()  # on the client's thread
        except Exception as error:
            errors.append(error)
        closed.set()

    client.register(GroupId("test", "other", "trigger"), 99, close_consumer)  # its activation

    assert closed.wait(WAIT) and errors == []
    wait_until(lambda: statuses(client) == [], "the consumer left its group")


def test_the_client_reconnects_after_an_unexpected_error_in_its_stream(
    server: CoordinatorServer,
    clients: list[CoordinatorClient],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The reconnect task died with the exception, silently: the client never connected.
    hello_message = wire.hello_message
    calls = itertools.count()

    def failing_once(*args: Any) -> pb.ClientMessage:
        if next(calls) == 0:
            msg = "boom"
            raise RuntimeError(msg)
        return hello_message(*args)

    monkeypatch.setattr(wire, "hello_message", failing_once)
    with caplog.at_level(logging.ERROR, logger="pykka_delivery.coordinator.client"):
        client = connect(clients, server.address)
        assert client.wait_connected(WAIT)

    assert [str(r.exc_info[1]) for r in caplog.records if r.exc_info] == ["boom"]


class _ScriptedStream:
    """One Connect call to a `_ScriptedCoordinator`: the test reads what the client
    sent and decides what the server sends."""

    def __init__(self) -> None:
        self.received: queue.Queue[pb.ClientMessage] = queue.Queue()
        self.outgoing: queue.Queue[pb.ServerMessage | None] = queue.Queue()

    def read_all(self, requests: Iterator[pb.ClientMessage]) -> None:
        with contextlib.suppress(grpc.RpcError):
            for message in requests:
                self.received.put(message)

    def next_received(self, kind: str) -> pb.ClientMessage:
        try:
            message = self.received.get(timeout=WAIT)
        except queue.Empty:
            pytest.fail(f"the client sent no {kind} within {WAIT} s")
        assert message.WhichOneof("body") == kind
        return message

    def reply(self, request_id: int, **result: Any) -> None:
        self.outgoing.put(pb.ServerMessage(reply=pb.Reply(request_id=request_id, **result)))


class _ScriptedCoordinator(pb_grpc.CoordinatorServicer):
    """A stand-in for the coordinator service, driven message by message by the test:
    while `refusing` is set it refuses streams as a wrong token would."""

    def __init__(self) -> None:
        self.refusing = threading.Event()
        self.refused = threading.Event()
        self.streams: queue.Queue[_ScriptedStream] = queue.Queue()
        self.done = threading.Event()

    def Connect(self, request_iterator: Any, context: Any) -> Iterator[pb.ServerMessage]:
        if self.refusing.is_set():
            self.refused.set()
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "wrong token")
        context.send_initial_metadata(())
        stream = _ScriptedStream()
        threading.Thread(target=stream.read_all, args=(request_iterator,), daemon=True).start()
        self.streams.put(stream)
        while context.is_active() and not self.done.is_set():
            with contextlib.suppress(queue.Empty):
                message = stream.outgoing.get(timeout=0.05)
                if message is None:
                    return
                yield message

    def next_stream(self) -> _ScriptedStream:
        try:
            return self.streams.get(timeout=WAIT)
        except queue.Empty:
            pytest.fail(f"the client opened no stream within {WAIT} s")


def test_answers_sent_on_attaching_go_out_after_an_earlier_rejection(
    clients: list[CoordinatorClient],
) -> None:
    # The rejection of an earlier attempt was cleared only by the hello's reply, so an
    # answer to a step-down the coordinator re-sends on attaching (before that reply)
    # failed at once with ConnectionRejected and was never sent.
    scripted = _ScriptedCoordinator()
    grpc_server = grpc.server(concurrent.futures.ThreadPoolExecutor(4))
    pb_grpc.add_CoordinatorServicer_to_server(scripted, grpc_server)  # type: ignore[no-untyped-call]
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    grpc_server.start()
    try:
        member = Member(connect(clients, f"127.0.0.1:{port}"), answer=True)
        first = scripted.next_stream()
        first.reply(first.next_received("hello").request_id, ok=pb.Ok())
        assert member.client.wait_connected(WAIT)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            registering = pool.submit(member.register)
            register = first.next_received("register")
            first.reply(register.request_id, registered=pb.Registered(active=False))
            assert registering.result(WAIT) == Registered(False)
        scripted.refusing.set()
        first.outgoing.put(None)  # the stream ends; the next attempt is refused
        assert scripted.refused.wait(WAIT)
        scripted.refusing.clear()

        second = scripted.next_stream()
        second.next_received("hello")
        second.next_received("register")  # registered again
        # As the coordinator does on attaching, before the hello's reply: the step-down
        # still pending.
        update = pb.ConsumerUpdate(group=wire.group_key(GROUP), subscription_id=1, active=False)
        second.outgoing.put(pb.ServerMessage(update=update))

        answer = second.next_received("activate")
        assert answer.activate.subscription_id == 1
    finally:
        clients.pop().close(goodbye=False)
        scripted.done.set()
        grpc_server.stop(0).wait(WAIT)


def test_a_stream_that_sends_no_hello_is_ended_after_hello_timeout(serve: Serve) -> None:
    server = serve(hello_timeout=0.2)
    channel, stub = raw_stub(server.address)
    silent = threading.Event()

    def nothing() -> Iterator[pb.ClientMessage]:
        silent.wait(WAIT)  # sends nothing until the test ends
        yield from ()

    with channel:
        stream = stub.Connect(nothing(), timeout=WAIT)
        with pytest.raises(grpc.RpcError) as ended:
            list(stream)
        silent.set()

    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "hello_timeout" in (ended.value.details() or "")
    assert server.statistics().rejected == 1


class _FailingLog(MemoryCommandLog):
    """A log whose appends fail, as a full disk would make them."""

    def append(self, command: Command) -> None:
        raise OSError("No space left on device")


def test_a_request_the_coordinator_fails_on_ends_the_stream_with_unavailable() -> None:
    actor = CoordinatorActor.start(_FailingLog())
    server = CoordinatorServer(actor).start()
    register = pb.ClientMessage(
        request_id=2,
        register=pb.Register(
            group=pb.GroupKey(namespace="a", stream="b", name="c"), subscription_id=1
        ),
    )
    try:
        channel, stub = raw_stub(server.address)
        with channel:
            stream = stub.Connect(iter([hello(), register]), timeout=WAIT)
            with pytest.raises(grpc.RpcError) as ended:
                list(stream)
    finally:
        server.stop()
        actor.stop()

    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "failed on RegisterConsumer" in (ended.value.details() or "")
    assert "No space left on device" in (ended.value.details() or "")
