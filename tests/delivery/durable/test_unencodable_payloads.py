"""A payload the durable queue cannot store fails at once (issue 19, defect 1).

Two layers: a queue that stores payloads as bytes declares its serializers, so a producer
refuses such a payload before numbering it (`SerializationError`, the queue never sees
it); and a store the queue refuses for its input (a `DurableQueueError` raised from a
`TypeError` or `ValueError`: `is_permanent`) is not retried, since no attempt can succeed.
"""

from __future__ import annotations

import datetime
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from pykka_delivery import (
    Consumer,
    DurableQueueError,
    Producer,
    ProducerControllerSettings,
    SqliteDurableQueue,
)
from pykka_delivery.delivery.core.durable_state import DurableProducerState, MessageSent
from pykka_delivery.delivery.core.effects import StoreMessageSent
from pykka_delivery.delivery.stores.calls import DurableQueueCalls
from pykka_delivery.delivery.stores.durable_queue import is_permanent
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol import SerializationError
from pykka_delivery.protocol.payload_check import EncodesPayloads

WAIT = 10.0
# Many slow retries: a test that retried would take minutes, not fail fast.
PATIENT = ProducerControllerSettings(
    durable_queue_retry_attempts=10, durable_queue_retry_backoff=1.0
)


def unencodable() -> dict[str, Any]:
    return {"when": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)}


def refused_from(cause: BaseException) -> DurableQueueError:
    try:
        raise DurableQueueError("store failed") from cause
    except DurableQueueError as error:
        return error


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-unencodable-timers")
    yield service
    service.shutdown()


class CountingQueue(SqliteDurableQueue):
    """An SQLite queue counting the stores it is asked to make."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stores = 0

    def store_messages_sent(self, sents: Sequence[MessageSent]) -> None:
        self.stores += 1
        super().store_messages_sent(sents)


class Undeclared:
    """An SQLite queue behind a wrapper that does not say it encodes payloads: the
    producer cannot check for it, and the queue's refusal is what the caller meets."""

    def __init__(self, queue: SqliteDurableQueue) -> None:
        self.queue = queue
        self.attempts = 0

    def load_state(self) -> DurableProducerState:
        return self.queue.load_state()

    def store_message_sent(self, sent: MessageSent) -> None:
        self.attempts += 1
        self.queue.store_message_sent(sent)

    def store_messages_sent(self, sents: Sequence[MessageSent]) -> None:
        self.attempts += 1
        self.queue.store_messages_sent(sents)

    def store_message_confirmed(self, seq_nr: int, qualifier: str, timestamp_millis: int) -> None:
        self.queue.store_message_confirmed(seq_nr, qualifier, timestamp_millis)

    def flush(self) -> None:
        self.queue.flush()

    def close(self) -> None:
        self.queue.close()


# --- the rule ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cause", [SerializationError("not JSON-able"), TypeError("not a str"), ValueError("bad")]
)
def test_a_queue_error_raised_from_a_refused_input_is_permanent(cause: Exception) -> None:
    assert is_permanent(refused_from(cause))


@pytest.mark.parametrize(
    "error",
    [
        DurableQueueError("database is locked"),
        refused_from(sqlite3.OperationalError("disk I/O error")),
        OSError("disk on fire"),
    ],
)
def test_a_failure_to_store_is_not_permanent(error: Exception) -> None:
    assert not is_permanent(error)


def test_a_permanent_cause_further_down_the_chain_counts() -> None:
    assert is_permanent(refused_from(refused_from(ValueError("bad"))))


def test_a_store_refused_for_its_input_fails_at_once_without_a_retry() -> None:
    queue = Undeclared(SqliteDurableQueue(":memory:", "p-1"))
    waits: list[float] = []
    calls = DurableQueueCalls(queue, PATIENT, "Producer 'p-1'", sleep=waits.append)  # type: ignore[arg-type]
    sent = MessageSent(1, unencodable(), False, "", 0)

    with pytest.raises(DurableQueueError, match="refused, not retried") as raised:
        calls.store(StoreMessageSent(sent))

    assert "not JSON serializable" in str(raised.value)
    assert (queue.attempts, waits, calls.retries) == (1, [], 0)


# --- a producer on an SQLite queue ---------------------------------------------------------


def test_an_sqlite_queue_declares_the_serializers_it_stores_payloads_with() -> None:
    queue = SqliteDurableQueue(":memory:", "p-1")

    assert isinstance(queue, EncodesPayloads)
    assert queue.payload_serialization() is queue._serialization
    queue.close()


def test_a_producer_refuses_a_payload_its_sqlite_queue_cannot_store_before_any_store(
    timers: TimerService,
) -> None:
    queue = CountingQueue(":memory:", "p-1")
    producer = Producer("p-1", PATIENT, timer_service=timers, durable_queue=queue)
    consumer = Consumer(timer_service=timers)  # in-process: it alone would take anything
    producer.register_consumer(consumer.ref)

    with pytest.raises(SerializationError, match="not JSON serializable"):
        producer.send(unencodable(), timeout=WAIT)

    assert queue.stores == 0
    assert producer.send({"n": 3}, timeout=WAIT) == 1
    delivery = consumer.receive(timeout=WAIT)
    assert (delivery.seq_nr, delivery.message) == (1, {"n": 3})
    delivery.confirm()
    producer.close()
    consumer.close()
    queue.close()


def test_a_producer_whose_queue_refuses_a_store_for_its_input_fails_at_once(
    timers: TimerService,
) -> None:
    queue = Undeclared(SqliteDurableQueue(":memory:", "p-1"))
    producer = Producer("p-1", PATIENT, timer_service=timers, durable_queue=queue)  # type: ignore[arg-type]
    consumer = Consumer(timer_service=timers)
    producer.register_consumer(consumer.ref)

    with pytest.raises(DurableQueueError, match="refused, not retried"):
        producer.send(unencodable(), timeout=WAIT)

    assert queue.attempts == 1
    producer.close()
    consumer.close()
    queue.close()
