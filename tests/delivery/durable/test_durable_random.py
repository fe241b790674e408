"""ReliableDeliveryRandomSpec, the durable rows: a flaky durable queue, alone and with a
flaky network, on the pure cores (fake clock, lossy `Network`) and on real actors.

The queue is a `MemoryDurableQueue` whose ``fail_when`` fails any call (load, store,
store confirmed) with the spec's probability, as the original's flaky
``TestDurableProducerQueue``. A failing call is retried by `DurableQueueCalls`, the retry
helper every shell uses; when every attempt fails the producer controller stops, and the
test starts a new one with the same producer id on the queue's state, as the original's
supervisor restarts its queue (the queue, not the controller, restarts there: ours is
called synchronously, so the controller is what fails). With the default ten attempts a
failure never gets that far (p <= 0.2 per call, 0.2^10); the "with restarts" tests allow
one attempt so that restarts happen, several per run.

The test producer sends with `MessageWithConfirmation`: with a durable queue the reply
means "stored", so a producer knows which message a stopped controller may not have
stored, and sends it again to the next one (the original's plain `TestProducer` would lose
it; there the controller never stops). The consumer confirms every delivery.

Original test (ReliableDeliveryRandomSpec and ...ChunkedSpec, reference 7.6) -> test here:

2. work with flaky DurableProducerQueue (31 messages, fail p 0.1-0.2)
   -> test_flaky_durable_queue_delivers_every_message_once_in_order (pure, 10 seeds)
   -> test_actors_with_a_flaky_durable_queue_deliver_every_message_once_in_order
3. work with flaky network and flaky DurableProducerQueue (17 messages, drops and fail p
   0.1-0.2) -> test_flaky_network_and_flaky_durable_queue_deliver_every_message_once_in_order
   (pure) -> test_actors_with_a_flaky_network_and_a_flaky_durable_queue_deliver_..._in_order

Beyond the original: test_controller_restarts_on_a_flaky_durable_queue_lose_nothing and
test_actors_restarted_on_a_flaky_durable_queue_lose_nothing. A restarted controller
resends what it had not seen confirmed, so the consumer may get a message again (Akka's
write-behind confirmations, reference 3.5): there we assert that every message arrives, in
order, that a seq_nr always carries the same message, and that only a restart repeats.

Where we differ from the original: fixed seeds (the original takes the wall clock and logs
it; ours is in each test's id and in every failure message); no random delays (the network
queue interleaves instead, and the actors' threads); we check the payloads, not only the
end seq_nr and the absence of duplicates.
"""

from __future__ import annotations

import contextlib
import functools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pykka
import pytest

from pykka_delivery.delivery.actors.consumer_controller import ConsumerController
from pykka_delivery.delivery.actors.producer_controller import ProducerController
from pykka_delivery.delivery.core.effects import Effect, StoreMessageConfirmed, StoreMessagesSent
from pykka_delivery.delivery.core.effects import StoreMessageSent as StoreSent
from pykka_delivery.delivery.core.producer import ProducerCore
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.messages import (
    CONFIRMED,
    ConsumerStart,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    RegisterToProducerController,
    RequestNext,
    SendNext,
)
from pykka_delivery.delivery.stores.calls import DurableQueueCalls
from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import DurableQueueError
from pykka_delivery.protocol.messages import (
    Ref,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
)
from pykka_delivery.transport.local import LossyRef
from tests.harness import Driver, FakeClock, Network, SelfRef, consumer_driver

PRODUCER_ID = "p-1"
SEEDS = range(10)
CHUNKING = pytest.mark.parametrize("chunk", [0, 1], ids=["plain", "chunked"])
STEP = 0.25  # virtual seconds between two rounds of network delivery
MAX_TIME = 900.0  # virtual seconds a run may take


def expected_messages(n: int) -> list[str]:
    return [f"msg-{i}" for i in range(1, n + 1)]


def flaky(rnd: random.Random, p: float) -> Callable[[str, object], bool]:
    """The flaky queue's ``fail_when``: any call fails with probability ``p``."""
    return lambda op, arg: rnd.random() < p


def check_delivered(deliveries: list[tuple[Any, int]], n: int, restarts: int, context: str) -> None:
    """Every message arrived, in order; a seq_nr always carries the same message; and
    without a controller restart nothing arrived twice."""
    payloads = [message for message, _ in deliveries]
    assert list(dict.fromkeys(payloads)) == expected_messages(n), context
    by_seq_nr: dict[int, Any] = {}
    for message, seq_nr in deliveries:
        assert by_seq_nr.setdefault(seq_nr, message) == message, (
            f"seq_nr {seq_nr} carried {by_seq_nr[seq_nr]!r} and {message!r}\n{context}"
        )
    highest = 0
    for message in payloads:  # a repeat goes back, never forward past a gap
        index = int(message.removeprefix("msg-"))
        assert index <= highest + 1, f"{message} after msg-{highest}\n{context}"
        highest = max(highest, index)
    if not restarts:
        assert len(payloads) == n, f"duplicates without a restart\n{context}"


# --- the pure cores ------------------------------------------------------------------------


class DurableDriver(Driver):
    """A producer core's driver that carries out the stores through `DurableQueueCalls`;
    when a store fails every attempt, it stops (drops the rest of the effects, ignores
    whatever arrives later) and tells the simulation."""

    def __init__(self, core: ProducerCore, sim: DurableSimulation) -> None:
        super().__init__(core, sim.clock)
        self.sim = sim

    def feed(self, message: Any) -> list[Effect]:
        if self.stopped:
            return []  # a dead letter
        return super().feed(message)

    def apply(self, effects: Any) -> list[Effect]:
        done = list(effects)
        for effect in done:
            if self.stopped:
                break
            if isinstance(effect, (StoreSent, StoreMessagesSent, StoreMessageConfirmed)):
                try:
                    self.sim.calls.store(effect)
                except DurableQueueError:
                    self.stopped = True
                    self.clock.cancel(self, "resend_first")
                    self.sim.producer_failed()
            else:
                super().apply([effect])
        return done


class StoringProducer:
    """The application's producer: ``msg-1`` .. ``msg-n``, each with confirmation (with a
    durable queue the reply means "stored"). A message whose reply did not come before
    its controller stopped is sent again to the next controller."""

    def __init__(self, sim: DurableSimulation, n: int) -> None:
        self.sim = sim
        self.n = n
        self.stored = 0
        self.pending: tuple[str, Driver] | None = None  # sent, not known stored; to whom
        self.violations: list[str] = []

    def tell(self, message: Any) -> None:
        if isinstance(message, int):  # stored
            self.stored += 1
            self.pending = None
            return
        assert isinstance(message, RequestNext), message
        controller = self.sim.producer
        assert controller is not None
        if self.pending is not None:
            text, to = self.pending
            if to is controller:
                self.violations.append(f"RequestNext {message} while {text} is unanswered")
        elif self.stored < self.n:
            text = f"msg-{self.stored + 1}"
        else:
            return
        self.pending = (text, controller)
        command = MessageWithConfirmation(text, self)
        self.sim.network.queue.append((controller.feed, command))  # local: never lost


class ConfirmingConsumer:
    """The application's consumer: records each delivery and confirms it (local)."""

    def __init__(self, sim: DurableSimulation) -> None:
        self.sim = sim
        self.deliveries: list[tuple[Any, int]] = []

    def tell(self, delivery: Any) -> None:
        assert isinstance(delivery, Delivery), delivery
        self.deliveries.append((delivery.message, delivery.seq_nr))
        self.sim.network.queue.append((self.sim.consumer.feed, CONFIRMED))


class DurableSimulation:
    """A durable producer core (restarted on its queue's state when it stops) and a
    consumer core, joined by a lossy `Network`, on a flaky `MemoryDurableQueue`."""

    def __init__(
        self,
        *,
        n: int,
        chunk: int,
        rnd: random.Random,
        fail: float,
        attempts: int = 10,
        consumer_drop: float = 0.0,
        producer_drop: float = 0.0,
        label: str,
    ) -> None:
        self.label = label
        self.rnd = rnd
        self.clock = FakeClock()
        self.network = Network()
        self.queue = MemoryDurableQueue(fail_when=flaky(rnd, fail))
        self.settings = ProducerControllerSettings(
            chunk_large_messages=chunk, durable_queue_retry_attempts=attempts
        )
        self.waits: list[float] = []  # the backoff waits, not really waited here
        self.calls = DurableQueueCalls(
            self.queue, self.settings, f"Producer {PRODUCER_ID!r}", sleep=self.waits.append
        )
        self.producer_drop = producer_drop
        self.consumer, cc_ref = consumer_driver(
            self.clock,
            settings=ConsumerControllerSettings(
                flow_control_window=20, resend_interval_min=0.5, resend_interval_max=2.0
            ),
        )
        cc_ref.target = self.network.link(
            self.consumer.feed, self._drop(consumer_drop, (SequencedMessage,))
        ).tell
        self.app_producer = StoringProducer(self, n)
        self.app_consumer = ConfirmingConsumer(self)
        self.consumer.feed(ConsumerStart(self.app_consumer))
        self.producer: DurableDriver | None = None
        self.pc_ref: SelfRef | None = None
        self.starts = 0
        self.restart_due = False
        self._start_producer()

    def _drop(self, p: float, kinds: tuple[type, ...]) -> Callable[[Any], str]:
        """The original's RandomFlakyNetwork: drop ``kinds`` with probability ``p``."""

        def fate(message: Any) -> str:
            return "drop" if isinstance(message, kinds) and self.rnd.random() < p else "deliver"

        return fate

    def _start_producer(self) -> None:
        """Start a producer core on what the queue holds (Akka's LoadState)."""
        self.restart_due = False
        try:
            state = self.calls.load()
        except DurableQueueError:
            self.restart_due = True  # tried again after the next step
            return
        self.starts += 1
        pc_ref = SelfRef(f"pc-{self.starts}")
        send_next_to = SelfRef(f"send-next-{self.starts}")
        core = ProducerCore(
            PRODUCER_ID,
            pc_ref,
            send_next_to,
            self.settings,
            durable_state=state,
            clock_millis=lambda: int(self.clock.now * 1000),
        )
        driver = DurableDriver(core, self)
        pc_ref.target = self.network.link(
            driver.feed, self._drop(self.producer_drop, (Request, Resend, RegisterConsumer))
        ).tell
        send_next_to.target = lambda m: driver.feed(SendNext(m))
        self.producer, self.pc_ref = driver, pc_ref
        driver.feed(ProducerStart(self.app_producer))
        # The consumer side is told where the (new) controller is; it registers there,
        # over the lossy link, repeating until the controller's first message arrives.
        self.consumer.feed(RegisterToProducerController(pc_ref))

    def producer_failed(self) -> None:
        self.restart_due = True

    @property
    def restarts(self) -> int:
        return self.starts - 1

    def done(self) -> bool:
        got = {message for message, _ in self.app_consumer.deliveries}
        return len(got) == self.app_producer.n and self.app_producer.stored == self.app_producer.n

    def run(self) -> None:
        while True:
            self.network.run()
            if self.done():
                return
            if self.clock.now >= MAX_TIME:
                pytest.fail(f"not done by virtual time {MAX_TIME} s\n{self.diagnostic()}")
            if self.restart_due:
                self._start_producer()
            self.clock.advance(STEP)

    def diagnostic(self) -> str:
        deliveries = self.app_consumer.deliveries
        core = self.producer.core if self.producer else None
        return (
            f"{self.label}\n"
            f"consumer got {len(deliveries)}: ...{deliveries[-5:]!r}\n"
            f"producer stored {self.app_producer.stored}, pending {self.app_producer.pending}\n"
            f"controller starts {self.starts}, queue calls {dict(self.queue.calls)}, "
            f"failures {dict(self.queue.failures)}\n"
            f"producer {core.snapshot() if core else None}\n"
            f"consumer {self.consumer.core.snapshot()}"
        )


def run_durable(
    seed: int,
    chunk: int,
    n: int,
    *,
    network: bool,
    attempts: int = 10,
) -> DurableSimulation:
    rnd = random.Random(seed)
    consumer_drop = producer_drop = 0.0
    if network:
        consumer_drop = 0.1 + rnd.random() * 0.1
        producer_drop = 0.1 + rnd.random() * 0.1
    fail = 0.1 + rnd.random() * 0.1
    label = (
        f"seed {seed}, chunk {chunk}, fail p {fail:.3f}, attempts {attempts}, drop to "
        f"consumer {consumer_drop:.3f}, to producer {producer_drop:.3f}"
    )
    print(label)  # shown by pytest when the test fails
    sim = DurableSimulation(
        n=n,
        chunk=chunk,
        rnd=rnd,
        fail=fail,
        attempts=attempts,
        consumer_drop=consumer_drop,
        producer_drop=producer_drop,
        label=label,
    )
    sim.run()
    assert not sim.app_producer.violations, sim.diagnostic()
    assert sum(sim.queue.failures.values()) > 0, f"the queue never failed\n{sim.diagnostic()}"
    check_delivered(sim.app_consumer.deliveries, n, sim.restarts, sim.diagnostic())
    return sim


@CHUNKING
@pytest.mark.parametrize("seed", SEEDS)
def test_flaky_durable_queue_delivers_every_message_once_in_order(seed: int, chunk: int) -> None:
    """ReliableDeliveryRandomSpec: work with flaky DurableProducerQueue."""
    sim = run_durable(seed, chunk, 31, network=False)

    assert sim.restarts == 0, sim.diagnostic()  # ten attempts: every failure was retried
    assert len(sim.app_consumer.deliveries) == 31, sim.diagnostic()


@CHUNKING
@pytest.mark.parametrize("seed", SEEDS)
def test_flaky_network_and_flaky_durable_queue_deliver_every_message_once_in_order(
    seed: int, chunk: int
) -> None:
    """ReliableDeliveryRandomSpec: work with flaky network and flaky DurableProducerQueue."""
    sim = run_durable(seed, chunk, 17, network=True)

    assert sim.restarts == 0, sim.diagnostic()
    assert len(sim.app_consumer.deliveries) == 17, sim.diagnostic()


@CHUNKING
@pytest.mark.parametrize("network", [False, True], ids=["reliable-network", "flaky-network"])
@pytest.mark.parametrize("seed", SEEDS)
def test_controller_restarts_on_a_flaky_durable_queue_lose_nothing(
    seed: int, network: bool, chunk: int
) -> None:
    """Beyond the original: one attempt per call, so each failure stops the controller
    and a new one continues from the queue's state."""
    sim = run_durable(seed, chunk, 31, network=network, attempts=1)

    assert sim.restarts > 0, sim.diagnostic()


# --- real actors ---------------------------------------------------------------------------

WAIT = 30.0  # seconds for a whole actor run; most take well under a second
ACTOR_SEEDS = pytest.mark.parametrize("seed", [1, 2])
# The original's intervals divided by ten or more, as in test_reliable_delivery_random_actors.
CONSUMER_SETTINGS = ConsumerControllerSettings(
    flow_control_window=20, resend_interval_min=0.05, resend_interval_max=0.2
)


class Outcome:
    """What the actors report, under one condition the test thread waits on."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.cond = threading.Condition()
        self.deliveries: list[tuple[Any, int]] = []
        self.stopped = 0  # producer controllers stopped
        self.violations: list[str] = []

    def delivered(self, message: Any, seq_nr: int) -> None:
        with self.cond:
            self.deliveries.append((message, seq_nr))
            self.cond.notify_all()

    def controller_stopped(self) -> None:
        with self.cond:
            self.stopped += 1
            self.cond.notify_all()

    def violation(self, text: str) -> None:
        with self.cond:
            self.violations.append(text)
            self.cond.notify_all()

    def done(self) -> bool:
        return len({m for m, _ in self.deliveries}) >= self.n


class WatchedProducerController(ProducerController):
    """A `ProducerController` that reports when it stops (pykka has no death watch)."""

    def __init__(self, outcome: Outcome, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._outcome = outcome

    def on_stop(self) -> None:
        super().on_stop()
        self._outcome.controller_stopped()


class _Stored:
    """`StoringProducerActor`'s own message: the controller stored ``seq_nr``."""

    def __init__(self, seq_nr: int) -> None:
        self.seq_nr = seq_nr


class _Reconnect:
    """`StoringProducerActor`'s own message: from now on use ``controller``."""

    def __init__(self, controller: Ref) -> None:
        self.controller = controller


class _StoredAdapter:
    def __init__(self, ref: Ref) -> None:
        self._ref = ref

    def tell(self, seq_nr: Any) -> None:
        self._ref.tell(_Stored(seq_nr))


class StoringProducerActor(pykka.ThreadingActor):
    """`StoringProducer` as an actor: sends msg-1..n with confirmation, and sends a
    message not known stored again to the next controller."""

    use_daemon_thread = True

    def __init__(self, controller: Ref, outcome: Outcome) -> None:
        super().__init__()
        self._controller = controller
        self._outcome = outcome
        self._stored = 0
        self._pending: tuple[str, Any] | None = None
        self._replies = _StoredAdapter(self.actor_ref)

    def on_start(self) -> None:
        self._controller.tell(ProducerStart(self.actor_ref))

    def on_receive(self, message: Any) -> None:
        if isinstance(message, _Stored):
            self._stored += 1
            self._pending = None
        elif isinstance(message, _Reconnect):
            self._controller = message.controller
            message.controller.tell(ProducerStart(self.actor_ref))
        elif isinstance(message, RequestNext):
            self._on_request_next(message)

    def _on_request_next(self, request_next: RequestNext) -> None:
        to = request_next.ask_next_to
        if self._pending is not None:
            text, previous = self._pending
            if previous is to:
                self._outcome.violation(f"{request_next} while {text} is unanswered")
        elif self._stored < self._outcome.n:
            text = f"msg-{self._stored + 1}"
        else:
            return
        self._pending = (text, to)
        with contextlib.suppress(pykka.ActorDeadError):  # stopped: the next one gets it
            to.tell(MessageWithConfirmation(text, self._replies))


class ConfirmingConsumerActor(pykka.ThreadingActor):
    use_daemon_thread = True

    def __init__(self, controller: Ref, outcome: Outcome) -> None:
        super().__init__()
        self._controller = controller
        self._outcome = outcome

    def on_start(self) -> None:
        self._controller.tell(ConsumerStart(self.actor_ref))

    def on_receive(self, message: Any) -> None:
        if isinstance(message, Delivery):
            self._outcome.delivered(message.message, message.seq_nr)
            message.confirm_to.tell(CONFIRMED)


class Controllers:
    """Starts producer controllers on one queue, each behind its own lossy ref (the
    original's RandomFlakyNetwork in front of the producer controller)."""

    def __init__(
        self,
        outcome: Outcome,
        queue: MemoryDurableQueue,
        settings: ProducerControllerSettings,
        drop: float,
        rnd: random.Random,
    ) -> None:
        self.outcome = outcome
        self.queue = queue
        self.settings = settings
        self.drop = drop
        self.rnd = rnd

    def start(self) -> tuple[Any, Ref]:
        """A new controller and the ref the consumer side reaches it by, taken as it is
        made: the controller may fail and stop before anyone could ask it."""
        self_refs: list[Ref] = []

        def lossy(ref: Ref) -> Ref:
            types = (Request, Resend, RegisterConsumer)
            self_refs.append(
                LossyRef(ref, drop=self.drop, types=types, seed=self.rnd.randrange(2**32))
            )
            return self_refs[-1]

        for _ in range(100):  # loading may fail too: the original's supervisor retries
            try:
                pc = WatchedProducerController.start(
                    self.outcome,
                    PRODUCER_ID,
                    self.settings,
                    durable_queue=self.queue,
                    self_ref_factory=lossy,
                )
            except DurableQueueError:
                continue
            return pc, self_refs[-1]
        msg = "no producer controller could load the queue in 100 starts"
        raise AssertionError(msg)


def run_actors(seed: int, chunk: int, n: int, *, network: bool, attempts: int = 10) -> int:
    """Run the actors until the consumer got all ``n``; returns how many controllers were
    started again."""
    rnd = random.Random(seed)
    consumer_drop = producer_drop = 0.0
    if network:
        consumer_drop = 0.1 + rnd.random() * 0.1
        producer_drop = 0.1 + rnd.random() * 0.1
    fail = 0.1 + rnd.random() * 0.1
    label = (
        f"seed {seed}, chunk {chunk}, fail p {fail:.3f}, attempts {attempts}, drop to "
        f"consumer {consumer_drop:.3f}, to producer {producer_drop:.3f}"
    )
    print(label)
    lock = threading.Lock()

    def fail_when(op: str, arg: object) -> bool:
        with lock:  # actor threads share the seeded source
            return rnd.random() < fail

    queue = MemoryDurableQueue(fail_when=fail_when)
    settings = ProducerControllerSettings(
        chunk_large_messages=chunk,
        resend_first_interval=0.05,
        durable_queue_retry_attempts=attempts,
        durable_queue_retry_backoff=0.001,
        durable_queue_retry_backoff_max=0.01,
    )
    outcome = Outcome(n)
    cc = ConsumerController.start(
        CONSUMER_SETTINGS,
        self_ref_factory=lambda ref: LossyRef(
            ref, drop=consumer_drop, types=(SequencedMessage,), seed=rnd.randrange(2**32)
        ),
    )
    ConfirmingConsumerActor.start(cc, outcome)
    start_controller = Controllers(outcome, queue, settings, producer_drop, rnd).start
    pc, pc_ref = start_controller()
    producer = StoringProducerActor.start(pc, outcome)
    cc.tell(RegisterToProducerController(pc_ref))
    restarts = 0
    deadline = time.monotonic() + WAIT

    def something_happened(restarts: int) -> bool:
        return outcome.done() or bool(outcome.violations) or outcome.stopped > restarts

    while True:
        with outcome.cond:
            outcome.cond.wait_for(
                functools.partial(something_happened, restarts),
                timeout=max(0.0, deadline - time.monotonic()),
            )
            finished = outcome.done() or bool(outcome.violations)
            stopped = outcome.stopped > restarts
            deliveries = list(outcome.deliveries)
        context = (
            f"{label}\nrestarts {restarts}, violations {outcome.violations}, "
            f"{len(deliveries)} deliveries, last {deliveries[-5:]}\n"
            f"queue calls {dict(queue.calls)}, failures {dict(queue.failures)}"
        )
        if finished:
            break
        assert time.monotonic() < deadline, f"not done within {WAIT} s\n{context}"
        if stopped:
            restarts += 1
            pc, pc_ref = start_controller()
            producer.tell(_Reconnect(pc))
            cc.tell(RegisterToProducerController(pc_ref))
    assert not outcome.violations, context
    assert sum(queue.failures.values()) > 0, f"the queue never failed\n{context}"
    check_delivered(deliveries, n, restarts, context)
    return restarts


@pytest.mark.slow
@CHUNKING
@ACTOR_SEEDS
def test_actors_with_a_flaky_durable_queue_deliver_every_message_once_in_order(
    seed: int, chunk: int
) -> None:
    """ReliableDeliveryRandomSpec: work with flaky DurableProducerQueue (actors)."""
    assert run_actors(seed, chunk, 31, network=False) == 0


@pytest.mark.slow
@CHUNKING
@ACTOR_SEEDS
def test_actors_with_a_flaky_network_and_a_flaky_durable_queue_deliver_every_message_once_in_order(
    seed: int, chunk: int
) -> None:
    """ReliableDeliveryRandomSpec: work with flaky network and flaky DurableProducerQueue
    (actors)."""
    assert run_actors(seed, chunk, 17, network=True) == 0


@pytest.mark.slow
@CHUNKING
@ACTOR_SEEDS
def test_actors_restarted_on_a_flaky_durable_queue_lose_nothing(seed: int, chunk: int) -> None:
    """Beyond the original, on actors: one attempt per call, so controllers stop and are
    started again on the queue."""
    assert run_actors(seed, chunk, 31, network=True, attempts=1) > 0
