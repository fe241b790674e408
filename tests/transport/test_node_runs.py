"""Runs of SequencedMessages through real nodes: who gets a `SequencedRun`, who gets the
messages, and how the node counts them.

A frame carries consecutive plain SequencedMessages of one producer controller as one
``sequenced_run`` envelope. The receiving node hands a `TakesRuns` target (the `Consumer`
handle's endpoint: ``tell_runs``) each run as one `SequencedRun`, and every other target
the messages. ``envelopes_received`` and ``unknown_target`` count messages either way.
Two nodes on 127.0.0.1 (or one node and a raw gRPC stream, where the test needs runs of
an exact shape); every wait is bounded by `WAIT`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from pykka_delivery import AsyncConsumer, Consumer, ConsumerControllerSettings, Producer
from pykka_delivery.delivery.stores.dead_letters import MemoryDeadLetters
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol import BYTES, delivery_pb2, transport_pb2
from pykka_delivery.protocol.messages import (
    Ack,
    PeerLinkChanged,
    Ref,
    SequencedMessage,
    SequencedRun,
)
from pykka_delivery.transport import Node
from tests.delivery.handles.test_consumer_runs import count_deliveries_from_runs
from tests.transport.test_node import Sink

WAIT = 20.0


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-node-runs-timers")
    yield service
    service.shutdown()


def start(nodes: list[Node]) -> Node:
    node = Node().start()
    nodes.append(node)
    return node


class Recorder(Sink):
    """An exposed target that records what it is told (link events aside), each message
    of a run as it was when it arrived (in ``messages``); ``wait`` for a number of
    messages."""

    def __init__(self) -> None:
        super().__init__()  # messages: runs expanded at arrival
        self.received: list[Any] = []  # as told: runs, messages
        self.calls = 0  # tells and tell_many calls with anything but link events

    def tell(self, message: Any) -> None:
        self._record([message])

    def _record(self, messages: list[Any]) -> None:
        messages = [m for m in messages if type(m) is not PeerLinkChanged]
        with self.changed:
            self.calls += 1 if messages else 0
            for message in messages:
                self.received.append(message)
                if type(message) is SequencedRun:
                    self.messages += message.expand()
                else:
                    self.messages.append(message)
            self.changed.notify_all()


class BatchRecorder(Recorder):
    """Takes batches (``tell_many``) but not runs."""

    def tell_many(self, messages: list[Any]) -> None:
        self._record(messages)


class RunRecorder(BatchRecorder):
    """Takes batches and runs, as the `Consumer` handle's endpoint does."""

    def tell_runs(self, messages: list[Any]) -> None:
        self._record(messages)


def stream(controller: Ref, producer_id: str = "orders") -> list[SequencedMessage]:
    """Sixty messages of one session: the first and an ack request travel alone, the
    plain ones form runs."""
    return [
        SequencedMessage(producer_id, n, b"x%d" % n, n == 1, n == 41, controller)
        for n in range(1, 61)
    ]


def test_a_target_taking_runs_gets_sequenced_runs_and_the_others_the_messages(
    nodes: list[Node],
) -> None:
    a, b = start(nodes), start(nodes)
    runs, plain, batches = RunRecorder(), Recorder(), BatchRecorder()
    b.register("runs", runs)
    b.register("plain", plain)
    b.register("batches", batches)
    sent = stream(a.ref(f"{a.address}/orders"))
    to_nobody = stream(a.ref(f"{a.address}/other"), "other")[1:8]  # 7 plain messages

    for message in to_nobody:  # first: counted before anything below arrives (one link)
        a.ref(f"{b.address}/nobody").tell(message)
    for name in ("runs", "plain", "batches"):
        for message in sent:
            a.ref(f"{b.address}/{name}").tell(message)

    for recorder in (runs, plain, batches):
        assert recorder.wait(len(sent)) == sent
        assert [m.producer_controller for m in recorder.messages] == [
            b.ref(f"{a.address}/orders")
        ] * len(sent)
    assert {type(m) for m in runs.received} == {SequencedRun, SequencedMessage}
    assert [m.seq_nr for m in runs.received if type(m) is SequencedMessage] == [1, 41]
    assert {type(m) for m in plain.received} == {SequencedMessage}
    assert {type(m) for m in batches.received} == {SequencedMessage}
    stats = b.statistics()
    assert stats.envelopes_received == len(to_nobody) + 3 * len(sent)
    assert stats.unknown_target == len(to_nobody)
    assert stats.malformed == 0


def test_a_run_handed_over_is_a_fresh_cursor_over_its_messages(nodes: list[Node]) -> None:
    a, b = start(nodes), start(nodes)
    runs = RunRecorder()
    b.register("runs", runs)
    sent = stream(a.ref(f"{a.address}/orders"))[1:5]  # 2..5, plain

    for message in sent:
        a.ref(f"{b.address}/runs").tell(message)
    runs.wait(len(sent))

    taken = []
    for run in runs.received:
        assert type(run) is SequencedRun
        assert run.remaining == run.last_seq_nr - run.seq_nr > 0  # nothing taken
        while run.remaining:
            run.take()
            taken.append((run.seq_nr, run.message))
    assert taken == [(m.seq_nr, m.message) for m in sent]


def send_raw(node: Node, frame: transport_pb2.Frame) -> None:
    """Write ``frame`` to ``node`` on a link of our own, as a peer at 127.0.0.1:9."""
    frame.hello.node = "127.0.0.1:9"
    with grpc.insecure_channel(node.address) as channel:
        link = channel.stream_stream(
            "/pykka_delivery.transport.v1.Node/Link",
            request_serializer=lambda raw: raw,
            response_deserializer=lambda raw: raw,
        )
        list(link(iter([frame.SerializeToString()]), timeout=5))  # ends when we half-close


def add_run(frame: transport_pb2.Frame, target: str, first_seq_nr: int, count: int) -> None:
    frame.envelopes.add(
        target=target,
        sequenced_run=delivery_pb2.SequencedRun(
            producer_id="orders",
            first_seq_nr=first_seq_nr,
            producer_controller="127.0.0.1:9/orders",
            serializer_id=BYTES,
            data=[b"m%d" % n for n in range(first_seq_nr, first_seq_nr + count)],
        ),
    )


def test_one_run_envelope_is_one_sequenced_run_or_its_messages_and_counts_per_message(
    nodes: list[Node],
) -> None:
    a = start(nodes)
    runs, plain = RunRecorder(), Recorder()
    a.register("runs", runs)
    a.register("plain", plain)
    frame = transport_pb2.Frame()
    add_run(frame, "runs", 1, 3)
    add_run(frame, "runs", 4, 2)
    frame.envelopes.add(target="runs").ack.confirmed_seq_nr = 7
    add_run(frame, "nobody", 1, 4)
    add_run(frame, "plain", 1, 3)

    send_raw(a, frame)

    plain.wait(3)
    assert [(type(m), m.seq_nr + 1, m.last_seq_nr) for m in runs.received[:2]] == [
        (SequencedRun, 1, 3),
        (SequencedRun, 4, 5),
    ]
    assert runs.received[2] == Ack(7)
    assert runs.calls == 1  # one target, one batch
    assert [(m.seq_nr, m.message) for m in runs.messages[:5]] == [
        (n, b"m%d" % n) for n in range(1, 6)
    ]
    assert [(type(m), m.seq_nr, m.message) for m in plain.received] == [
        (SequencedMessage, n, b"m%d" % n) for n in range(1, 4)
    ]
    stats = a.statistics()
    assert (stats.frames_received, stats.envelopes_received) == (1, 3 + 2 + 1 + 4 + 3)
    assert stats.unknown_target == 4
    assert stats.malformed == 0


def send_from(
    a: Node, b: Node, consumer: Consumer | AsyncConsumer, timers: TimerService, count: int
) -> tuple[Producer, threading.Thread]:
    """A `Producer` exposed on ``a`` as "orders", ``consumer`` (exposed on ``b``)
    registered to it, and a thread sending it the numbers below ``count``."""
    producer = Producer("orders", timer_service=timers, self_ref_factory=a.expose("orders"))
    consumer.register_to(b.ref(f"{a.address}/orders"))
    sender = threading.Thread(
        target=lambda: [producer.send(n, timeout=WAIT) for n in range(count)], daemon=True
    )
    sender.start()
    return producer, sender


def test_a_consumer_across_nodes_rejecting_some_messages_gets_all_in_order(
    nodes: list[Node], timers: TimerService
) -> None:
    """Runs end to end into the `Consumer` handle: rejections in the middle of runs are
    redelivered before the stream moves on."""
    a, b = start(nodes), start(nodes)
    settings = ConsumerControllerSettings(
        flow_control_window=20, resend_interval_min=0.2, redelivery_backoff=0.01
    )
    consumer = Consumer(
        settings,
        timer_service=timers,
        self_ref_factory=b.expose("consumer"),
        dead_letters=MemoryDeadLetters(),
    )
    expected = []  # (message, attempt): every 7th rejected once, then redelivered
    for n in range(300):
        expected += [(n, 1), (n, 2)] if n % 7 == 3 else [(n, 1)]
    producer, sender = send_from(a, b, consumer, timers, 300)
    seen = []
    try:
        while len(seen) < len(expected):
            delivery = consumer.receive(timeout=WAIT)
            seen.append((delivery.message, delivery.attempt))
            if delivery.message % 7 == 3 and delivery.attempt == 1:
                delivery.reject("once")
            else:
                delivery.confirm()
        sender.join(WAIT)
        producer.wait_confirmed(timeout=WAIT)
    finally:
        consumer.close()
        producer.close()

    assert seen == expected
    assert consumer.statistics().rejected == 300 // 7 + 1
    assert b.statistics().envelopes_received >= 300


async def test_an_async_consumer_across_nodes_takes_runs_in_order(
    nodes: list[Node], timers: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The `AsyncConsumer` takes runs too (its endpoint is `TakesRuns`): every
    message, in order, once, with a rejection in the middle of a run redelivered first,
    and most deliveries taken straight from a run."""
    from_runs = count_deliveries_from_runs(monkeypatch)
    a, b = start(nodes), start(nodes)
    settings = ConsumerControllerSettings(
        flow_control_window=50, resend_interval_min=0.2, redelivery_backoff=0.01
    )
    consumer = AsyncConsumer(
        settings,
        timer_service=timers,
        self_ref_factory=b.expose("async-consumer"),
        dead_letters=MemoryDeadLetters(),
    )
    producer, sender = send_from(a, b, consumer, timers, 1000)
    seen = []
    try:
        while len(seen) < 1001:
            delivery = await asyncio.wait_for(consumer.receive(), WAIT)
            seen.append((delivery.message, delivery.attempt))
            if delivery.message == 500 and delivery.attempt == 1:
                delivery.reject("once")
            else:
                delivery.confirm()
        sender.join(WAIT)
        await asyncio.to_thread(producer.wait_confirmed, timeout=WAIT)
    finally:
        consumer.close()
        producer.close()
    assert seen == [(n, 1) for n in range(501)] + [(500, 2)] + [(n, 1) for n in range(501, 1000)]
    assert len(from_runs) > 500  # runs under load: the producer sends faster than one by one
    assert b.statistics().envelopes_received >= 1000
