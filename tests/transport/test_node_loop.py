"""A node on the caller's asyncio loop (``async with Node()``): the asyncio handles share
the loop with the transport, no thread of the node's own.

Also: the lifecycle rules around it (a node starts once; `stop` cannot block the loop the
node runs on) and the consumer's turn for the loop after it told the producer side
something (else its Request waits until every delivery ready is processed).
"""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
from typing import Any

import pytest

from pykka_delivery import (
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    ConsumerControllerSettings,
    Producer,
)
from pykka_delivery.protocol.messages import PeerLinkChanged, Request, SequencedMessage
from pykka_delivery.testing import TcpProxy
from pykka_delivery.transport import Node, NodeSettings
from pykka_delivery.transport import _peer as peer_module
from tests.transport.test_node import Sink, free_port

WAIT = 20.0
FAST_RECONNECT = NodeSettings(reconnect_backoff_min=0.01, reconnect_backoff_max=0.1)


def node_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pykka-delivery-node"]


async def deliver(a: Node, b: Node, count: int, window: int = 100) -> list[int]:
    """``count`` numbers from an `AsyncProducer` on ``a`` to an `AsyncConsumer` on ``b``;
    what the consumer received, in order."""
    settings = ConsumerControllerSettings(
        flow_control_window=window, resend_interval_min=0.2, resend_interval_max=1.0
    )
    producer = AsyncProducer("numbers", self_ref_factory=a.expose("numbers"))
    consumer = AsyncConsumer(settings, self_ref_factory=b.expose("numbers-consumer"))
    consumer.register_to(b.ref(f"{a.address}/numbers"))

    async def send_all() -> None:
        for number in range(count):
            await producer.send(number, timeout=WAIT)
        await producer.wait_confirmed(timeout=WAIT)

    async def receive_all() -> list[int]:
        received: list[int] = []
        while len(received) < count:
            delivery = await consumer.receive(timeout=WAIT)
            received.append(delivery.message)
            delivery.confirm()
        return received

    _, received = await asyncio.gather(send_all(), receive_all())
    producer.close()
    consumer.close()
    return received


async def test_nodes_on_the_running_loop_deliver_in_order_exactly_once_with_no_thread() -> None:
    before = node_threads()
    async with Node() as a, Node() as b:
        assert a._loop is asyncio.get_running_loop()
        assert node_threads() == before  # no loop thread of their own
        received = await deliver(a, b, 5_000)
        assert b.statistics().frames_received < 5_000  # batched, not one frame a message
    assert received == list(range(5_000))


async def test_cutting_a_loop_nodes_link_several_times_loses_and_duplicates_nothing() -> None:
    port = free_port()
    proxy = TcpProxy(("127.0.0.1", port)).start()
    advertised = f"{proxy.address[0]}:{proxy.address[1]}"
    try:
        async with (
            Node(NodeSettings(port=port, advertised_address=advertised)) as a,
            Node(FAST_RECONNECT) as b,
        ):
            delivered = asyncio.create_task(deliver(a, b, 5_000, window=50))
            for _ in range(4):
                await asyncio.sleep(0.05)
                proxy.cut()
            received = await asyncio.wait_for(delivered, 60)
            assert b.statistics().links_lost >= 1
    finally:
        proxy.stop()
    assert received == list(range(5_000))


async def test_stop_on_the_loop_the_node_runs_on_is_refused_naming_stop_async() -> None:
    node = await Node().start_async()
    try:
        with pytest.raises(RuntimeError, match=r"await node.stop_async\(\)"):
            node.stop()
    finally:
        await node.stop_async()
    node.stop()  # stopped already: nothing to do


async def test_stop_from_another_thread_stops_a_node_on_a_loop() -> None:
    node = await Node().start_async()
    host, port = node.bound_address.rsplit(":", 1)
    await asyncio.to_thread(node.stop)
    with pytest.raises(ConnectionRefusedError):  # the server is gone
        socket.create_connection((host, int(port)), timeout=5).close()
    with pytest.raises(RuntimeError, match="started already"):
        await node.start_async()


# grpc's Server.__del__ cannot schedule its own shutdown on the closed loop, and says so.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.filterwarnings("ignore:coroutine .AioServer.shutdown. was never awaited")
def test_stop_after_the_loop_a_node_ran_on_has_ended_does_nothing() -> None:
    node = asyncio.run(Node().start_async())  # never stopped on its loop

    node.stop()

    assert not node._running
    del node
    gc.collect()  # grpc's complaint, here rather than in a later test


def test_a_node_starts_once() -> None:
    with Node() as node, pytest.raises(RuntimeError, match="starts once"):
        node.start()


@pytest.mark.parametrize("on_loop", [False, True], ids=["own-thread", "on-loop"])
def test_what_is_told_before_start_leaves_once_the_node_starts(on_loop: bool) -> None:
    with Node() as b:
        sink = Sink()
        b.register("sink", sink)
        a = Node()
        a.ref(f"{b.address}/sink").tell(Request(0, 10, True, False))  # queued, no writer yet
        # Its writer starts once the node has an address: its first frame, the link's
        # hello, says who is dialling (an empty one is refused).
        assert not a._tasks
        if on_loop:

            async def start_and_stop() -> None:
                async with a:
                    await asyncio.to_thread(sink.wait, 1)

            asyncio.run(start_and_stop())
        else:
            with a:
                sink.wait(1)
    assert sink.messages == [Request(0, 10, True, False)]


class Recorder:
    def __init__(self) -> None:
        self.told: list[Any] = []

    def tell(self, message: Any) -> None:
        if not isinstance(message, PeerLinkChanged):
            self.told.append(message)


async def test_an_async_consumer_gives_the_loop_a_turn_after_telling_the_producer_side() -> None:
    """A transport on the consumer's loop writes the consumer's Request only when the loop
    runs: the next `receive` after the core told something lets it run once, and the
    others go on without a turn."""
    producer_side = Recorder()
    consumer = AsyncConsumer(ConsumerControllerSettings(flow_control_window=4))
    for seq_nr in range(1, 5):
        consumer.ref.tell(SequencedMessage("p", seq_nr, seq_nr, seq_nr == 1, False, producer_side))
    turns = []
    for _ in range(4):
        ran = []
        asyncio.get_running_loop().call_soon(ran.append, True)
        delivery = await consumer.receive(timeout=WAIT)
        turns.append((bool(ran), len(producer_side.told)))
        delivery.confirm()
    consumer.close()
    # 1: receiving the first message tells the first Request (no turn: nothing was told
    # before this receive); confirming it tells another (as the original does), and
    # confirming 2 (half the window left) a third: the next receive after each takes a
    # turn; confirming 3 tells nothing: 4 takes none.
    assert turns == [(False, 1), (True, 2), (True, 3), (False, 3)]


class _CountingTime:
    """The node module's ``time``, counting ``sleep(0)`` calls (GIL hand-offs), on
    ``thread`` only if given (other tests' threads may still be winding down)."""

    def __init__(self, thread: int | None = None) -> None:
        self.thread = thread
        self.handoffs = 0

    def sleep(self, seconds: float) -> None:
        if seconds == 0 and self.thread in (None, threading.get_ident()):
            self.handoffs += 1
        time.sleep(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


async def test_a_writer_woken_by_a_sender_on_its_loop_does_not_hand_the_gil_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sender sharing the node's loop has finished its burst when the writer runs:
    giving the GIL away there only delays the write (a thread of grpc's takes it)."""
    counting = _CountingTime(threading.get_ident())  # the loop's: where the writers run
    monkeypatch.setattr(peer_module, "time", counting)
    async with Node() as a, Node() as b:
        assert await deliver(a, b, 3_000, window=500) == list(range(3_000))
        assert a.statistics().envelopes_sent / a.statistics().frames_sent >= 16  # bursts
    assert counting.handoffs == 0


def test_a_writer_woken_by_a_sender_on_another_thread_hands_the_gil_off_in_bursts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The control: a `Producer` on its own thread, nodes with loop threads of their own."""
    counting = _CountingTime()
    monkeypatch.setattr(peer_module, "time", counting)
    with Node() as a, Node() as b:
        settings = ConsumerControllerSettings(flow_control_window=500)
        producer = Producer("numbers", self_ref_factory=a.expose("numbers"))
        consumer = Consumer(settings, self_ref_factory=b.expose("numbers-consumer"))
        consumer.register_to(b.ref(f"{a.address}/numbers"))
        received = []

        def receive_all() -> None:
            for delivery in consumer:
                received.append(delivery.message)
                delivery.confirm()
                if len(received) == 3_000:
                    return

        reader = threading.Thread(target=receive_all)
        reader.start()
        for number in range(3_000):
            producer.send(number, timeout=WAIT)
        reader.join(WAIT)
        producer.close()
        consumer.close()
    assert received == list(range(3_000))
    assert counting.handoffs > 0
