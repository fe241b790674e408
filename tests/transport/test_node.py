"""The gRPC node: two (or three) nodes in one test process, on 127.0.0.1.

Behaviour of the transport itself: delivery across nodes, batching, faults (links cut,
stalled, refused), authentication, TLS, size limits, malformed input, health. The
multi-process runs (subprocesses, SIGKILL) are in test_processes.py.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from types import SimpleNamespace
from typing import Any

import grpc
import pykka
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pykka_delivery import (
    Consumer,
    ConsumerController,
    ConsumerControllerSettings,
    Producer,
    ProducerController,
    ProducerControllerSettings,
    RegisterToProducerController,
    RequestNext,
)
from pykka_delivery.delivery.core.producer import ProducerCore
from pykka_delivery.protocol import BYTES, delivery_pb2, transport_pb2
from pykka_delivery.protocol.messages import PeerLinkChanged, SequencedMessage
from pykka_delivery.testing import TcpProxy
from pykka_delivery.transport import Node, NodeSettings, TlsSettings
from pykka_delivery.transport._peer import Peer
from pykka_delivery.transport.frames import FrameBuilder
from tests.certs import TlsFiles, tls_files  # noqa: F401 - the fixture

WAIT = 20.0
FAST = ConsumerControllerSettings(
    flow_control_window=100, resend_interval_min=0.05, resend_interval_max=0.2
)


def start(nodes: list[Node], settings: NodeSettings | None = None) -> Node:
    node = Node(settings).start()
    nodes.append(node)
    return node


class Reader:
    """Consumes in a thread, confirming each delivery; ``wait`` returns the messages."""

    def __init__(self, consumer: Consumer, count: int) -> None:
        self.consumer = consumer
        self.count = count
        self.messages: list[Any] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for delivery in self.consumer:
            self.messages.append(delivery.message)
            delivery.confirm()
            if len(self.messages) >= self.count:
                self.done.set()
                return

    def wait(self, timeout: float = WAIT) -> list[Any]:
        assert self.done.wait(timeout), f"got {len(self.messages)} of {self.count}"
        return self.messages


def connect(
    producer_node: Node, consumer_node: Node, *, producer_path: str | None = None, **kw: Any
) -> tuple[Producer, Consumer]:
    producer = Producer(
        "orders",
        ProducerControllerSettings(resend_first_interval=0.05),
        self_ref_factory=producer_node.expose("orders"),
    )
    consumer = Consumer(kw.get("settings", FAST), self_ref_factory=consumer_node.expose("c"))
    consumer.register_to(consumer_node.ref(producer_path or f"{producer_node.address}/orders"))
    return producer, consumer


def send_all(producer: Producer, messages: range) -> None:
    for message in messages:
        producer.send(message, timeout=WAIT)


# --- delivery ------------------------------------------------------------------------


def test_ten_thousand_messages_cross_nodes_in_order_exactly_once_in_batches(
    nodes: list[Node],
) -> None:
    a, b = start(nodes), start(nodes)
    producer, consumer = connect(a, b)
    reader = Reader(consumer, 10_000)

    send_all(producer, range(10_000))

    assert reader.wait() == list(range(10_000))
    producer.wait_confirmed(timeout=WAIT)
    stats = a.statistics()
    assert stats.envelopes_sent >= 10_000
    assert stats.frames_sent < stats.envelopes_sent / 5  # batched, not one per write
    assert a.statistics().links_opened == 1  # one link for both directions


def test_a_consumer_registers_once_over_a_link_its_registration_opened(
    nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first opening of a link is no reconnection: the consumer does not register
    again when it comes up (which had the producer resend its first message and window)."""
    registrations = []
    register = ProducerCore.on_register_consumer

    def counted(core: ProducerCore, consumer_controller: Any, epoch: int = 0) -> Any:
        registrations.append(consumer_controller)
        return register(core, consumer_controller, epoch)

    monkeypatch.setattr(ProducerCore, "on_register_consumer", counted)
    a, b = start(nodes), start(nodes)
    # No registration retry on the timer within the test (the link opens in milliseconds).
    slow_retry = ConsumerControllerSettings(resend_interval_min=30.0, resend_interval_max=60.0)
    producer, consumer = connect(a, b, settings=slow_retry)
    reader = Reader(consumer, 100)

    send_all(producer, range(100))

    assert reader.wait() == list(range(100))
    assert len(registrations) == 1


def test_controller_actors_on_two_nodes_deliver_in_order(nodes: list[Node]) -> None:
    a, b = start(nodes), start(nodes)
    received: list[Any] = []
    done = threading.Event()

    class Numbers(pykka.ThreadingActor):
        sent = 0

        def on_receive(self, message: Any) -> None:
            if isinstance(message, RequestNext) and self.sent < 500:
                self.sent += 1
                message.send_next_to.tell(self.sent)

    class Record(pykka.ThreadingActor):
        def on_receive(self, delivery: Any) -> None:
            received.append(delivery.message)
            delivery.confirm()
            if len(received) == 500:
                done.set()

    pc = ProducerController.start("nums", self_ref_factory=a.expose("nums"))
    cc = ConsumerController.start(FAST, self_ref_factory=b.expose("nums-consumer"))
    cc.tell(ConsumerController.Start(Record.start()))
    pc.tell(ProducerController.Start(Numbers.start()))
    cc.tell(RegisterToProducerController(b.ref(f"{a.address}/nums")))

    assert done.wait(WAIT), f"got {len(received)}"
    assert received == list(range(1, 501))


def test_a_ref_to_this_nodes_own_address_is_told_directly(nodes: list[Node]) -> None:
    a = start(nodes)
    producer, consumer = connect(a, a)
    reader = Reader(consumer, 100)

    send_all(producer, range(100))

    assert reader.wait() == list(range(100))
    assert a.statistics().frames_sent == 0


def test_refs_to_the_same_address_are_equal_and_a_bad_address_is_refused(
    nodes: list[Node],
) -> None:
    a = start(nodes)

    assert a.ref("127.0.0.1:1/x") == a.ref("127.0.0.1:1/x")
    assert a.ref("127.0.0.1:1/x") != a.ref("127.0.0.1:1/y")
    with pytest.raises(ValueError, match="host:port/name"):
        a.ref("no-slash")


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("localhost/orders", "'localhost' has no port"),
        (":7001/orders", "':7001' has no port"),
        ("localhost:http/orders", "port 'http' of 'localhost:http' is not a number"),
        ("localhost:70000/orders", "port '70000' of 'localhost:70000' is not a number"),
        ("[::1:7001/orders", "host '[::1' of '[::1:7001' is not a name"),
    ],
)
def test_an_address_without_a_usable_port_is_refused_at_once_naming_the_problem(
    nodes: list[Node], path: str, problem: str
) -> None:
    # Regression: node.ref("localhost/orders") was accepted, and a consumer registered to
    # it only timed out ("nothing delivered within 8 s") with the cause logged at DEBUG.
    a = start(nodes)

    with pytest.raises(ValueError, match=re.escape(problem)) as refused:
        a.ref(path)

    assert "e.g. 'localhost:7001/orders'" in str(refused.value)


def test_an_ipv6_address_with_a_port_is_a_usable_remote_address(nodes: list[Node]) -> None:
    a = start(nodes)

    assert a.ref("[::1]:7001/orders").node_address == "[::1]:7001"


def test_a_local_object_that_was_not_exposed_cannot_be_sent_across(
    nodes: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    a, b = start(nodes), start(nodes)
    consumer = Consumer(FAST, self_ref_factory=b.expose("c"))
    producer = Producer("p")  # not exposed: its address cannot go on the wire
    producer.register_consumer(a.ref(f"{b.address}/c"))  # through a's link to b

    producer.send("m", timeout=WAIT)  # accepted by the producer, refused by the link

    deadline = time.monotonic() + WAIT
    while a.statistics().dropped_unsendable == 0:
        assert time.monotonic() < deadline, "the unsendable message was not reported"
        time.sleep(0.01)
    assert "self_ref_factory=node.expose" in caplog.text
    assert b.statistics().envelopes_received == 0
    consumer.close()


# --- faults ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def behind_proxy(nodes: list[Node], proxy_factory: Any) -> tuple[Node, TcpProxy]:
    """A node known to the world by a proxy's address, so both directions of every link
    to it go through the proxy."""
    port = free_port()
    proxy = proxy_factory(("127.0.0.1", port)).start()
    advertised = f"{proxy.address[0]}:{proxy.address[1]}"
    node = start(nodes, NodeSettings(port=port, advertised_address=advertised))
    return node, proxy


def test_cutting_the_link_mid_stream_several_times_loses_and_duplicates_nothing(
    nodes: list[Node],
) -> None:
    a, proxy = behind_proxy(nodes, TcpProxy)
    try:
        b = start(nodes, NodeSettings(reconnect_backoff_min=0.01, reconnect_backoff_max=0.1))
        producer, consumer = connect(a, b)
        reader = Reader(consumer, 5_000)

        for chunk in range(5):
            send_all(producer, range(chunk * 1_000, (chunk + 1) * 1_000))
            proxy.cut()

        assert reader.wait() == list(range(5_000))
        assert b.statistics().links_lost >= 1
        assert b.statistics().links_opened >= 2  # it really linked again (either side dials)
    finally:
        proxy.stop()


def test_a_stalled_link_delivers_everything_once_it_flows_again(nodes: list[Node]) -> None:
    a, proxy = behind_proxy(nodes, TcpProxy)
    try:
        b = start(nodes)
        producer, consumer = connect(a, b)
        reader = Reader(consumer, 300)
        send_all(producer, range(100))
        reader.done.clear()

        proxy.stall(True)
        sender = threading.Thread(target=send_all, args=(producer, range(100, 300)))
        sender.start()
        sender.join(0.3)  # it blocks once the window is used up
        proxy.stall(False)
        sender.join(WAIT)

        assert reader.wait() == list(range(300))
    finally:
        proxy.stop()


# --- security and bad input ------------------------------------------------------------


def test_a_node_without_the_token_is_refused_and_nothing_arrives(nodes: list[Node]) -> None:
    a = start(nodes, NodeSettings(token="s3cret"))
    b = start(nodes, NodeSettings(token="wrong", reconnect_backoff_min=0.05))
    producer, consumer = connect(a, b)

    with pytest.raises(Exception):  # noqa: B017 - DeliveryTimeout: no demand ever
        producer.send("m", timeout=1.0)

    assert a.statistics().rejected_links >= 1
    consumer.close()


def test_nodes_sharing_the_token_link(nodes: list[Node]) -> None:
    a = start(nodes, NodeSettings(token="s3cret"))
    b = start(nodes, NodeSettings(token="s3cret"))
    producer, consumer = connect(a, b)
    reader = Reader(consumer, 10)

    send_all(producer, range(10))

    assert reader.wait() == list(range(10))


def test_mutual_tls_round_trip_with_generated_certificates(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    server_tls = TlsSettings(tls_files.server_cert, tls_files.server_key, tls_files.ca_cert)
    client_tls = TlsSettings(tls_files.client_cert, tls_files.client_key, tls_files.ca_cert)
    a = start(nodes, NodeSettings(tls=server_tls))
    b = start(nodes, NodeSettings(tls=client_tls))
    producer, consumer = connect(a, b)
    reader = Reader(consumer, 50)

    send_all(producer, range(50))

    assert reader.wait() == list(range(50))


def test_a_client_trusting_another_ca_is_refused(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    server_tls = TlsSettings(tls_files.server_cert, tls_files.server_key, tls_files.ca_cert)
    wrong = TlsSettings(tls_files.client_cert, tls_files.client_key, tls_files.other_ca_cert)
    a = start(nodes, NodeSettings(tls=server_tls))
    b = start(nodes, NodeSettings(tls=wrong, connect_timeout=0.5))
    producer, consumer = connect(a, b)

    with pytest.raises(Exception):  # noqa: B017 - no link, so no demand
        producer.send("m", timeout=1.0)

    assert not b.is_linked(a.address)
    consumer.close()


def test_plaintext_on_a_non_loopback_host_is_refused_with_the_fix_named() -> None:
    with pytest.raises(ValueError, match="tls=TlsSettings"):
        NodeSettings(host="0.0.0.0")


def test_a_message_above_max_message_bytes_is_refused_naming_the_setting(
    nodes: list[Node], caplog: pytest.LogCaptureFixture
) -> None:
    a = start(nodes, NodeSettings(max_message_bytes=2048))
    b = start(nodes, NodeSettings(max_message_bytes=2048))
    producer, consumer = connect(a, b)
    reader = Reader(consumer, 2)

    producer.send(b"x" * 10_000, timeout=WAIT)  # too large for the link: never arrives
    deadline = time.monotonic() + WAIT
    while a.statistics().dropped_unsendable == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)

    assert "max_message_bytes" in caplog.text
    assert reader.messages == []


def test_garbage_on_the_link_is_refused_and_the_node_keeps_serving(nodes: list[Node]) -> None:
    a, b = start(nodes), start(nodes)
    with grpc.insecure_channel(a.address) as channel:
        link = channel.stream_stream(
            "/pykka_delivery.transport.v1.Node/Link",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        with pytest.raises(grpc.RpcError):
            list(link(iter([b"\xff\xfe not a frame"]), timeout=5))
        no_hello = transport_pb2.Frame()
        no_hello.envelopes.add(target="x")
        with pytest.raises(grpc.RpcError) as refused:
            list(link(iter([no_hello.SerializeToString()]), timeout=5))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    producer, consumer = connect(a, b)
    reader = Reader(consumer, 10)
    send_all(producer, range(10))
    assert reader.wait() == list(range(10))


def test_a_frame_that_does_not_parse_ends_its_link_with_invalid_argument_and_is_counted(
    nodes: list[Node],
) -> None:
    # Regression (issue 19, defect 4): gRPC's deserializer failed before the node saw the
    # frame: the link ended with UNKNOWN naming a Python exception, and malformed stayed 0.
    a = start(nodes)
    hello = transport_pb2.Frame()
    hello.hello.node = "127.0.0.1:9"
    with grpc.insecure_channel(a.address) as channel:
        link = channel.stream_stream(
            "/pykka_delivery.transport.v1.Node/Link",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        for frames in ([b"\xff\xfe not a frame"], [hello.SerializeToString(), b"\xff\xff"]):
            with pytest.raises(grpc.RpcError) as refused:
                list(link(iter(frames), timeout=5))

            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            details = refused.value.details() or ""
            assert "does not parse" in details
            assert "Error" not in details  # no Python exception's name

    assert a.statistics().malformed == 2


def test_malformed_envelopes_and_unknown_targets_are_counted_not_fatal(
    nodes: list[Node],
) -> None:
    a = start(nodes)
    frame = transport_pb2.Frame()
    frame.hello.node = "127.0.0.1:9"
    frame.envelopes.add(target="nobody").ack.confirmed_seq_nr = 1
    frame.envelopes.add(target="nobody")  # no body at all
    with grpc.insecure_channel(a.address) as channel:
        link = channel.stream_stream(
            "/pykka_delivery.transport.v1.Node/Link",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        list(link(iter([frame.SerializeToString()]), timeout=5))  # ends when we half-close

    stats = a.statistics()
    assert stats.malformed == 1
    assert stats.unknown_target == 1


class Sink:
    """An exposed target that records what it is told; ``wait`` for a count."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.changed = threading.Condition()

    def tell(self, message: Any) -> None:
        if isinstance(message, PeerLinkChanged):
            return
        with self.changed:
            self.messages.append(message)
            self.changed.notify_all()

    def wait(self, count: int) -> list[Any]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.messages) >= count, WAIT), (
                f"got {len(self.messages)} of {count}"
            )
        return self.messages


def test_a_run_above_max_message_bytes_is_split_into_runs_that_fit(nodes: list[Node]) -> None:
    a = start(nodes, NodeSettings(max_message_bytes=2048))
    controller = a.ref(f"{a.address}/orders")
    builder = FrameBuilder(a._codec)
    sent = [
        SequencedMessage("orders", n, b"x" * 100, False, False, controller) for n in range(1, 101)
    ]
    for message in sent:
        builder.add("c", message)

    parts = a._fit(builder.frame, builder.messages)

    assert len(builder.frame.envelopes) == 1
    assert len(parts) > 1
    assert all(part.ByteSize() == size <= 2048 for part, _, size in parts)
    assert sum(count for _, count, _ in parts) == 100
    received = [m for part, _, _ in parts for _, ms in a._codec.decode_frame(part)[0] for m in ms]
    assert received == sent
    assert a.statistics().dropped_unsendable == 0


def test_sequenced_messages_queued_before_the_link_arrive_in_order_within_the_size_limit(
    nodes: list[Node],
) -> None:
    a = start(nodes, NodeSettings(max_message_bytes=2048))
    b = start(nodes, NodeSettings(max_message_bytes=2048))
    sink = Sink()
    b.register("sink", sink)
    ref = a.ref(f"{b.address}/sink")
    controller = a.ref(f"{a.address}/orders")
    sent = [
        SequencedMessage("orders", n, b"x" * 100, False, False, controller) for n in range(1, 201)
    ]

    for message in sent:  # queued while a dials b: frames of runs above 2048 bytes
        ref.tell(message)

    assert sink.wait(200) == sent
    deadline = time.monotonic() + WAIT
    while a.statistics().envelopes_sent < 200:  # counted once the last write returned
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert a.statistics().envelopes_sent == 200  # counted per message, runs or not
    assert a.statistics().dropped_unsendable == 0
    assert b.statistics().envelopes_received == 200


def test_a_malformed_run_is_counted_and_the_rest_of_the_frame_is_delivered(
    nodes: list[Node],
) -> None:
    a = start(nodes)
    sink = Sink()
    a.register("sink", sink)
    producer_controller = "127.0.0.1:9/orders"
    frame = transport_pb2.Frame()
    frame.hello.node = "127.0.0.1:9"
    for first_seq_nr, address in ((1, producer_controller), (3, ""), (5, producer_controller)):
        frame.envelopes.add(
            target="sink",
            sequenced_run=delivery_pb2.SequencedRun(
                producer_id="orders",
                first_seq_nr=first_seq_nr,
                producer_controller=address,
                serializer_id=BYTES,
                data=[b"a", b"b"],
            ),
        )
    with grpc.insecure_channel(a.address) as channel:
        link = channel.stream_stream(
            "/pykka_delivery.transport.v1.Node/Link",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        list(link(iter([frame.SerializeToString()]), timeout=5))  # ends when we half-close

    received = sink.wait(4)
    assert [(m.seq_nr, m.message) for m in received] == [(1, b"a"), (2, b"b"), (5, b"a"), (6, b"b")]
    assert a.statistics().malformed == 1


def test_every_node_serves_the_standard_health_check(nodes: list[Node]) -> None:
    a = start(nodes)
    with grpc.insecure_channel(a.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        response = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)

    assert response.status == health_pb2.HealthCheckResponse.SERVING


def test_exposed_targets_are_told_when_a_link_to_a_peer_comes_up_and_goes_down(
    nodes: list[Node],
) -> None:
    a, b = start(nodes), start(nodes)
    events: list[Any] = []
    changed = threading.Condition()

    class Recorder:
        def tell(self, message: Any) -> None:
            with changed:
                events.append(message)
                changed.notify_all()

    b.register("watcher", Recorder())
    producer, consumer = connect(a, b)
    reader = Reader(consumer, 1)
    send_all(producer, range(1))
    reader.wait()

    a.stop()
    nodes.remove(a)

    with changed:
        assert changed.wait_for(lambda: PeerLinkChanged(a.address, False) in events, WAIT)
    assert events.index(PeerLinkChanged(a.address, True)) < events.index(
        PeerLinkChanged(a.address, False)
    )


def test_a_stopping_node_delivers_the_last_frame_it_wrote(nodes: list[Node]) -> None:
    # Regression: stop() cancelled the call as soon as the last write returned; a peer
    # still busy with the previous frame then never read it. Now the opener half-closes
    # and waits for the peer to end the call.
    a = start(nodes)
    got: list[bytes] = []
    arrived = threading.Condition()

    class Slow:
        def tell(self, message: Any) -> None:
            if isinstance(message, bytes):
                if message == b"slow":
                    time.sleep(0.3)  # keeps a's link reader busy
                with arrived:
                    got.append(message)
                    arrived.notify_all()

    a.register("slow", Slow())
    b = Node().start()
    try:
        ref = b.ref(f"{a.address}/slow")
        ref.tell(b"warm-up")
        with arrived:
            assert arrived.wait_for(lambda: got == [b"warm-up"], WAIT)
        ref.tell(b"slow")
        deadline = time.monotonic() + WAIT
        while b.statistics().frames_sent < 2:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        time.sleep(0.05)  # a is now delivering "slow"
        ref.tell(b"last")
        while b.statistics().frames_sent < 3:
            assert time.monotonic() < deadline
            time.sleep(0.005)
    finally:
        b.stop()

    with arrived:
        assert arrived.wait_for(lambda: b"last" in got, WAIT), got


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("port", 70000),
        ("max_message_bytes", 10),
        ("max_batch", 0),
        ("linger", -1.0),
        ("yield_after", -0.001),
        ("max_pending", 0),
        ("keepalive_time", 0.0),
        ("keepalive_timeout", 0.0),
        ("reconnect_backoff_min", 0.0),
        ("connect_timeout", 0.0),
        ("token", ""),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        NodeSettings(**{field: value})  # type: ignore[arg-type]


def test_a_stale_wake_up_of_an_idle_writer_does_not_stop_it(nodes: list[Node]) -> None:
    """A sender schedules a wake-up for an idle writer; an earlier frame may already have
    taken its message, so the writer can wake to an empty outbox. It must go back to
    waiting (it used to fail on the empty outbox after a frame of 16 or more messages and
    stop sending for good)."""
    a, b = start(nodes), start(nodes)
    sink = Sink()
    b.register("sink", sink)
    ref = a.ref(f"{b.address}/sink")
    for n in range(20):  # one frame of 16 or more: the writer's burst rule is armed
        ref.tell(n)
    peer = a._peers[b.address]
    deadline = time.monotonic() + WAIT
    while not (peer.idle and not peer.outbox) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert peer.idle and not peer.outbox
    a._loop.call_soon_threadsafe(peer.wake.set)  # the stale wake-up
    time.sleep(0.1)
    for n in range(20, 40):
        ref.tell(n)
    assert sink.wait(40) == list(range(40))


def test_a_writer_that_fails_starts_again_and_later_messages_go_out(
    nodes: list[Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected error in a peer's writer is logged and the writer starts again: the
    peer is not left without one (what the failed frame held is the protocol's to
    resend)."""
    failures = []

    class FailingOnce(FrameBuilder):
        def fill(self, outbox: Any, limit: int) -> Any:
            if not failures:
                failures.append(outbox.popleft())
                raise RuntimeError("boom")
            return super().fill(outbox, limit)

    monkeypatch.setattr("pykka_delivery.transport._peer.FrameBuilder", FailingOnce)
    a = start(nodes, NodeSettings(reconnect_backoff_min=0.01))
    b = start(nodes)
    sink = Sink()
    b.register("sink", sink)
    ref = a.ref(f"{b.address}/sink")
    ref.tell("lost with the failed frame")
    deadline = time.monotonic() + WAIT
    while not failures and time.monotonic() < deadline:
        time.sleep(0.01)
    ref.tell("after")
    assert sink.wait(1) == ["after"]
    assert [message for _, message in failures] == ["lost with the failed frame"]


class _FakeTime:
    """Stands in for the ``time`` module of _peer.py: a clock the test moves, and a count
    of ``sleep(0)`` calls (each one hands the GIL to the node's thread)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.yields = 0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds == 0
        self.yields += 1


@pytest.mark.parametrize(
    ("gap", "least", "most"),
    [
        # A message every 100 µs for 100 ms: a yield at least once per yield_after plus the
        # 16 messages between two looks at the clock (1.6 ms), at most once per yield_after.
        (0.0001, 38, 100),
        # A message every 10 µs for 10 ms: the clock is looked at every 160 µs, and still
        # a yield comes once per yield_after, not at every look.
        (0.00001, 8, 10),
        # A message every µs for 1 ms: within yield_after, once at most.
        (0.000001, 0, 1),
    ],
)
def test_a_sender_that_keeps_queueing_hands_the_gil_over_once_per_yield_after(
    monkeypatch: pytest.MonkeyPatch, gap: float, least: int, most: int
) -> None:
    clock = _FakeTime()
    monkeypatch.setattr("pykka_delivery.transport._peer.time", clock)
    settings = NodeSettings(yield_after=0.001, max_pending=10_000)
    node = SimpleNamespace(settings=settings, _loop_thread_id=-1)  # another thread's loop
    peer = Peer(node, "127.0.0.1:9")  # type: ignore[arg-type]  # what enqueue reads of it

    for n in range(1000):
        clock.now += gap
        peer.enqueue("sink", n)

    assert least <= clock.yields <= most
    assert [message for _, message in peer.outbox] == list(range(1000))


def test_a_sender_on_the_nodes_own_loop_never_yields(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _FakeTime()
    monkeypatch.setattr("pykka_delivery.transport._peer.time", clock)
    node = SimpleNamespace(settings=NodeSettings(), _loop_thread_id=threading.get_ident())
    peer = Peer(node, "127.0.0.1:9")  # type: ignore[arg-type]

    for n in range(1000):
        clock.now += 0.0001
        peer.enqueue("sink", n)

    assert clock.yields == 0
