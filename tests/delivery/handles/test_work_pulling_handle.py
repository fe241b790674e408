"""The `WorkPullingProducer` handle, and `Consumer` handles as work-pulling workers.

The handle drives a `WorkPullingCore` in the caller's thread, and what a worker answers
is processed by the thread that tells it when the handle is free: a test that plays a
worker with a probe answers through the ref stamped on the `SequencedMessage`, and the
answer has been processed when ``tell`` returns. Workers register in a
`LocalServiceRegistry` of the test's own. Window 20, as in the originals.

Original test (WorkPullingSpec, reference section 7.7) -> test here:

1. illustrate work-pulling usage
   -> test_two_consumer_workers_share_the_work_each_in_its_own_session
2. resend unconfirmed to other if worker dies
   -> test_unconfirmed_messages_of_a_worker_that_leaves_go_to_another_worker
3. reply to MessageWithConfirmation
   -> test_send_and_confirm_returns_when_the_worker_acknowledges
4. reply to MessageWithConfirmation also when worker dies
   -> test_send_and_confirm_returns_also_when_its_worker_leaves
5. allow restart of producer: not ported. The handle is its own producer; there is no
   producer actor to replace.

DurableWorkPullingSpec 1, load initial state and resend unconfirmed
-> test_durable_loaded_unconfirmed_messages_go_out_before_send_has_demand. Its other
scenarios are properties of the core, which the handle shares with the actor
(tests/delivery/core/test_work_pulling_core.py).

Beyond the originals: the confirmation modes (``ack_each_message``), waiting and
timeouts, close, a failing durable queue, a worker that dies without deregistering,
`Consumer`'s service-key registration, and a run of 4 000 messages over four `Consumer`
workers on threads, one of which leaves mid-run.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
    WorkPullingSettings,
)
from pykka_delivery.delivery.handles.consumer import Consumer
from pykka_delivery.delivery.handles.work_pulling import WorkPullingProducer
from pykka_delivery.delivery.registry import LocalServiceRegistry
from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import (
    NO_QUALIFIER,
    DurableProducerState,
    DurableQueueError,
    MessageSent,
)
from pykka_delivery.errors import ClosedError, DeliveryTimeout, WouldBlock
from pykka_delivery.protocol.messages import Ack, Request, SequencedMessage
from tests.harness import Probe, wait_until

KEY = "worker"
WINDOW = 20
WAIT = 10.0
TS = 1_700_000_000_000
# No first-message resends from the timer thread while a test plays a worker by hand.
QUIET = WorkPullingSettings(
    producer_controller_settings=ProducerControllerSettings(resend_first_interval=60.0)
)


@pytest.fixture
def registry() -> LocalServiceRegistry:
    return LocalServiceRegistry()


@pytest.fixture
def producers(registry: LocalServiceRegistry) -> Iterator[Callable[..., WorkPullingProducer]]:
    """``make(**kwargs)`` builds a `WorkPullingProducer` on the test's registry; each is
    closed at the end."""
    made: list[WorkPullingProducer] = []

    def make(**kwargs: Any) -> WorkPullingProducer:
        kwargs.setdefault("settings", QUIET)
        kwargs.setdefault("rng", random.Random(7))
        made.append(WorkPullingProducer("p-1", KEY, registry=registry, **kwargs))
        return made[-1]

    yield make
    for producer in made:
        producer.close()


def seq_msg(worker: Probe) -> SequencedMessage:
    got: SequencedMessage = worker.expect_type(SequencedMessage)
    return got


class AckingWorker(Probe):
    """A worker that answers at once, as a consumer controller that confirms on delivery
    would: a `Request` for the first message of its session and each half window, an
    `Ack` for a message sent with ``ack``."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.requested = 0

    def tell(self, message: Any) -> None:
        super().tell(message)
        if type(message) is not SequencedMessage:
            return
        seq_nr = message.seq_nr
        if message.first or self.requested - seq_nr <= WINDOW // 2:
            self.requested = seq_nr + WINDOW
            message.producer_controller.tell(Request(seq_nr, self.requested))
        elif message.ack:
            message.producer_controller.tell(Ack(seq_nr))


def run_worker(consumer: Consumer, seen: list[tuple[str, int, bytes]], stop_after: int) -> None:
    """A worker thread: records and confirms each delivery; after ``stop_after`` (0:
    never) it closes its consumer itself, from its own thread, with nothing unconfirmed."""
    for delivery in consumer:
        seen.append((delivery.producer_id, delivery.seq_nr, delivery.message))
        delivery.confirm()
        if len(seen) == stop_after:
            consumer.close()


def worker_settings() -> ConsumerControllerSettings:
    return ConsumerControllerSettings(
        flow_control_window=WINDOW, resend_interval_min=0.05, resend_interval_max=0.2
    )


# --- WorkPullingSpec -----------------------------------------------------------------


def test_two_consumer_workers_share_the_work_each_in_its_own_session(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """WorkPullingSpec: illustrate work-pulling usage.

    Two `Consumer` handles registered under the key, each consumed on its own thread;
    the producer sends 200 messages and waits until all are confirmed. Each worker saw one
    session of its own (its own producer id, seq_nrs from 1 without gaps), together they
    processed every message once; closed, they leave the producer with no worker. (The
    original's test consumers stop at seq_nr 42 each while the producer sends without end;
    the handle sends a known number instead.)
    """
    producer = producers()
    consumers = [Consumer(worker_settings(), service_key=KEY, registry=registry) for _ in "ab"]
    seen: list[list[tuple[str, int, bytes]]] = [[], []]
    threads = [
        threading.Thread(target=run_worker, args=(c, s, 0), daemon=True)
        for c, s in zip(consumers, seen, strict=True)
    ]
    for thread in threads:
        thread.start()

    seq_nrs = [producer.send(b"msg-%d" % n, timeout=WAIT) for n in range(1, 201)]
    producer.wait_confirmed(timeout=WAIT)

    assert seq_nrs == list(range(1, 201))
    for worker in seen:
        assert len({producer_id for producer_id, _, _ in worker}) == 1
        assert [seq_nr for _, seq_nr, _ in worker] == list(range(1, len(worker) + 1))
    assert seen[0][0][0] != seen[1][0][0], "the two workers shared a session"
    messages = [m for worker in seen for _, _, m in worker]
    assert sorted(messages) == sorted(b"msg-%d" % n for n in range(1, 201))
    assert all(seen), "a worker got nothing"
    for consumer in consumers:
        consumer.close()
    for thread in threads:
        thread.join(WAIT)
    assert producer.worker_stats().number_of_workers == 0


def test_unconfirmed_messages_of_a_worker_that_leaves_go_to_another_worker(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """WorkPullingSpec: resend unconfirmed to other if worker dies.

    msg-1..3 go to worker1, which confirms only msg-1; worker2 registers and worker1
    leaves: worker2 gets msg-2 as seq_nr 1 of its own session, then msg-3, and then the
    next message sent."""
    producer = producers()
    worker1, worker2 = Probe("worker1"), Probe("worker2")
    registry.register(KEY, worker1)

    producer.send("msg-1", timeout=WAIT)
    msg1 = seq_msg(worker1)
    msg1.producer_controller.tell(Request(1, 10))
    producer.send("msg-2", timeout=WAIT)
    producer.send("msg-3", timeout=WAIT)
    assert [m.message for m in worker1.drain()] == ["msg-2", "msg-3"]
    registry.register(KEY, worker2)
    assert producer.worker_stats().number_of_workers == 2
    registry.deregister(KEY, worker1)

    assert producer.worker_stats().number_of_workers == 1
    msg2 = seq_msg(worker2)
    assert (msg2.message, msg2.seq_nr, msg2.first) == ("msg-2", 1, True)
    msg2.producer_controller.tell(Request(1, 10))
    assert (seq_msg(worker2).message, producer.send("msg-4", timeout=WAIT)) == ("msg-3", 4)
    assert seq_msg(worker2).message == "msg-4"
    assert producer.statistics().redelivered == 2


def test_send_and_confirm_returns_when_the_worker_acknowledges(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """WorkPullingSpec: reply to MessageWithConfirmation.

    A message sent with `send_and_confirm` goes with ``ack``; the call returns its seq_nr
    once the worker confirmed it (by its `Request` or its `Ack`), and times out while the
    worker has not."""
    producer = producers()
    worker = AckingWorker("worker")
    registry.register(KEY, worker)

    assert producer.send_and_confirm("msg-1", timeout=WAIT) == 1
    assert producer.send_and_confirm("msg-2", timeout=WAIT) == 2
    assert [(m.message, m.ack) for m in worker.drain()] == [("msg-1", True), ("msg-2", True)]

    silent = Probe("silent")
    registry.deregister(KEY, worker)
    registry.register(KEY, silent)
    with pytest.raises(DeliveryTimeout, match="confirmation of seq_nr 3"):
        producer.send_and_confirm("msg-3", timeout=0.05)
    msg3 = seq_msg(silent)
    msg3.producer_controller.tell(Request(1, 10))  # its own session: msg-3 is its seq_nr 1
    producer.wait_confirmed(timeout=WAIT)  # the message stayed in the stream


def test_send_and_confirm_returns_also_when_its_worker_leaves(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """WorkPullingSpec: reply to MessageWithConfirmation also when worker dies.

    worker1 holds msg-1 and msg-2 (sent with `send_and_confirm` from a thread) without
    confirming them; worker2 registers and worker1 leaves: worker2 acknowledges them, and
    the call returns msg-2's seq_nr."""
    producer = producers()
    worker1, worker2 = Probe("worker1"), AckingWorker("worker2")
    registry.register(KEY, worker1)
    producer.send("msg-1", timeout=WAIT)
    seq_msg(worker1).producer_controller.tell(Request(1, 10))
    returned: list[int] = []
    asking = threading.Thread(
        target=lambda: returned.append(producer.send_and_confirm("msg-2", timeout=WAIT)),
        daemon=True,
    )
    asking.start()
    wait_until(lambda: len(worker1.messages) == 1, "msg-2 sent to worker1")
    assert not returned

    registry.register(KEY, worker2)
    registry.deregister(KEY, worker1)
    asking.join(WAIT)

    assert returned == [2]
    assert [m.message for m in worker2.drain()] == ["msg-2"]
    assert producer.statistics().confirmed == 2


# --- DurableWorkPullingSpec ----------------------------------------------------------


def test_durable_loaded_unconfirmed_messages_go_out_before_send_has_demand(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """DurableWorkPullingSpec: load initial state and resend unconfirmed.

    The queue holds msg-3 and msg-4 unconfirmed: they go to the first worker, and `send`
    has no demand until they are sent; they are stored again under the worker's
    qualifier (new seq_nrs 5 and 6), and the next message is numbered 7."""
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
    producer = producers(durable_queue=queue, clock_millis=lambda: TS)
    worker = Probe("worker")
    registry.register(KEY, worker)

    with pytest.raises(WouldBlock, match="no worker with demand"):
        producer.send_nowait("msg-5")  # msg-4 waits for the worker's window
    msg3 = seq_msg(worker)
    assert (msg3.message, msg3.seq_nr) == ("msg-3", 1)
    msg3.producer_controller.tell(Request(1, 10))
    assert seq_msg(worker).message == "msg-4"
    assert producer.send("msg-5", timeout=WAIT) == 7

    assert seq_msg(worker).message == "msg-5"
    (w1,) = [w.worker_id for w in producer.snapshot().workers]
    assert queue.state == DurableProducerState(
        8,
        5,
        {NO_QUALIFIER: (4, TS), w1: (5, TS)},
        (MessageSent(6, "msg-4", False, w1, TS), MessageSent(7, "msg-5", False, w1, TS)),
    )


# --- beyond the originals ------------------------------------------------------------


@pytest.mark.parametrize("ack_each_message", [False, True])
def test_workers_confirm_with_requests_unless_each_message_is_acknowledged(
    ack_each_message: bool,
    registry: LocalServiceRegistry,
    producers: Callable[..., WorkPullingProducer],
) -> None:
    """By default messages go without ``ack``: the worker's Requests confirm them, every
    half window (no `Ack` per message on the wire), so of five messages only the first is
    confirmed yet. With ``ack_each_message=True`` each goes with ``ack``, as in Akka, and
    each is confirmed by its `Ack`."""
    producer = producers(ack_each_message=ack_each_message)
    worker = AckingWorker("worker")
    registry.register(KEY, worker)

    for n in range(1, 6):
        producer.send(f"msg-{n}", timeout=WAIT)

    assert [m.ack for m in worker.drain()] == [ack_each_message] * 5
    assert producer.statistics().confirmed == (5 if ack_each_message else 1)


def test_send_waits_for_a_worker_and_times_out_without_one(
    producers: Callable[..., WorkPullingProducer],
) -> None:
    """With no worker registered, `send` times out (nothing was sent), `send_nowait`
    raises `WouldBlock`, and `wait_confirmed` returns at once (nothing is unconfirmed)."""
    producer = producers()

    with pytest.raises(DeliveryTimeout, match=r"no worker with demand within 0\.05 s"):
        producer.send("msg-1", timeout=0.05)
    with pytest.raises(WouldBlock, match="0 workers registered"):
        producer.send_nowait("msg-1")
    producer.wait_confirmed(timeout=0)

    assert producer.statistics().accepted == 0


def test_send_many_sends_as_workers_ask_and_reports_what_was_sent_on_timeout(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """`send_many` sends what the workers' windows allow, waiting for more; when none
    comes within the timeout, the error says how many were sent."""
    producer = producers()
    worker = Probe("worker")
    registry.register(KEY, worker)

    assert producer.send_many(["msg-1"], timeout=WAIT) == [1]
    seq_msg(worker).producer_controller.tell(Request(1, 5))
    with pytest.raises(DeliveryTimeout, match="the first 4 of 6 messages were sent"):
        producer.send_many([f"msg-{n}" for n in range(2, 8)], timeout=0.05)

    assert [m.message for m in worker.drain()] == ["msg-2", "msg-3", "msg-4", "msg-5"]


def test_a_closed_producer_refuses_sends_and_hears_no_more_workers(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """After `close`, sends raise `ClosedError` and a worker registering later gets
    nothing: the registry subscription is cancelled."""
    producer = producers()
    producer.close()

    with pytest.raises(ClosedError, match="'p-1' is closed"):
        producer.send("msg-1", timeout=WAIT)
    registry.register(KEY, worker := Probe("worker"))
    assert producer.worker_stats().number_of_workers == 0
    worker.expect_no_message()


def test_a_worker_that_dies_without_deregistering_is_dropped_and_its_messages_resent(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """A worker whose ``is_alive()`` turns False without deregistering (a pykka actor that
    failed) is dropped by the periodic listing check; its unconfirmed message goes to the
    other worker."""

    class DyingWorker(Probe):
        alive = True

        def is_alive(self) -> bool:
            return self.alive

    settings = WorkPullingSettings(
        dead_worker_check_interval=0.02,
        producer_controller_settings=QUIET.producer_controller_settings,
    )
    producer = producers(settings=settings)
    dying, other = DyingWorker("dying"), AckingWorker("other")
    registry.register(KEY, dying)
    producer.send("msg-1", timeout=WAIT)
    assert seq_msg(dying).message == "msg-1"  # held, never confirmed
    registry.register(KEY, other)

    dying.alive = False
    producer.wait_confirmed(timeout=WAIT)

    assert [m.message for m in other.drain()] == ["msg-1"]
    assert registry.listing(KEY) == frozenset({other})


def test_a_durable_queue_that_keeps_failing_closes_the_producer(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """A store that fails every attempt raises `DurableQueueError` from the send that met
    it, nothing unstored goes out, and every later call raises it too."""
    queue = MemoryDurableQueue(fail_when=lambda op, _: op == "store_message_sent")
    pc_settings = ProducerControllerSettings(
        durable_queue_retry_attempts=2,
        durable_queue_retry_backoff=0.001,
        resend_first_interval=60.0,
    )
    producer = producers(
        settings=WorkPullingSettings(producer_controller_settings=pc_settings),
        durable_queue=queue,
    )
    worker = Probe("worker")
    registry.register(KEY, worker)

    with pytest.raises(DurableQueueError, match="giving up"):
        producer.send("msg-1", timeout=WAIT)

    worker.expect_no_message()
    assert queue.failures["store_message_sent"] == 2
    with pytest.raises(DurableQueueError, match="durable queue failed"):
        producer.send("msg-2", timeout=WAIT)


def test_an_empty_service_key_is_refused(registry: LocalServiceRegistry) -> None:
    with pytest.raises(ValueError, match="worker_service_key must be a non-empty str"):
        WorkPullingProducer("p-1", "", registry=registry)
    with pytest.raises(ValueError, match="service_key must be a non-empty str or None"):
        Consumer(service_key="", registry=registry)


def test_a_consumer_with_a_service_key_is_listed_until_it_closes(
    registry: LocalServiceRegistry,
) -> None:
    """`Consumer(service_key=...)` registers its ref when created and deregisters it when
    closed (also when closed twice, once)."""
    consumer = Consumer(service_key=KEY, registry=registry)
    assert registry.listing(KEY) == frozenset({consumer.ref})

    consumer.close()
    consumer.close()

    assert registry.listing(KEY) == frozenset()


def test_a_consumer_whose_registration_fails_raises_the_registrys_error() -> None:
    """A registry refusing the consumer's ref (a `CoordinatorServiceRegistry` does, for a
    consumer not exposed on a node) fails the creation with its error."""

    class Refusing(LocalServiceRegistry):
        def register(self, key: str, ref: Any) -> None:
            msg = f"{ref!r} is not exposed on a transport node"
            raise TypeError(msg)

    with pytest.raises(TypeError, match="not exposed on a transport node"):
        Consumer(service_key=KEY, registry=Refusing())


def test_four_consumer_workers_one_leaving_mid_run_process_every_message_once(
    registry: LocalServiceRegistry, producers: Callable[..., WorkPullingProducer]
) -> None:
    """4 000 messages over four `Consumer` workers on threads; one closes itself after
    300 messages. Its last `Ack` goes out before it deregisters, so the producer knows
    what it processed: every message is processed exactly once, and the producer saw
    each confirmed."""
    producer = producers()
    seen: list[list[tuple[str, int, bytes]]] = [[] for _ in range(4)]
    consumers = [Consumer(worker_settings(), service_key=KEY, registry=registry) for _ in seen]
    threads = [
        threading.Thread(target=run_worker, args=(c, s, 300 if i == 0 else 0), daemon=True)
        for i, (c, s) in enumerate(zip(consumers, seen, strict=True))
    ]
    for thread in threads:
        thread.start()

    producer.send_many([b"%d" % n for n in range(1, 4001)], timeout=WAIT)
    producer.wait_confirmed(timeout=WAIT)
    for consumer in consumers:
        consumer.close()
    for thread in threads:
        thread.join(WAIT)

    counts = Counter(int(m) for worker in seen for _, _, m in worker)
    assert counts == Counter(range(1, 4001)), "lost or processed twice"
    assert len(seen[0]) == 300
    stats = producer.statistics()
    assert (stats.accepted, stats.confirmed, stats.workers) == (4000, 4000, 0)
