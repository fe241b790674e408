"""The producer sessions, driven with no thread: what a test appends to the inbox is
processed when it calls `process_inbox`, and timers fire only when it fires them
(`ManualTimerService`).

* try_send with and without demand, the steady state told straight to the consumer;
* send_batch with a durable queue: one store per batch;
* the durable-failure rule: a store failing every attempt closes the session, the shell is
  told, every later call raises the failed error caused by the store's;
* the inbox: a stale timer firing is dropped, a message the core refuses is logged and
  dropped, the messages behind it still processed; one refused for its payload gives the
  producer its RequestNext again;
* the work-pulling session: a batch takes what the workers with demand take, the
  check_workers timer asks the registry for the listing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from pykka import ActorDeadError

from pykka_delivery.delivery.core.producer import RESEND_FIRST, ProducerCore
from pykka_delivery.delivery.core.settings import ProducerControllerSettings, WorkPullingSettings
from pykka_delivery.delivery.core.work_pulling import WorkPullingCore
from pykka_delivery.delivery.messages import ProducerStart, RequestNext, SendNext
from pykka_delivery.delivery.registry import LocalServiceRegistry
from pykka_delivery.delivery.session.producer import Ignore, ProducerSession, load_durable
from pykka_delivery.delivery.session.work_pulling import CHECK_WORKERS, WorkPullingSession
from pykka_delivery.delivery.stores.durable_memory import MemoryDurableQueue
from pykka_delivery.delivery.stores.durable_queue import DurableQueueError
from pykka_delivery.delivery.timers import TimerFired, Timers
from pykka_delivery.errors import ClosedError, LocalProtocolError
from pykka_delivery.protocol.messages import RegisterConsumer, Request, SequencedMessage
from pykka_delivery.protocol.serialization import Serialization, default_serialization
from tests.harness import ManualTimerService, Probe

PID = "p-1"
NO_WAIT = ProducerControllerSettings(
    durable_queue_retry_attempts=2,
    durable_queue_retry_backoff=0.0,
    durable_queue_retry_backoff_max=0.0,
)


class Failures:
    """Records what the session tells its shell when it fails."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def session_of(
    service: ManualTimerService,
    *,
    durable_queue: MemoryDurableQueue | None = None,
    on_failure: Callable[[], None] = lambda: None,
) -> ProducerSession:
    """A handle's session (demand is read), its timer firings queued in its inbox."""
    made: list[ProducerSession] = []

    def queue(fired: TimerFired) -> None:
        made[0].inbox.append(fired)

    session = ProducerSession.for_handle(
        PID,
        Probe("self"),
        Timers(queue, service),
        settings=NO_WAIT,
        serialization=None,
        durable_queue=durable_queue,
        clock_millis=lambda: 0,
        on_failure=on_failure,
    )
    made.append(session)
    return session


def connected(session: ProducerSession, consumer: Probe) -> None:
    """The consumer registers; the first message goes out; the consumer confirms it and
    opens the window up to 10."""
    session.inbox.append(RegisterConsumer(consumer))
    session.process_inbox()
    assert session.try_send("m1") == 1
    session.inbox.append(Request(1, 10))
    session.process_inbox()
    consumer.drain()


@pytest.fixture
def service() -> ManualTimerService:
    return ManualTimerService()


# --- sending ------------------------------------------------------------------------------


def test_try_send_without_demand_sends_nothing_and_returns_none(
    service: ManualTimerService,
) -> None:
    consumer = Probe("consumer")
    session = session_of(service)
    session.inbox.append(RegisterConsumer(consumer))
    session.process_inbox()
    assert session.try_send("m1") == 1  # the first message: the window is 1 until confirmed
    consumer.drain()

    assert session.try_send("m2") is None

    consumer.expect_no_message()
    assert session.snapshot().current_seq_nr == 2


def test_try_send_with_demand_tells_the_numbered_message_to_the_consumer(
    service: ManualTimerService,
) -> None:
    consumer = Probe("consumer")
    session = session_of(service)
    connected(session, consumer)

    assert session.try_send("m2") == 2

    told = consumer.expect_type(SequencedMessage)
    assert (told.producer_id, told.seq_nr, told.message, told.first) == (PID, 2, "m2", False)
    assert session.statistics().sent == 2


def test_send_batch_with_a_durable_queue_stores_the_batch_with_one_write(
    service: ManualTimerService,
) -> None:
    consumer = Probe("consumer")
    queue = MemoryDurableQueue()
    session = session_of(service, durable_queue=queue)
    connected(session, consumer)  # the window is open up to 10
    messages = iter([f"m{n}" for n in range(2, 15)])

    seq_nrs = session.send_batch(messages)

    # The window's share is sent; the rest is stored ahead (durable_store_ahead) with it.
    assert seq_nrs == list(range(2, 15))
    assert queue.calls["store_messages_sent"] == 1
    assert [m.seq_nr for m in consumer.drain()] == list(range(2, 11))
    assert next(messages, None) is None


def test_send_batch_of_an_exhausted_iterator_sends_nothing(service: ManualTimerService) -> None:
    consumer = Probe("consumer")
    session = session_of(service)
    connected(session, consumer)

    assert session.send_batch(iter([])) == []

    consumer.expect_no_message()


def test_send_without_demand_is_refused_with_the_cores_error(
    service: ManualTimerService,
) -> None:
    session = session_of(service)

    with pytest.raises(LocalProtocolError, match="before it was started"):
        session.send("m1")


# --- the durable-failure rule -----------------------------------------------------------


def failing_store(op: str, _arg: object) -> bool:
    return op.startswith("store_message")


def test_a_store_failing_every_attempt_raises_its_error_and_sends_nothing(
    service: ManualTimerService,
) -> None:
    consumer = Probe("consumer")
    session = session_of(service, durable_queue=MemoryDurableQueue(fail_when=failing_store))
    session.inbox.append(RegisterConsumer(consumer))
    session.process_inbox()

    with pytest.raises(DurableQueueError, match=r"failed after 2 attempt\(s\), giving up"):
        session.try_send("m1")

    consumer.expect_no_message()
    assert session.closed


def test_a_store_failure_tells_the_shell_once(service: ManualTimerService) -> None:
    failures = Failures()
    session = session_of(
        service, durable_queue=MemoryDurableQueue(fail_when=failing_store), on_failure=failures
    )
    session.inbox.append(RegisterConsumer(Probe("consumer")))
    session.process_inbox()

    with pytest.raises(DurableQueueError):
        session.try_send("m1")

    assert failures.count == 1


def test_after_a_store_failure_every_call_raises_the_failed_error_caused_by_it(
    service: ManualTimerService,
) -> None:
    session = session_of(service, durable_queue=MemoryDurableQueue(fail_when=failing_store))
    session.inbox.append(RegisterConsumer(Probe("consumer")))
    session.process_inbox()
    with pytest.raises(DurableQueueError) as failed:
        session.try_send("m1")

    for _ in range(2):
        with pytest.raises(DurableQueueError, match="is closed: its durable queue failed") as e:
            session.check_open()
        assert e.value.__cause__ is failed.value


def test_after_a_store_failure_the_timers_stop_and_what_arrives_is_dropped(
    service: ManualTimerService,
) -> None:
    consumer = Probe("consumer")
    queue = MemoryDurableQueue(fail_when=lambda op, _: op == "store_message_confirmed")
    session = session_of(service, durable_queue=queue)
    session.inbox.append(RegisterConsumer(consumer))
    session.process_inbox()
    session.try_send("m1")  # stored; starts the first-resend timer
    consumer.drain()

    session.inbox.append(Request(1, 10))  # its confirmation cannot be stored
    session.process_inbox()
    session.inbox.append(Request(1, 20))
    service.fire_all()

    assert session.failure is not None
    assert not session.timers.is_running(RESEND_FIRST)
    assert session.process_inbox() is False
    assert not session.inbox
    consumer.expect_no_message()


def test_a_closed_session_raises_closed_error_naming_the_producer(
    service: ManualTimerService,
) -> None:
    session = session_of(service)

    session.close()

    with pytest.raises(ClosedError, match=r"^Producer 'p-1' is closed$"):
        session.check_open()


def test_release_flushes_the_durable_queue_unless_it_failed(
    service: ManualTimerService,
) -> None:
    flushed: list[str] = []

    class Flushes(MemoryDurableQueue):
        def flush(self) -> None:
            flushed.append("flush")

    ok = session_of(service, durable_queue=Flushes())
    failed = session_of(service, durable_queue=Flushes(fail_when=failing_store))
    failed.inbox.append(RegisterConsumer(Probe("consumer")))
    failed.process_inbox()
    with pytest.raises(DurableQueueError):
        failed.try_send("m1")

    for session in (ok, failed):
        session.close()
        session.release()

    assert flushed == ["flush"]


# --- the inbox ------------------------------------------------------------------------------


def test_a_stale_timer_firing_in_the_inbox_is_dropped(service: ManualTimerService) -> None:
    consumer, other = Probe("consumer"), Probe("other consumer")
    session = session_of(service)
    session.inbox.append(RegisterConsumer(consumer))
    session.process_inbox()
    session.try_send("m1")  # starts the first-resend timer
    session.inbox.append(RegisterConsumer(other))  # restarts it, resends m1 to the other
    session.process_inbox()
    consumer.drain()
    other.drain()

    service.fire_cancelled()  # the replaced timer's firing was already on its way
    assert [m.key for m in session.inbox] == [RESEND_FIRST]
    session.process_inbox()

    other.expect_no_message()
    assert session.statistics().resent == 1


def test_a_current_timer_firing_reaches_the_core(service: ManualTimerService) -> None:
    consumer = Probe("consumer")
    session = session_of(service)
    session.inbox.append(RegisterConsumer(consumer))
    session.process_inbox()
    session.try_send("m1")  # starts the first-resend timer
    consumer.drain()

    service.fire_all()
    session.process_inbox()

    resent = consumer.expect_type(SequencedMessage)
    assert (resent.seq_nr, resent.first) == (1, True)


def test_a_message_the_core_refuses_is_logged_and_dropped(
    service: ManualTimerService, caplog: pytest.LogCaptureFixture
) -> None:
    consumer = Probe("consumer")
    session = session_of(service)
    connected(session, consumer)
    before = session.snapshot()

    with caplog.at_level(logging.ERROR, "pykka_delivery.producer"):
        assert session.receive("not a protocol message") is False

    assert "cannot handle str" in caplog.text
    assert session.snapshot() == before
    assert session.statistics().rejected == 1


class RemoteProbe(Probe):
    """A consumer side in another process: it encodes what it is told."""

    def payload_serialization(self) -> Serialization:
        return default_serialization


def test_a_message_refused_for_its_payload_is_logged_and_its_producer_told_request_next_again(
    service: ManualTimerService, caplog: pytest.LogCaptureFixture
) -> None:
    # The actors' path (issue 19, defect 1): a SendNext that got past the producer's own
    # check reaches the core, which refuses it; the producer used its RequestNext on it.
    producer, consumer = Probe("producer"), RemoteProbe("consumer")
    core = ProducerCore(PID, Probe("self"), Probe("send_next_to"))
    session = ProducerSession(
        core, Timers(lambda _: None, service), None, name="PC", on_failure=lambda: None
    )
    session.receive(ProducerStart(producer))
    session.receive(RegisterConsumer(consumer))
    producer.expect_type(RequestNext)
    before = session.snapshot()

    with caplog.at_level(logging.ERROR, "pykka_delivery.producer"):
        assert session.receive(SendNext(object())) is False

    assert "no serializer for builtins.object" in caplog.text
    assert session.snapshot() == before
    assert producer.expect_type(RequestNext).current_seq_nr == 1
    consumer.expect_no_message()


def test_the_messages_behind_a_refused_one_are_still_processed(
    service: ManualTimerService,
) -> None:
    consumer = Probe("consumer")
    session = session_of(service)
    connected(session, consumer)

    session.inbox.extend(["not a protocol message", Request(1, 20)])
    assert session.process_inbox() is True

    assert not session.inbox
    assert session.snapshot().requested_seq_nr == 20


class Dead:
    """A stopped actor's ref."""

    def tell(self, message: Any) -> None:
        raise ActorDeadError(f"{self!r} is dead")


def test_a_send_to_a_dead_actor_is_dropped_when_the_shell_asks_for_it(
    service: ManualTimerService,
) -> None:
    ignore = Ignore()
    core = ProducerCore(PID, Probe("self"), ignore, announce_demand=False)
    session = ProducerSession(
        core,
        Timers(lambda _: None, service),
        None,
        name="ProducerController",
        on_failure=lambda: None,
        drop_dead_targets=True,
    )
    session.receive(ProducerStart(ignore))
    session.receive(RegisterConsumer(Dead()))

    assert session.try_send("m1") == 1

    assert not session.closed


def test_a_send_to_a_dead_actor_raises_unless_the_shell_asks_to_drop_it(
    service: ManualTimerService,
) -> None:
    session = session_of(service)
    session.inbox.append(RegisterConsumer(Dead()))
    session.process_inbox()

    with pytest.raises(ActorDeadError):
        session.try_send("m1")


def test_load_durable_without_a_queue_loads_nothing() -> None:
    assert load_durable(None, NO_WAIT, "Producer 'p-1'") == (None, None)


# --- the work-pulling session --------------------------------------------------------------


class CountingRegistry(LocalServiceRegistry):
    def __init__(self) -> None:
        super().__init__()
        self.listings = 0

    def listing(self, key: str) -> frozenset[Any]:
        self.listings += 1
        return super().listing(key)


def work_pulling_session(
    service: ManualTimerService, registry: LocalServiceRegistry
) -> WorkPullingSession:
    ignore = Ignore()
    core = WorkPullingCore(PID, ignore, ignore, Probe)
    session = WorkPullingSession(
        core,
        Timers(lambda _: None, service),
        None,
        name="WorkPullingProducer",
        on_failure=lambda: None,
        registry=registry,
        worker_service_key="jobs",
        check_interval=WorkPullingSettings().dead_worker_check_interval,
    )
    session.timers = Timers(session.inbox.append, service)
    return session


def test_a_work_pulling_batch_takes_only_what_the_workers_with_demand_take(
    service: ManualTimerService,
) -> None:
    registry = LocalServiceRegistry()
    worker = Probe("worker")
    registry.register("jobs", worker)
    session = work_pulling_session(service, registry)
    session.subscribe(session.inbox.append)
    session.process_inbox()  # the listing: one worker, demand for its first message
    messages = iter(["a", "b", "c"])

    assert session.send_batch(messages) == [1]

    assert [m.message for m in worker.drain()] == ["a"]
    assert next(messages) == "b"


def test_the_check_workers_timer_asks_the_registry_for_the_listing(
    service: ManualTimerService,
) -> None:
    registry = CountingRegistry()
    session = work_pulling_session(service, registry)
    session.subscribe(session.inbox.append)
    session.process_inbox()

    service.fire_all()
    assert [m.key for m in session.inbox if type(m) is TimerFired] == [CHECK_WORKERS]
    session.process_inbox()

    assert registry.listings == 1


def test_release_cancels_the_registry_subscription(service: ManualTimerService) -> None:
    registry = LocalServiceRegistry()
    session = work_pulling_session(service, registry)
    session.subscribe(session.inbox.append)
    session.process_inbox()

    session.close()
    session.release()
    registry.register("jobs", Probe("late worker"))

    assert not session.inbox


# --- closing ------------------------------------------------------------------------------


def test_closing_with_unconfirmed_messages_and_no_durable_queue_warns_naming_them_and_counts_them(
    service: ManualTimerService, caplog: pytest.LogCaptureFixture
) -> None:
    # Regression (issue 19, defect 2): closing lost the unconfirmed messages without a word.
    session = session_of(service)
    connected(session, Probe("consumer"))  # 1 confirmed
    for n in range(2, 6):
        assert session.try_send(f"m{n}") == n

    with caplog.at_level(logging.WARNING, "pykka_delivery.producer"):
        session.close()
        session.close()  # a second close counts nothing more

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "Producer 'p-1' closed with 4 unconfirmed message(s), seq_nr 2..5: they are not "
        "resent and are lost unless the consumer had them. Close after wait_confirmed(), or "
        "give the producer a durable_queue"
    ]
    assert session.statistics().lost_on_close == 4


def test_closing_with_everything_confirmed_warns_of_nothing(
    service: ManualTimerService, caplog: pytest.LogCaptureFixture
) -> None:
    session = session_of(service)
    connected(session, Probe("consumer"))  # 1 sent, 1 confirmed

    with caplog.at_level(logging.WARNING, "pykka_delivery.producer"):
        session.close()

    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert session.statistics().lost_on_close == 0


def test_closing_with_unconfirmed_messages_in_a_durable_queue_loses_nothing(
    service: ManualTimerService, caplog: pytest.LogCaptureFixture
) -> None:
    session = session_of(service, durable_queue=MemoryDurableQueue())
    connected(session, Probe("consumer"))
    session.try_send("m2")

    with caplog.at_level(logging.WARNING, "pykka_delivery.producer"):
        session.close()

    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert session.statistics().lost_on_close == 0
