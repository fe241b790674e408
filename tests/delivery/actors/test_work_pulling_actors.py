"""Work pulling end to end on real pykka actors, and the local service registry.

A `WorkPullingProducerController` actor, worker `ConsumerController` actors registered
under a service key in a `LocalServiceRegistry` of the test's own, and the test actors of
tests/actor_kit.py (`TestProducer`, `TestConsumer`), or `BlockingProbe` refs where the
test plays a side by hand. Window 20.

Original test (WorkPullingSpec, reference section 7.7) -> test here:

1. illustrate work-pulling usage
   -> test_two_workers_process_every_message_once_then_leave

Where we differ: delays are 1-2 ms instead of 10-20 ms, and bounded waits 10-20 s instead
of 5-10 s; we also check every processed message (no message processed twice).

Beyond the original, on actors: a worker stopped mid-run whose unconfirmed messages (and
the reply to a `MessageWithConfirmation`) reach the other worker; a worker actor that dies
without deregistering; the buffer limit's error; a durable controller started again on
its queue; a durable queue that keeps failing; the registry's contract.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from pykka_delivery.delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.delivery.actors.work_pulling import WorkPullingProducerController
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
    WorkPullingSettings,
)
from pykka_delivery.delivery.messages import (
    ConsumerStart,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    RequestNext,
    SendNext,
)
from pykka_delivery.delivery.registry import LocalServiceRegistry, default_registry
from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import DurableProducerState
from pykka_delivery.protocol.messages import Ref, Request, SequencedMessage
from tests.actor_kit import BlockingProbe, Recorder, TapRef, TestConsumer, TestProducer
from tests.harness import wait_until

WINDOW = 20
KEY = "worker"
WAIT = 10.0


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    recorder = Recorder()
    yield recorder
    recorder.assert_no_violations()


@pytest.fixture
def registry() -> LocalServiceRegistry:
    return LocalServiceRegistry()


@pytest.fixture
def actors() -> Iterator[list[pykka.ActorRef[Any]]]:
    """Actors the test starts; stopped at the end whatever happened."""
    started: list[pykka.ActorRef[Any]] = []
    yield started
    for ref in reversed(started):
        with contextlib.suppress(pykka.ActorDeadError, pykka.Timeout):
            ref.stop(timeout=5)


def start_wppc(
    actors: list[pykka.ActorRef[Any]],
    registry: LocalServiceRegistry,
    settings: WorkPullingSettings | None = None,
    **kwargs: Any,
) -> pykka.ActorRef[Any]:
    ref = WorkPullingProducerController.start("p-1", KEY, settings, registry=registry, **kwargs)
    actors.append(ref)
    return ref


def start_worker(
    actors: list[pykka.ActorRef[Any]], registry: LocalServiceRegistry
) -> pykka.ActorRef[Any]:
    ref = ConsumerController.start(
        ConsumerControllerSettings(flow_control_window=WINDOW, resend_interval_min=0.5),
        service_key=KEY,
        registry=registry,
    )
    actors.append(ref)
    return ref


def number_of_workers(wppc: pykka.ActorRef[Any]) -> int:
    return int(wppc.proxy().worker_stats().get(timeout=5).number_of_workers)


def await_workers(wppc: pykka.ActorRef[Any], count: int) -> None:
    """Akka's ``awaitWorkersRegistered``."""
    wait_until(lambda: number_of_workers(wppc) == count, f"{count} workers registered")


def test_two_workers_process_every_message_once_then_leave(
    recorder: Recorder, registry: LocalServiceRegistry, actors: list[pykka.ActorRef[Any]]
) -> None:
    """WorkPullingSpec: illustrate work-pulling usage.

    Two worker consumer controllers, each with a `TestConsumer` ending at its seq_nr 42;
    a `TestProducer` sending without end. Both reach their end, no message is processed
    twice, each worker saw its own session (its own producer id, seq_nrs 1..42); stopping
    both workers leaves the controller with none.
    """
    wppc = start_wppc(actors, registry)
    actors.append(TestProducer.start(wppc, recorder, name="producer", delay=0.002))
    workers = []
    for name in ("worker1", "worker2"):
        cc = start_worker(actors, registry)
        workers.append(cc)
        actors.append(TestConsumer.start(cc, recorder, name=name, end_seq_nr=42, delay=0.001))

    first = recorder.wait_collected("worker1", timeout=20)
    second = recorder.wait_collected("worker2", timeout=20)

    assert len(first.producer_ids) == len(second.producer_ids) == 1
    assert first.producer_ids != second.producer_ids
    texts = []
    for name in ("worker1", "worker2"):
        processed = recorder.processed[name]
        assert [p.seq_nr for p in processed] == list(range(1, 43))
        texts += [p.message for p in processed]
    assert len(texts) == len(set(texts)) == 84, "a message was processed twice"

    for cc in workers:
        cc.stop(timeout=5)
    await_workers(wppc, 0)


def test_unconfirmed_messages_of_a_stopped_worker_reach_the_other_worker(
    recorder: Recorder, registry: LocalServiceRegistry, actors: list[pykka.ActorRef[Any]]
) -> None:
    """A worker whose consumer never confirms is stopped: its three messages, one sent
    with confirmation, go to the other worker, which processes them; the reply comes
    when that worker confirms (WorkPullingSpec 2 and 4, with real consumer controllers)."""
    wppc = start_wppc(actors, registry)
    producer, replies = BlockingProbe("producer"), BlockingProbe("replies")
    wppc.tell(ProducerStart(producer))
    cc1 = start_worker(actors, registry)
    consumer1 = BlockingProbe("consumer1")  # never confirms
    cc1.tell(ConsumerStart(consumer1))

    producer.expect_type(RequestNext).send_next_to.tell("msg-1")
    producer.expect_type(RequestNext).send_next_to.tell("msg-2")
    ask = MessageWithConfirmation("msg-3", replies)
    producer.expect_type(RequestNext).ask_next_to.tell(ask)
    assert consumer1.expect_type(Delivery).message == "msg-1"

    cc2 = start_worker(actors, registry)
    actors.append(TestConsumer.start(cc2, recorder, name="worker2", end_seq_nr=3))
    await_workers(wppc, 2)
    cc1.stop(timeout=5)

    recorder.wait_collected("worker2")
    assert sorted(m for m, _ in recorder.deliveries("worker2")) == ["msg-1", "msg-2", "msg-3"]
    assert replies.receive() == 3
    await_workers(wppc, 1)


def test_a_worker_that_dies_without_deregistering_is_dropped_and_its_messages_resent(
    recorder: Recorder, registry: LocalServiceRegistry, actors: list[pykka.ActorRef[Any]]
) -> None:
    """pykka has no death watch: a worker whose ref stops answering ``is_alive()`` without
    deregistering is found by the controller's periodic listing check, and its
    unconfirmed messages go to another worker."""

    class DyingWorker(BlockingProbe):
        alive = True

        def is_alive(self) -> bool:
            return self.alive

    settings = WorkPullingSettings(dead_worker_check_interval=0.05)
    wppc = start_wppc(actors, registry, settings)
    producer = BlockingProbe("producer")
    wppc.tell(ProducerStart(producer))
    dying = DyingWorker("dying")
    registry.register(KEY, dying)
    producer.expect_type(RequestNext).send_next_to.tell("msg-1")
    assert dying.receive().message == "msg-1"  # held, never confirmed

    cc2 = start_worker(actors, registry)
    actors.append(TestConsumer.start(cc2, recorder, name="worker2", end_seq_nr=1))
    await_workers(wppc, 2)
    dying.alive = False

    recorder.wait_collected("worker2")
    assert recorder.deliveries("worker2") == [("msg-1", 1)]
    assert registry.listing(KEY) == frozenset({cc2})


def test_a_message_beyond_the_buffer_is_refused_with_an_error_naming_buffer_size(
    recorder: Recorder,
    registry: LocalServiceRegistry,
    actors: list[pykka.ActorRef[Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """With no worker, messages sent without `RequestNext` wait, up to ``buffer_size``; the
    next is refused and logged as an error naming the setting. The waiting ones reach the
    first worker; the refused one never does."""
    caplog.set_level(logging.ERROR, logger="pykka_delivery")
    wppc = start_wppc(actors, registry, WorkPullingSettings(buffer_size=2))
    for n in (1, 2, 3):
        wppc.tell(SendNext(f"msg-{n}"))

    stats = wppc.proxy().statistics().get(timeout=5)  # after the three sends

    assert (stats.buffered, stats.rejected) == (2, 1)
    assert any("buffer_size is 2" in r.getMessage() for r in caplog.records), caplog.text
    cc = start_worker(actors, registry)
    actors.append(TestConsumer.start(cc, recorder, name="worker", end_seq_nr=2))
    recorder.wait_collected("worker")
    assert [m for m, _ in recorder.deliveries("worker")] == ["msg-1", "msg-2"]


def test_durable_controller_started_again_on_its_queue_delivers_what_was_unconfirmed(
    recorder: Recorder, registry: LocalServiceRegistry, actors: list[pykka.ActorRef[Any]]
) -> None:
    """Three messages stored and sent to a worker that never confirms; the controller
    and that worker stop. A controller started on the same queue sends all three to a
    new worker, then the producer's next message, numbered after them."""
    queue = MemoryDurableQueue()
    wppc = start_wppc(actors, registry, durable_queue=queue)
    producer = BlockingProbe("producer")
    wppc.tell(ProducerStart(producer))
    cc1 = start_worker(actors, registry)
    consumer1 = BlockingProbe("consumer1")
    cc1.tell(ConsumerStart(consumer1))
    for n in (1, 2, 3):
        producer.expect_type(RequestNext).send_next_to.tell(f"msg-{n}")
    consumer1.expect_type(Delivery)
    wait_until(lambda: len(queue.state.unconfirmed) == 3, "three messages stored")
    wppc.stop(timeout=5)
    cc1.stop(timeout=5)

    wppc2 = start_wppc(actors, registry, durable_queue=queue)
    producer2 = BlockingProbe("producer2")
    wppc2.tell(ProducerStart(producer2))
    cc2 = start_worker(actors, registry)
    actors.append(TestConsumer.start(cc2, recorder, name="worker2", end_seq_nr=4))
    request_next = producer2.expect_type(RequestNext)
    request_next.send_next_to.tell("msg-4")

    recorder.wait_collected("worker2")
    assert sorted(m for m, _ in recorder.deliveries("worker2")) == [
        "msg-1",
        "msg-2",
        "msg-3",
        "msg-4",
    ]
    assert request_next.current_seq_nr == 7  # 1..3 stored first, then again as 4..6
    wait_until(lambda: not queue.state.unconfirmed, "every message confirmed in the queue")


def test_durable_controller_stops_when_its_queue_keeps_failing(
    registry: LocalServiceRegistry,
    actors: list[pykka.ActorRef[Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store that fails ``durable_queue_retry_attempts`` times stops the controller with
    an error naming the queue and the fix; the message was not sent unstored."""
    caplog.set_level(logging.ERROR, logger="pykka_delivery")
    queue = MemoryDurableQueue(fail_when=lambda op, _: op == "store_message_sent")
    pc_settings = ProducerControllerSettings(
        durable_queue_retry_attempts=3, durable_queue_retry_backoff=0.001
    )
    settings = WorkPullingSettings(producer_controller_settings=pc_settings)
    wppc = start_wppc(actors, registry, settings, durable_queue=queue)
    producer = BlockingProbe("producer")
    wppc.tell(ProducerStart(producer))
    worker = BlockingProbe("worker")
    registry.register(KEY, worker)

    producer.expect_type(RequestNext).send_next_to.tell("msg-1")

    wait_until(lambda: not wppc.is_alive(), "the controller stopped")
    assert queue.failures["store_message_sent"] == 3
    assert queue.state == DurableProducerState()
    assert "giving up" in caplog.text
    with pytest.raises(AssertionError):
        worker.receive(timeout=0.2)  # nothing went out unstored


def test_worker_ref_factory_builds_the_ref_stamped_on_a_workers_messages(
    registry: LocalServiceRegistry, actors: list[pykka.ActorRef[Any]]
) -> None:
    """What ``worker_ref_factory`` returns (a transport's exposed ref, say) is what the
    worker's consumer controller answers to, and its answers reach the controller."""
    made: list[tuple[TapRef, str]] = []

    def factory(ref: Ref, worker_id: str) -> Ref:
        made.append((TapRef(ref), worker_id))
        return made[-1][0]

    wppc = start_wppc(actors, registry, worker_ref_factory=factory)
    producer, worker = BlockingProbe("producer"), BlockingProbe("worker")
    wppc.tell(ProducerStart(producer))
    registry.register(KEY, worker)
    producer.expect_type(RequestNext).send_next_to.tell("msg-1")

    seq_msg = worker.expect_type(SequencedMessage)
    ((tap, worker_id),) = made
    assert seq_msg.producer_controller is tap
    assert seq_msg.producer_id == f"p-1-{worker_id}"
    seq_msg.producer_controller.tell(Request(1, 10))
    producer.expect_type(RequestNext)  # the Request opened the window
    assert tap.seen == [Request(1, 10)]


def test_worker_consumer_controller_registers_while_it_runs(
    registry: LocalServiceRegistry, actors: list[pykka.ActorRef[Any]]
) -> None:
    """A consumer controller with a service key is listed from its start to its stop."""
    cc = start_worker(actors, registry)
    wait_until(lambda: registry.listing(KEY) == frozenset({cc}), "the worker listed")

    cc.stop(timeout=5)

    assert registry.listing(KEY) == frozenset()


# --- the registry ----------------------------------------------------------------------


class Ref_:
    """A plain ref for the registry tests."""

    def __init__(self, name: str, alive: bool = True) -> None:
        self.name = name
        self.alive = alive

    def __repr__(self) -> str:
        return self.name

    def tell(self, message: Any) -> None:
        pass

    def is_alive(self) -> bool:
        return self.alive


def test_registry_tells_a_subscriber_the_listing_at_once_then_each_change() -> None:
    """Full listings, in order: the current one when subscribing, then after each
    register and deregister; repeated calls change nothing and tell nothing."""
    registry = LocalServiceRegistry()
    a, b = Ref_("a"), Ref_("b")
    registry.register(KEY, a)
    listings: list[frozenset[Ref]] = []

    registry.subscribe(KEY, listings.append)
    registry.register(KEY, b)
    registry.register(KEY, b)
    registry.deregister(KEY, a)
    registry.deregister(KEY, a)
    registry.register("other", a)

    assert listings == [frozenset({a}), frozenset({a, b}), frozenset({b})]


def test_registry_subscription_cancelled_hears_nothing_more() -> None:
    registry = LocalServiceRegistry()
    listings: list[frozenset[Ref]] = []
    subscription = registry.subscribe(KEY, listings.append)

    subscription.cancel()
    registry.register(KEY, Ref_("a"))

    assert listings == [frozenset()]


def test_registry_drops_dead_refs_when_asked_for_the_listing() -> None:
    """A ref whose ``is_alive()`` is False is dropped by `listing`, and subscribers are
    told; refs without ``is_alive`` are kept."""
    registry = LocalServiceRegistry()
    a, b = Ref_("a"), Ref_("b")
    plain = BlockingProbe("plain")
    for ref in (a, b, plain):
        registry.register(KEY, ref)
    listings: list[frozenset[Ref]] = []
    registry.subscribe(KEY, listings.append)
    b.alive = False

    assert registry.listing(KEY) == frozenset({a, plain})
    assert listings[-1] == frozenset({a, plain})


def test_registry_isolates_a_failing_listener(caplog: pytest.LogCaptureFixture) -> None:
    registry = LocalServiceRegistry()
    listings: list[frozenset[Ref]] = []

    def broken(_: frozenset[Ref]) -> None:
        raise RuntimeError("boom")

    registry.subscribe(KEY, broken)
    registry.subscribe(KEY, listings.append)
    registry.register(KEY, Ref_("a"))

    assert len(listings) == 2
    assert "boom" in caplog.text


def test_registry_is_safe_across_threads() -> None:
    """Registrations from many threads at once all land, and the subscriber's last
    listing is the final one."""
    registry = LocalServiceRegistry()
    listings: list[frozenset[Ref]] = []
    registry.subscribe(KEY, listings.append)
    refs = [Ref_(f"r{i}") for i in range(200)]
    threads = [threading.Thread(target=registry.register, args=(KEY, ref)) for ref in refs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)

    assert registry.listing(KEY) == frozenset(refs)
    assert listings[-1] == frozenset(refs)
    assert [len(listing) for listing in listings] == list(range(201))


def test_registry_refuses_an_empty_service_key() -> None:
    with pytest.raises(ValueError, match="service key must be a non-empty str"):
        LocalServiceRegistry().register("", Ref_("a"))


def test_default_registry_is_one_per_process() -> None:
    assert default_registry() is default_registry()
