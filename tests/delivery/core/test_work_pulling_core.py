"""WorkPullingSpec and DurableWorkPullingSpec on the pure `WorkPullingCore`.

The core runs on a `Driver` (tests/harness.py) with probes for the producer and for the
workers' consumer controllers, as the originals use test probes; a worker "registers" when
the test feeds the registry's listing (`CurrentWorkers`). What a worker's consumer
controller would answer, the test tells the ref stamped on the `SequencedMessage`, as the
original tells ``seqMsg.producerController``. The durable tests carry out the store effects
on a `MemoryDurableQueue` and assert its whole state (the original's ``assertState``
compares only ``currentSeqNr`` and ``highestConfirmedSeqNr``, a copy-paste slip; we compare
everything, qualifiers and confirmation map included, with the authors' evident intent).

Original test (reference sections 7.7, 7.8) -> test here:

WorkPullingSpec
1. illustrate work-pulling usage -> test_two_workers_share_the_work_each_in_its_own_sequence
2. resend unconfirmed to other if worker dies
   -> test_unconfirmed_messages_of_a_worker_that_leaves_go_to_another_worker
3. reply to MessageWithConfirmation
   -> test_message_with_confirmation_is_answered_when_the_worker_confirms
4. reply to MessageWithConfirmation also when worker dies
   -> test_message_with_confirmation_is_answered_also_when_its_worker_leaves
5. allow restart of producer -> test_a_new_producer_gets_the_outstanding_request_next

DurableWorkPullingSpec
1. load initial state and resend unconfirmed
   -> test_durable_loaded_unconfirmed_messages_go_out_before_the_producer_gets_demand
2. reply to MessageWithConfirmation after storage
   -> test_durable_message_with_confirmation_is_answered_once_stored
3. store confirmations -> test_durable_confirmations_are_stored_per_worker
4. hand over, and resend unconfirmed when worker is unregistered
   -> test_durable_hand_over_stores_a_leaving_workers_messages_again_for_another

Beyond the originals: the buffer and its limit, random choice among workers, refused
inputs, worker timers, durable restart and storage of waiting messages, settings, and a
seeded random test (Akka has none, TODO #28723): workers join and die, the network loses
messages, a durable controller crashes and restarts on its queue.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import pytest

from pykka_delivery.delivery.core.consumer import ConsumerCore
from pykka_delivery.delivery.core.effects import (
    Effect,
    StoreMessageConfirmed,
    StoreMessageSent,
)
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
    WorkPullingSettings,
)
from pykka_delivery.delivery.core.work_pulling import (
    CurrentWorkers,
    GetWorkerStats,
    WorkerMessage,
    WorkerStats,
    WorkPullingCore,
)
from pykka_delivery.delivery.messages import (
    ConsumerStart,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    RequestNext,
    SendNext,
)
from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableProducerState,
    MessageSent,
)
from pykka_delivery.errors import LocalProtocolError
from pykka_delivery.protocol.messages import Ack, ChunkedMessage, Request, Resend, SequencedMessage
from tests.harness import Driver, FakeClock, Network, Probe, SelfRef

TS = 1_700_000_000_000  # the fixed clock of the stored timestamps (Akka's TestTimestamp)
WINDOW = 20  # the originals' flow-control-window


class StoreDriver(Driver):
    """A `Driver` that also carries out the store effects, in order, on a queue."""

    def __init__(self, core: Any, clock: FakeClock, queue: MemoryDurableQueue | None) -> None:
        super().__init__(core, clock)
        self.queue = queue

    def apply(self, effects: Iterable[Effect]) -> list[Effect]:
        done: list[Effect] = []
        for effect in effects:
            if isinstance(effect, StoreMessageSent):
                assert self.queue is not None, f"no durable queue for {effect}"
                self.queue.store_message_sent(effect.sent)
                self.effects_log.append(effect)
                done.append(effect)
            elif isinstance(effect, StoreMessageConfirmed):
                assert self.queue is not None, f"no durable queue for {effect}"
                self.queue.store_message_confirmed(
                    effect.seq_nr, effect.qualifier, effect.timestamp_millis
                )
                self.effects_log.append(effect)
                done.append(effect)
            else:
                done += super().apply([effect])
        return done


class WorkPulling:
    """A work-pulling core with a producer probe; workers are probes registered by hand."""

    def __init__(
        self,
        *,
        queue: MemoryDurableQueue | None = None,
        buffer_size: int = 1000,
        seed: int = 7,
        start: bool = True,
    ) -> None:
        self.clock = FakeClock()
        self.queue = queue
        send_next, ask_next = SelfRef("send-next"), SelfRef("ask-next")
        self.core = WorkPullingCore(
            "p-1",
            send_next,
            ask_next,
            self._worker_ref,
            WorkPullingSettings(buffer_size=buffer_size),
            rng=random.Random(seed),
            durable_state=None if queue is None else queue.load_state(),
            clock_millis=lambda: TS,
        )
        self.driver = StoreDriver(self.core, self.clock, queue)
        send_next.target = lambda m: self.driver.feed(SendNext(m))
        ask_next.target = self.driver.feed
        self.producer = Probe("producer")
        self.registered: set[Any] = set()
        if start:
            self.driver.feed(ProducerStart(self.producer))

    def _worker_ref(self, worker_id: str) -> SelfRef:
        ref = SelfRef(f"pc-{worker_id[:8]}")
        ref.target = lambda m: self.driver.feed(WorkerMessage(worker_id, m))
        return ref

    def register(self, worker: Any) -> None:
        self.registered.add(worker)
        self.driver.feed(CurrentWorkers(frozenset(self.registered)))

    def deregister(self, worker: Any) -> None:
        self.registered.discard(worker)
        self.driver.feed(CurrentWorkers(frozenset(self.registered)))

    def send(self, text: str, producer: Probe | None = None) -> None:
        """Wait for (take) the next `RequestNext` and send ``text``."""
        (producer or self.producer).expect_type(RequestNext).send_next_to.tell(text)

    def ask(self, text: str, reply_to: Probe) -> None:
        """Take the next `RequestNext` and send ``text`` with confirmation."""
        request_next = self.producer.expect_type(RequestNext)
        request_next.ask_next_to.tell(MessageWithConfirmation(text, reply_to))

    def worker_id(self, worker: Any) -> str:
        (found,) = [
            w.worker_id for w in self.core.snapshot().workers if w.consumer_controller is worker
        ]
        return found

    def number_of_workers(self) -> int:
        """Akka's ``awaitWorkersRegistered``: the answer to `GetWorkerStats`."""
        reply_to = Probe("stats")
        self.driver.feed(GetWorkerStats(reply_to))
        return int(reply_to.expect_type(WorkerStats).number_of_workers)


def seq_msg(worker: Probe) -> SequencedMessage:
    got: SequencedMessage = worker.expect_type(SequencedMessage)
    return got


def sent(seq_nr: int, text: str, worker_id: str, ack: bool = False) -> MessageSent:
    return MessageSent(seq_nr, text, ack, worker_id, TS)


# --- WorkPullingSpec -------------------------------------------------------------------


class _AppConsumer:
    """Confirms each `Delivery` through the network queue, recording it."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []

    def tell(self, delivery: Any) -> None:
        assert isinstance(delivery, Delivery), delivery
        self.deliveries.append(delivery)
        delivery.confirm()  # the consumer controller's ref is a network link: queued


def test_two_workers_share_the_work_each_in_its_own_sequence() -> None:
    """WorkPullingSpec: illustrate work-pulling usage.

    Two worker consumer cores (window 20) and the work-pulling core talk over an in-memory
    network; the producer answers each `RequestNext` with the next ``msg-<n>``. The
    original stops each consumer at its seq_nr 42 with the producer still going; we stop
    the producer at 100 messages and check more: each message reaches exactly one worker,
    once, and each worker sees its own session numbered 1, 2, 3, ... Then both workers
    leave and the worker count drops to 0.
    """
    clock, network = FakeClock(), Network()
    total = 100
    holder: dict[str, Driver] = {}

    def worker_ref(worker_id: str) -> Any:
        return network.link(lambda m: holder["wp"].feed(WorkerMessage(worker_id, m)))

    send_next, ask_next = SelfRef("send-next"), SelfRef("ask-next")
    core = WorkPullingCore("p-1", send_next, ask_next, worker_ref, rng=random.Random(3))
    wp = holder["wp"] = Driver(core, clock)  # type: ignore[arg-type]
    send_next.target = lambda m: wp.feed(SendNext(m))
    produced: list[str] = []

    class AppProducer:
        def tell(self, request_next: Any) -> None:
            assert isinstance(request_next, RequestNext), request_next
            if len(produced) < total:
                produced.append(f"msg-{len(produced) + 1}")
                network.queue.append((request_next.send_next_to.tell, produced[-1]))

    consumers = []
    cc_refs = []
    for _ in range(2):
        box: dict[str, Driver] = {}
        cc_ref = network.link(lambda m, box=box: box["cc"].feed(m))
        cc_core = ConsumerCore(cc_ref, ConsumerControllerSettings(flow_control_window=WINDOW))
        cc = box["cc"] = Driver(cc_core, clock)
        cc.apply(cc_core.on_spawned())
        consumer = _AppConsumer()
        cc.feed(ConsumerStart(consumer))
        consumers.append(consumer)
        cc_refs.append(cc_ref)

    wp.feed(ProducerStart(AppProducer()))
    wp.feed(CurrentWorkers(frozenset(cc_refs)))
    for _ in range(400):
        network.run()
        if sum(len(c.deliveries) for c in consumers) == total:
            break
        clock.advance(0.25)

    delivered = [d.message for c in consumers for d in c.deliveries]
    assert sorted(delivered) == sorted(produced) == sorted(f"msg-{i}" for i in range(1, 101))
    for consumer in consumers:
        assert consumer.deliveries, "random choice among workers with demand left one idle"
        seq_nrs = [d.seq_nr for d in consumer.deliveries]
        assert seq_nrs == list(range(1, len(seq_nrs) + 1))
        assert len({d.producer_id for d in consumer.deliveries}) == 1
    assert consumers[0].deliveries[0].producer_id != consumers[1].deliveries[0].producer_id
    assert core.statistics().confirmed == total

    wp.feed(CurrentWorkers(frozenset()))
    reply_to = Probe("stats")
    wp.feed(GetWorkerStats(reply_to))
    reply_to.expect(WorkerStats(0))


def test_unconfirmed_messages_of_a_worker_that_leaves_go_to_another_worker() -> None:
    """WorkPullingSpec: resend unconfirmed to other if worker dies."""
    wp = WorkPulling()
    worker1, worker2 = Probe("worker1"), Probe("worker2")
    wp.register(worker1)
    assert wp.number_of_workers() == 1

    wp.send("msg-1")
    msg1 = seq_msg(worker1)
    assert msg1 == SequencedMessage(f"p-1-{wp.worker_id(worker1)}", 1, "msg-1", True, True, None)
    msg1.producer_controller.tell(Request(1, 10))
    wp.send("msg-2")
    assert seq_msg(worker1).message == "msg-2"
    wp.send("msg-3")
    assert seq_msg(worker1).message == "msg-3"

    wp.register(worker2)
    assert wp.number_of_workers() == 2
    wp.deregister(worker1)
    assert wp.number_of_workers() == 1

    # msg-2 and msg-3 were not confirmed: they go to worker2, in a session of its own.
    msg2 = seq_msg(worker2)
    assert (msg2.message, msg2.seq_nr, msg2.first) == ("msg-2", 1, True)
    msg2.producer_controller.tell(Request(1, 10))
    assert seq_msg(worker2).message == "msg-3"
    wp.send("msg-4")
    assert seq_msg(worker2).message == "msg-4"
    worker1.expect_no_message()

    wp.deregister(worker2)
    assert wp.number_of_workers() == 0


def test_message_with_confirmation_is_answered_when_the_worker_confirms() -> None:
    """WorkPullingSpec: reply to MessageWithConfirmation.

    The reply is the message's seq_nr in the controller's numbering (Akka replies
    ``Done``; ours, like the point-to-point controller's, says which message).
    """
    wp = WorkPulling()
    worker1, replies = Probe("worker1"), Probe("replies")
    wp.register(worker1)

    wp.ask("msg-1", replies)
    msg1 = seq_msg(worker1)
    assert (msg1.message, msg1.ack) == ("msg-1", True)
    msg1.producer_controller.tell(Request(1, 10))
    replies.expect(1)

    wp.ask("msg-2", replies)
    msg2 = seq_msg(worker1)
    assert (msg2.message, msg2.ack) == ("msg-2", True)
    replies.expect_no_message()  # no reply until the worker acknowledges it
    msg2.producer_controller.tell(Ack(2))
    replies.expect(2)

    wp.ask("msg-3", replies)
    wp.ask("msg-4", replies)
    assert [m.message for m in worker1.drain()] == ["msg-3", "msg-4"]
    msg2.producer_controller.tell(Ack(4))
    assert replies.drain() == [3, 4]

    wp.deregister(worker1)
    assert wp.number_of_workers() == 0


def test_message_with_confirmation_is_answered_also_when_its_worker_leaves() -> None:
    """WorkPullingSpec: reply to MessageWithConfirmation also when worker dies."""
    wp = WorkPulling()
    worker1, worker2, replies = Probe("worker1"), Probe("worker2"), Probe("replies")
    wp.register(worker1)

    wp.ask("msg-1", replies)
    msg1 = seq_msg(worker1)
    msg1.producer_controller.tell(Request(1, 10))
    replies.expect(1)
    wp.ask("msg-2", replies)
    seq_msg(worker1)
    msg1.producer_controller.tell(Ack(2))
    replies.expect(2)
    wp.ask("msg-3", replies)
    wp.ask("msg-4", replies)
    assert len(worker1.drain()) == 2

    wp.register(worker2)
    wp.deregister(worker1)
    assert wp.number_of_workers() == 1
    replies.expect_no_message()

    # msg-3 and msg-4 were not confirmed: worker2 gets them, and confirms them.
    msg3 = seq_msg(worker2)
    assert (msg3.message, msg3.seq_nr) == ("msg-3", 1)
    msg3.producer_controller.tell(Request(1, 10))
    replies.expect(3)
    assert seq_msg(worker2).message == "msg-4"
    msg3.producer_controller.tell(Ack(2))
    replies.expect(4)

    wp.deregister(worker2)
    assert wp.number_of_workers() == 0


def test_a_new_producer_gets_the_outstanding_request_next() -> None:
    """WorkPullingSpec: allow restart of producer."""
    wp = WorkPulling()
    worker1 = Probe("worker1")
    wp.register(worker1)

    wp.send("msg-1")
    msg1 = seq_msg(worker1)
    assert msg1.message == "msg-1"
    msg1.producer_controller.tell(Request(1, 10))
    wp.send("msg-2")
    assert seq_msg(worker1).message == "msg-2"
    wp.producer.expect_type(RequestNext)  # held by the producer that is replaced

    producer2 = Probe("producer2")
    wp.driver.feed(ProducerStart(producer2))

    wp.send("msg-3", producer2)
    assert seq_msg(worker1).message == "msg-3"
    wp.send("msg-4", producer2)
    assert seq_msg(worker1).message == "msg-4"
    wp.producer.expect_no_message()


# --- DurableWorkPullingSpec ------------------------------------------------------------


def test_durable_loaded_unconfirmed_messages_go_out_before_the_producer_gets_demand() -> None:
    """DurableWorkPullingSpec: load initial state and resend unconfirmed.

    We also check the queue: each loaded message is stored again under a new seq_nr and
    the worker's qualifier, and its old entry confirmed (Akka's ``ResendDurableMsg``).
    """
    queue = MemoryDurableQueue(
        DurableProducerState(
            current_seq_nr=5,
            highest_confirmed_seq_nr=2,
            confirmed_seq_nr={NO_QUALIFIER: (2, TS)},
            unconfirmed=(
                MessageSent(3, "msg-3", False, NO_QUALIFIER, TS),
                MessageSent(4, "msg-4", False, NO_QUALIFIER, TS),
            ),
        )
    )
    wp = WorkPulling(queue=queue)
    worker1 = Probe("worker1")
    wp.register(worker1)

    wp.producer.expect_no_message()  # it has unconfirmed messages to send first
    msg3 = seq_msg(worker1)
    assert (msg3.message, msg3.seq_nr) == ("msg-3", 1)
    msg3.producer_controller.tell(Request(1, 10))
    assert seq_msg(worker1).message == "msg-4"
    wp.send("msg-5")
    assert seq_msg(worker1).message == "msg-5"

    w1 = wp.worker_id(worker1)
    assert queue.state == DurableProducerState(
        8, 5, {NO_QUALIFIER: (4, TS), w1: (5, TS)}, (sent(6, "msg-4", w1), sent(7, "msg-5", w1))
    )
    wp.deregister(worker1)
    assert wp.number_of_workers() == 0


def test_durable_message_with_confirmation_is_answered_once_stored() -> None:
    """DurableWorkPullingSpec: reply to MessageWithConfirmation after storage."""
    queue = MemoryDurableQueue()
    wp = WorkPulling(queue=queue)
    worker1, replies = Probe("worker1"), Probe("replies")
    wp.register(worker1)

    wp.ask("msg-1", replies)
    replies.expect(1)  # stored: no need to wait for the worker
    msg1 = seq_msg(worker1)
    assert (msg1.message, msg1.ack) == ("msg-1", True)
    msg1.producer_controller.tell(Request(1, 10))

    wp.ask("msg-2", replies)
    replies.expect(2)  # after storage, without the worker's Ack
    msg2 = seq_msg(worker1)
    assert (msg2.message, msg2.ack) == ("msg-2", True)
    msg2.producer_controller.tell(Ack(2))

    wp.ask("msg-3", replies)
    wp.ask("msg-4", replies)
    assert replies.drain() == [3, 4]
    assert len(worker1.drain()) == 2
    msg2.producer_controller.tell(Ack(4))

    w1 = wp.worker_id(worker1)
    assert queue.state == DurableProducerState(5, 4, {w1: (4, TS)}, ())
    replies.expect_no_message()  # confirmations do not answer twice


def _four_messages_to_worker1(wp: WorkPulling, worker1: Probe, *, asks: bool) -> str:
    """The common start of DurableWorkPullingSpec 3 and 4: msg-1 confirmed, msg-2..5 sent
    to worker1 (window up to 5) and unconfirmed. Returns worker1's id."""
    queue = wp.queue
    assert queue is not None
    wp.register(worker1)
    w1 = wp.worker_id(worker1)

    wp.send("msg-1")
    assert queue.state == DurableProducerState(2, 0, {}, (sent(1, "msg-1", w1),))
    msg1 = seq_msg(worker1)
    assert msg1.message == "msg-1"
    msg1.producer_controller.tell(Request(1, 5))
    assert queue.state == DurableProducerState(2, 1, {w1: (1, TS)}, ())

    replies = Probe("replies")
    for n in (2, 3, 4, 5):
        if asks and n % 2 == 0:
            wp.ask(f"msg-{n}", replies)
        else:
            wp.send(f"msg-{n}")
    got = worker1.drain()
    assert [m.message for m in got] == ["msg-2", "msg-3", "msg-4", "msg-5"]
    assert got[-1].seq_nr == 5
    wp.producer.expect_no_message()  # no more demand: 5 sent, no Ack
    assert queue.state == DurableProducerState(
        6,
        1,
        {w1: (1, TS)},
        tuple(sent(n, f"msg-{n}", w1, asks and n % 2 == 0) for n in (2, 3, 4, 5)),
    )
    return w1


def test_durable_confirmations_are_stored_per_worker() -> None:
    """DurableWorkPullingSpec: store confirmations."""
    queue = MemoryDurableQueue()
    wp = WorkPulling(queue=queue)
    worker1, worker2 = Probe("worker1"), Probe("worker2")
    w1 = _four_messages_to_worker1(wp, worker1, asks=True)
    unconfirmed = tuple(sent(n, f"msg-{n}", w1, n % 2 == 0) for n in (2, 3, 4, 5))

    wp.register(worker2)
    assert wp.number_of_workers() == 2
    w2 = wp.worker_id(worker2)
    wp.send("msg-6")
    assert queue.state == DurableProducerState(
        7, 1, {w1: (1, TS)}, (*unconfirmed, sent(6, "msg-6", w2))
    )
    msg6 = seq_msg(worker2)
    assert (msg6.message, msg6.seq_nr) == ("msg-6", 1)  # another session
    msg6.producer_controller.tell(Request(1, 5))
    assert queue.state == DurableProducerState(7, 6, {w1: (1, TS), w2: (6, TS)}, unconfirmed)

    msg6_of_worker1 = wp.core.workers[w1].core.self_ref
    msg6_of_worker1.tell(Ack(3))
    assert queue.state == DurableProducerState(7, 6, {w1: (3, TS), w2: (6, TS)}, unconfirmed[2:])

    wp.deregister(worker1)
    wp.deregister(worker2)
    assert wp.number_of_workers() == 0


def test_durable_hand_over_stores_a_leaving_workers_messages_again_for_another() -> None:
    """DurableWorkPullingSpec: hand over, and resend unconfirmed when worker is unregistered.

    Where the original expects ``ack = true`` for msg-2 and msg-4 after worker2's Request
    (copy-paste from the previous test: every message here was sent without
    confirmation) we expect False.
    """
    queue = MemoryDurableQueue()
    wp = WorkPulling(queue=queue)
    worker1, worker2 = Probe("worker1"), Probe("worker2")
    w1 = _four_messages_to_worker1(wp, worker1, asks=False)
    unconfirmed = tuple(sent(n, f"msg-{n}", w1) for n in (2, 3, 4, 5))

    wp.register(worker2)
    w2 = wp.worker_id(worker2)
    wp.send("msg-6")
    msg6 = seq_msg(worker2)
    assert msg6.message == "msg-6"
    msg6.producer_controller.tell(Request(1, 3))  # only requesting up to 3
    assert queue.state == DurableProducerState(7, 6, {w1: (1, TS), w2: (6, TS)}, unconfirmed)

    wp.deregister(worker1)
    assert wp.number_of_workers() == 1

    # msg-2..5 were sent to worker1 and not confirmed: worker2 gets them, as far as its
    # window allows.
    msg7 = seq_msg(worker2)
    assert msg7.message == "msg-2"
    msg8 = seq_msg(worker2)
    assert (msg8.message, msg8.seq_nr) == ("msg-3", 3)
    worker2.expect_no_message()  # it requested up to 3 only
    msg8.producer_controller.tell(Request(3, 10))
    msg9 = seq_msg(worker2)
    assert msg9.message == "msg-4"
    msg10 = seq_msg(worker2)
    assert msg10.message == "msg-5"

    msg9.producer_controller.tell(Ack(msg9.seq_nr))
    # Stored again as 7..10 under worker2; the old 2..5 confirmed by the hand-over.
    assert queue.state == DurableProducerState(
        11, 9, {w1: (5, TS), w2: (9, TS)}, (sent(10, "msg-5", w2),)
    )

    wp.deregister(worker2)
    assert wp.number_of_workers() == 0


# --- beyond the originals --------------------------------------------------------------


def test_the_producer_gets_no_request_next_before_a_worker_has_demand() -> None:
    """With no worker there is no demand: the producer waits; the first worker's demand
    brings the `RequestNext`."""
    wp = WorkPulling()
    wp.producer.expect_no_message()
    worker1 = Probe("worker1")

    wp.register(worker1)

    request_next = wp.producer.expect_type(RequestNext)
    assert (request_next.producer_id, request_next.current_seq_nr) == ("p-1", 1)


def test_messages_sent_without_request_next_wait_for_a_worker() -> None:
    """A message sent with no worker waits in the buffer (Akka would refuse it) and goes,
    in order, to the first worker with demand; the producer's `RequestNext` comes once
    the buffer is empty."""
    wp = WorkPulling()
    worker1 = Probe("worker1")
    for n in (1, 2, 3):
        wp.driver.feed(SendNext(f"msg-{n}"))
    assert wp.core.snapshot().buffered == (1, 2, 3)

    wp.register(worker1)
    first = seq_msg(worker1)
    assert first.message == "msg-1"
    wp.producer.expect_no_message()  # msg-2 and msg-3 still wait: window of 1 until Request
    first.producer_controller.tell(Request(1, 10))

    assert [m.message for m in worker1.drain()] == ["msg-2", "msg-3"]
    assert wp.producer.expect_type(RequestNext).current_seq_nr == 4
    assert wp.core.snapshot().buffered == ()


def test_a_message_beyond_buffer_size_is_refused_naming_the_setting() -> None:
    """The buffer holds ``buffer_size`` messages; one more sent without `RequestNext` is
    refused with an error naming the setting, and nothing changes."""
    wp = WorkPulling(buffer_size=2)
    wp.driver.feed(SendNext("msg-1"))
    wp.driver.feed(SendNext("msg-2"))
    before = wp.core.snapshot()

    with pytest.raises(LocalProtocolError, match=r"buffer_size is 2.*RequestNext"):
        wp.driver.feed(SendNext("msg-3"))

    assert wp.core.snapshot() == before
    assert wp.core.statistics().rejected == 1
    worker1 = Probe("worker1")
    wp.register(worker1)
    seq_msg(worker1).producer_controller.tell(Request(1, 10))
    assert [m.message for m in worker1.drain()] == ["msg-2"]


def test_a_requested_message_is_accepted_even_with_a_full_buffer() -> None:
    """Messages of a worker that left are never refused, so they can fill the buffer past
    its size; the message the producer was granted is still accepted."""
    wp = WorkPulling(buffer_size=2)
    worker1 = Probe("worker1")
    wp.register(worker1)
    wp.send("msg-1")
    seq_msg(worker1).producer_controller.tell(Request(1, 10))
    for n in (2, 3):
        wp.send(f"msg-{n}")
    request_next = wp.producer.expect_type(RequestNext)  # granted while worker1 had demand

    wp.deregister(worker1)  # msg-2 and msg-3 (unconfirmed) fill the buffer
    request_next.send_next_to.tell("msg-4")

    assert wp.core.snapshot().buffered == (2, 3, 4)
    with pytest.raises(LocalProtocolError, match="buffer_size"):
        wp.driver.feed(SendNext("msg-5"))


def test_messages_go_to_workers_with_demand_chosen_at_random() -> None:
    """Each message goes to one of the workers with demand, at random: with two workers
    with demand both get some."""
    wp = WorkPulling(seed=11)
    workers = [Probe("worker1"), Probe("worker2")]
    for worker in workers:
        wp.register(worker)
    got: dict[str, list[str]] = {w.name: [] for w in workers}

    for n in range(1, 41):
        wp.send(f"msg-{n}")
        for worker in workers:
            for m in worker.drain():
                got[worker.name].append(m.message)
                if m.first:  # the worker's consumer controller opens its window
                    m.producer_controller.tell(Request(1, 100))

    assert sorted(got["worker1"] + got["worker2"]) == sorted(f"msg-{n}" for n in range(1, 41))
    assert min(len(g) for g in got.values()) >= 5, got


def test_a_message_from_a_worker_that_left_is_ignored() -> None:
    """A `Request` from the consumer controller of a worker that left changes nothing."""
    wp = WorkPulling()
    worker1 = Probe("worker1")
    wp.register(worker1)
    wp.send("msg-1")
    ref = seq_msg(worker1).producer_controller
    wp.deregister(worker1)
    before = wp.core.snapshot()

    ref.tell(Request(1, 10))

    assert wp.core.snapshot() == before
    wp.producer.expect_no_message()


def test_inputs_a_work_pulling_controller_does_not_take_are_refused() -> None:
    """Unknown messages, and a worker message other than Request, Ack or Resend, raise
    `LocalProtocolError` naming the message; the state does not change."""
    wp = WorkPulling()
    worker1 = Probe("worker1")
    wp.register(worker1)
    worker_id = wp.worker_id(worker1)
    before = wp.core.snapshot()

    with pytest.raises(LocalProtocolError, match="cannot handle str"):
        wp.driver.feed("hello")
    with pytest.raises(LocalProtocolError, match="cannot handle SendNext from worker"):
        wp.driver.feed(WorkerMessage(worker_id, SendNext("x")))

    assert wp.core.snapshot() == before
    assert wp.core.statistics().rejected == 2


def test_durable_message_waiting_for_a_worker_is_stored_before_it_waits() -> None:
    """With a durable queue a message that finds no worker is stored at once (qualifier
    `NO_QUALIFIER`), so a crash cannot lose it; when a worker takes it, it is stored again
    under the worker's qualifier and the first entry confirmed."""
    queue = MemoryDurableQueue()
    wp = WorkPulling(queue=queue)
    replies = Probe("replies")
    wp.driver.feed(MessageWithConfirmation("msg-1", replies))
    assert queue.state == DurableProducerState(
        2, 0, {}, (MessageSent(1, "msg-1", True, NO_QUALIFIER, TS),)
    )
    replies.expect(1)  # stored

    worker1 = Probe("worker1")
    wp.register(worker1)
    w1 = wp.worker_id(worker1)
    assert seq_msg(worker1).message == "msg-1"
    assert queue.state == DurableProducerState(
        3, 1, {NO_QUALIFIER: (1, TS)}, (sent(2, "msg-1", w1),)
    )


def test_durable_restart_sends_every_unconfirmed_message_again() -> None:
    """A work-pulling controller started again on the queue of one that stopped with
    messages unconfirmed at two workers sends each of them again, to the new workers,
    and numbers new messages after them."""
    queue = MemoryDurableQueue()
    wp = WorkPulling(queue=queue, seed=5)
    worker1, worker2 = Probe("worker1"), Probe("worker2")
    wp.register(worker1)
    wp.send("msg-1")
    seq_msg(worker1).producer_controller.tell(Request(0, 10))
    wp.register(worker2)
    for n in (2, 3, 4, 5):
        wp.send(f"msg-{n}")
    first2 = [m for m in worker2.drain() if m.first]
    if first2:  # open worker2's window too
        first2[0].producer_controller.tell(Request(0, 10))
    worker1.drain()
    state = queue.state
    assert {m.message for m in state.unconfirmed} == {f"msg-{n}" for n in range(1, 6)}

    restarted = WorkPulling(queue=MemoryDurableQueue(state))  # the same queue, restarted
    worker3 = Probe("worker3")
    restarted.register(worker3)
    msgs = [seq_msg(worker3)]
    msgs[0].producer_controller.tell(Request(1, 10))
    msgs += worker3.drain()
    assert sorted(m.message for m in msgs) == [f"msg-{n}" for n in range(1, 6)]
    assert [m.seq_nr for m in msgs] == [1, 2, 3, 4, 5]
    next_seq_nr = restarted.producer.expect_type(RequestNext).current_seq_nr
    assert next_seq_nr == state.current_seq_nr + 5


def test_durable_state_of_a_point_to_point_queue_is_refused() -> None:
    """A durable state holding chunked messages belongs to a point-to-point producer
    controller: the work-pulling core refuses it, naming the fix."""
    chunk = ChunkedMessage(b"m", True, False, 1, "")
    state = DurableProducerState(2, 0, {}, (MessageSent(1, chunk, False, NO_QUALIFIER, TS),))

    with pytest.raises(ValueError, match=r"queue .*of its own"):
        WorkPullingCore(
            "p-1",
            Probe(),
            Probe(),
            lambda _: Probe(),
            durable_state=state,
            clock_millis=lambda: TS,
        )


def test_worker_timers_are_prefixed_and_cancelled_when_the_worker_leaves() -> None:
    """A worker's first-message resend timer runs under its worker id and fires for its
    producer core only; it is cancelled when the worker leaves."""
    wp = WorkPulling()
    worker1 = Probe("worker1")
    wp.register(worker1)
    wp.send("msg-1")
    key = f"{wp.worker_id(worker1)}/resend_first"
    assert wp.clock.is_running(wp.driver, key)
    seq_msg(worker1)

    wp.clock.advance(1.0)
    again = seq_msg(worker1)
    assert (again.message, again.first) == ("msg-1", True)
    wp.deregister(worker1)
    assert not wp.clock.is_running(wp.driver, key)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"buffer_size": 0}, "buffer_size must be an int of at least 1"),
        ({"dead_worker_check_interval": 0}, "dead_worker_check_interval must be above 0"),
        (
            {"producer_controller_settings": ProducerControllerSettings(chunk_large_messages=9)},
            "chunk_large_messages must be 0 for work pulling",
        ),
    ],
)
def test_settings_are_validated_naming_the_setting(kwargs: dict[str, Any], match: str) -> None:
    """Bad settings raise `ValueError` naming the setting and the accepted range."""
    with pytest.raises(ValueError, match=match):
        WorkPullingSettings(**kwargs)


# --- random: workers come and go over a lossy network (upstream TODO #28723) -----------


class _SimWorker:
    """A worker: a consumer core on the network, and its application, which confirms each
    delivery. A worker that dies stops at once: nothing reaches it or leaves it again."""

    def __init__(self, sim: _Simulation, name: str, drop: float) -> None:
        self.name = name
        self.dead = False
        self.deliveries: list[Delivery] = []
        rnd = sim.rnd

        def fate(message: Any) -> str:
            if self.dead:
                return "drop"
            lossy = isinstance(message, SequencedMessage) and rnd.random() < drop
            return "drop" if lossy else "deliver"

        self.ref = sim.network.link(self._feed, fate)
        local = sim.network.link(self._feed, lambda _: "drop" if self.dead else "deliver")
        settings = ConsumerControllerSettings(
            flow_control_window=WINDOW, resend_interval_min=0.5, resend_interval_max=2.0
        )
        core = ConsumerCore(self.ref, settings, confirm_to=local)
        self.cc = Driver(core, sim.clock)
        self.cc.apply(core.on_spawned())
        self.cc.feed(ConsumerStart(self))

    def __repr__(self) -> str:
        return self.name

    def _feed(self, message: Any) -> None:
        if not self.dead:
            self.cc.feed(message)

    def tell(self, delivery: Any) -> None:
        assert isinstance(delivery, Delivery), delivery
        if not self.dead:
            self.deliveries.append(delivery)
            delivery.confirm()


class _Simulation:
    """A work-pulling core, workers joining and dying, a lossy network; with a durable
    queue the work-pulling controller may also crash and start again on its queue."""

    def __init__(self, seed: int, n: int, durable: bool) -> None:
        self.rnd = rnd = random.Random(seed)
        self.n = n
        self.clock, self.network = FakeClock(), Network()
        self.queue = MemoryDurableQueue() if durable else None
        self.consumer_drop = 0.1 + rnd.random() * 0.2
        self.producer_drop = 0.1 + rnd.random() * 0.2
        self.workers: list[_SimWorker] = []
        self.generation = 0
        self.texts = [f"msg-{i}" for i in range(1, n + 1)]
        self.accepted = 0  # texts accepted by a work-pulling controller
        self.violations: list[str] = []
        self._start_controller()

    # The work-pulling controller; a restart makes every ref of the old one dead.

    def _start_controller(self) -> None:
        if self.generation:
            self.wp.stopped = True  # the crashed controller's timers fire no more
        self.generation += 1
        generation = self.generation
        send_next, ask_next = SelfRef("send-next"), SelfRef("ask-next")
        core = WorkPullingCore(
            "p",
            send_next,
            ask_next,
            lambda wid: self._worker_ref(generation, wid),
            rng=random.Random(self.rnd.random()),
            durable_state=None if self.queue is None else self.queue.load_state(),
            clock_millis=lambda: TS,
        )
        self.core = core
        self.wp = StoreDriver(core, self.clock, self.queue)
        send_next.target = lambda m: self._accept(generation, m)
        self.outstanding = False
        self.wp.feed(ProducerStart(_AppProducer(self, generation)))
        self.wp.feed(CurrentWorkers(frozenset(w.ref for w in self.workers if not w.dead)))

    def _worker_ref(self, generation: int, worker_id: str) -> Any:
        def deliver(message: Any) -> None:
            if generation == self.generation:
                self.wp.feed(WorkerMessage(worker_id, message))

        def fate(message: Any) -> str:
            lossy = isinstance(message, Request | Resend)
            return "drop" if lossy and self.rnd.random() < self.producer_drop else "deliver"

        return self.network.link(deliver, fate)

    def _accept(self, generation: int, text: Any) -> None:
        if generation == self.generation:  # else: lost with the crashed controller
            self.accepted += 1
            self.wp.feed(SendNext(text))

    def on_request_next(self, generation: int) -> None:
        if generation != self.generation:
            return
        if self.outstanding:
            self.violations.append("RequestNext while one was outstanding")
        self.outstanding = True
        if self.accepted < self.n:
            text = self.texts[self.accepted]
            self.network.queue.append((self._send, (generation, text)))

    def _send(self, args: tuple[int, str]) -> None:
        generation, text = args
        if generation == self.generation:
            self.outstanding = False
        self._accept(generation, text)

    # Events.

    def add_worker(self) -> None:
        self.workers.append(_SimWorker(self, f"w{len(self.workers) + 1}", self.consumer_drop))
        self._listing()

    def kill_worker(self) -> None:
        live = [w for w in self.workers if not w.dead]
        if len(live) > 1:
            self.rnd.choice(live).dead = True
            self._listing()

    def restart_controller(self) -> None:
        assert self.queue is not None
        self._start_controller()

    def _listing(self) -> None:
        self.wp.feed(CurrentWorkers(frozenset(w.ref for w in self.workers if not w.dead)))

    # Running.

    def deliver(self, count: int) -> None:
        """Deliver up to ``count`` queued messages."""
        queue = self.network.queue
        for _ in range(count):
            if not queue:
                return
            target, message = queue.popleft()
            target(message)

    def processed(self) -> set[Any]:
        return {d.message for w in self.workers for d in w.deliveries}

    def done(self) -> bool:
        snapshot = self.core.snapshot()
        return (
            self.processed() == set(self.texts)
            and not snapshot.buffered
            and not any(w.unconfirmed for w in snapshot.workers)
            and (self.queue is None or not self.queue.state.unconfirmed)
        )

    def diagnostic(self) -> str:
        missing = sorted(set(self.texts) - self.processed())
        return (
            f"missing {missing}\n{self.core.snapshot()}\n{self.core.statistics()}\n"
            f"queue {self.queue and self.queue.state}"
        )


class _AppProducer:
    def __init__(self, sim: _Simulation, generation: int) -> None:
        self.sim = sim
        self.generation = generation

    def tell(self, message: Any) -> None:
        assert isinstance(message, RequestNext), message
        self.sim.on_request_next(self.generation)


@pytest.mark.parametrize("durable", [False, True], ids=["memory", "durable"])
@pytest.mark.parametrize("seed", range(10))
def test_random_workers_joining_and_dying_over_a_lossy_network(seed: int, durable: bool) -> None:
    """Beyond the originals (Akka has no random work-pulling test, TODO #28723): workers
    join and die at random while 10-30 % of the messages to consumer controllers and of
    their Requests and Resends are lost; with a durable queue the controller also crashes
    and starts again on its queue. Every message is processed (at least once: a worker
    that dies may have processed what it had not confirmed yet), each consumer controller
    hands its messages over in its sessions' order without duplicates, the producer never
    holds two `RequestNext`, and in the end nothing is unconfirmed, in memory or stored."""
    sim = _Simulation(seed, n=100, durable=durable)
    rnd = sim.rnd
    for _ in range(3):
        sim.add_worker()

    for _ in range(4000):
        sim.deliver(rnd.randint(1, 40))  # events fall between messages in flight
        if sim.done():
            break
        event = rnd.random()
        if event < 0.03:
            sim.add_worker()
        elif event < 0.06:
            sim.kill_worker()
        elif durable and event < 0.08:
            sim.restart_controller()
        if not sim.network.queue:
            sim.clock.advance(0.25)
    else:
        pytest.fail(f"seed {seed}: not done by virtual time {sim.clock.now}\n{sim.diagnostic()}")

    assert not sim.violations
    for worker in sim.workers:
        sessions: dict[str, list[int]] = {}
        for delivery in worker.deliveries:
            sessions.setdefault(delivery.producer_id, []).append(delivery.seq_nr)
        for seq_nrs in sessions.values():
            assert seq_nrs == list(range(seq_nrs[0], seq_nrs[0] + len(seq_nrs))), worker
