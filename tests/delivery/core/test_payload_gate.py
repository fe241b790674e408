"""The payload gate of the producer cores (core/payload_gate.py, issue 19 defect 1).

A payload that what carries or stores it cannot encode is refused before it is numbered:
the state does not move, and the next message takes the seq_nr. The targets here are
plain refs, some declaring the serializers they encode with (`EncodesPayloads`), as a
transport's remote ref does; the in-process ones declare nothing and take any object.
"""

from __future__ import annotations

import datetime
import logging
import random
from typing import Any

import pytest

from pykka_delivery.delivery.core.durable_state import DurableProducerState
from pykka_delivery.delivery.core.effects import Send, StoreMessageConfirmed
from pykka_delivery.delivery.core.producer import ProducerCore
from pykka_delivery.delivery.core.settings import ProducerControllerSettings
from pykka_delivery.delivery.core.work_pulling import CurrentWorkers, WorkPullingCore
from pykka_delivery.delivery.messages import RequestNext, SendNext
from pykka_delivery.protocol.messages import Request
from pykka_delivery.protocol.serialization import Serialization, SerializationError


class Sink:
    """An in-process ref: keeps what it is told, declares nothing."""

    def __init__(self) -> None:
        self.told: list[Any] = []

    def tell(self, message: Any) -> None:
        self.told.append(message)


class Remote(Sink):
    """A ref to another process: it encodes what it is told with ``serialization``."""

    def __init__(self, serialization: Serialization | None = None) -> None:
        super().__init__()
        self.serialization = serialization or Serialization()

    def payload_serialization(self) -> Serialization:
        return self.serialization


class CountingSerialization(Serialization):
    """Counts the payloads it is asked to check."""

    def __init__(self) -> None:
        super().__init__()
        self.checked: list[Any] = []

    def check(self, obj: object) -> None:
        self.checked.append(obj)
        super().check(obj)


def unencodable() -> dict[str, Any]:
    return {"when": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)}


def handle_core(consumer: Any, **options: Any) -> ProducerCore:
    """A handle's core (no RequestNext announced), started and connected to ``consumer``."""
    core = ProducerCore("p-1", Sink(), Sink(), announce_demand=False, **options)
    core.on_start(Sink())
    core.on_register_consumer(consumer)
    return core


def steady(core: ProducerCore) -> None:
    """First message sent and confirmed, window open to 10: the fast path applies."""
    core.on_msg("first")
    core.on_request(Request(1, 10))


# --- ProducerCore ------------------------------------------------------------------------


def test_a_payload_a_remote_consumer_side_cannot_encode_is_refused_and_nothing_changes() -> None:
    core = handle_core(Remote())
    before = core.snapshot()

    with pytest.raises(SerializationError, match="not JSON serializable"):
        core.on_msg(unencodable())

    assert core.snapshot() == before
    assert core.statistics().refused_payloads == 1


def test_the_message_after_a_refused_one_takes_its_seq_nr() -> None:
    core = handle_core(Remote())
    with pytest.raises(SerializationError):
        core.on_msg(unencodable())

    effects = core.on_msg({"n": 3})

    sent = [e.message for e in effects if type(e) is Send]
    assert [(m.seq_nr, m.message) for m in sent] == [(1, {"n": 3})]


def test_the_steady_state_path_refuses_it_too_and_numbers_nothing() -> None:
    core = handle_core(Remote())
    steady(core)
    before = core.snapshot()

    with pytest.raises(SerializationError):
        core.next_message(unencodable())

    assert core.snapshot() == before
    seq_msg = core.next_message("next")
    assert seq_msg is not None and seq_msg.seq_nr == 2


def test_a_batch_with_one_bad_payload_is_refused_whole() -> None:
    core = handle_core(Remote())
    steady(core)
    before = core.snapshot()

    with pytest.raises(SerializationError) as refused:
        core.on_msg_batch(iter(["a", unencodable(), "c"]))

    assert core.snapshot() == before
    assert any("message 2 of 3" in note for note in refused.value.__notes__)


def test_a_batch_checked_with_the_check_in_force_is_not_checked_again() -> None:
    serialization = CountingSerialization()
    core = handle_core(Remote(serialization))
    steady(core)
    checked = core.gate.refuse(["a", "é"])
    serialization.checked.clear()

    core.on_msg_batch(iter(["a", "é"]), checked)

    assert serialization.checked == []
    assert core.snapshot().current_seq_nr == 4


def test_an_in_process_consumer_side_takes_any_payload_unchecked() -> None:
    core = handle_core(Sink())
    steady(core)
    anything = object()

    seq_msg = core.next_message(anything)

    assert core.gate.check is None
    assert seq_msg is not None and seq_msg.message is anything


def test_bytes_pay_no_check_when_the_serializer_writes_them_as_they_are() -> None:
    serialization = CountingSerialization()
    core = handle_core(Remote(serialization))
    steady(core)
    serialization.checked.clear()

    core.next_message(b"raw")
    core.next_message("text")

    assert serialization.checked == ["text"]


def test_the_check_follows_the_consumer_side_when_it_moves_to_another_process() -> None:
    core = handle_core(Sink())
    steady(core)
    core.next_message(unencodable())  # in-process: taken

    core.on_register_consumer(Remote())

    with pytest.raises(SerializationError):
        core.next_message(unencodable())


def test_a_durable_queue_that_encodes_payloads_is_checked_for_even_in_process() -> None:
    queue = Remote()  # what a SqliteDurableQueue declares
    core = handle_core(
        Sink(),
        payload_encoders=(queue,),
        durable_state=DurableProducerState(),
        clock_millis=lambda: 0,
    )

    with pytest.raises(SerializationError):
        core.on_msg(unencodable())

    assert core.snapshot().current_seq_nr == 1


def test_with_chunking_the_gate_is_off_and_cutting_refuses_the_payload() -> None:
    core = handle_core(Remote(), settings=ProducerControllerSettings(chunk_large_messages=10))

    with pytest.raises(SerializationError):
        core.on_msg(unencodable())

    assert core.gate.check is None
    assert core.snapshot().current_seq_nr == 1


def test_an_actor_producer_whose_message_was_refused_is_told_its_request_next_again() -> None:
    producer = Sink()
    core = ProducerCore("p-1", Sink(), Sink())
    core.on_start(producer)
    core.on_register_consumer(Remote())
    with pytest.raises(SerializationError):
        core.receive(SendNext(unencodable()))

    effects = core.on_refused()

    assert [type(e.message) for e in effects if type(e) is Send] == [RequestNext]
    assert effects[0].to is producer  # type: ignore[attr-defined]


# --- what the check encoded, kept for the transport (serialization.py, "Encoded once") ---


def test_a_checked_payload_is_kept_encoded_for_the_transport_to_write() -> None:
    serialization = Serialization()
    core = handle_core(Remote(serialization))
    steady(core)

    seq_msg = core.next_message({"n": 2})

    assert serialization.check_memo_count == 1
    assert seq_msg is not None
    assert serialization.serialize(seq_msg.message) == (3, "", b'{"n":2}')
    assert serialization.check_memo_count == 0


def test_a_stalled_stream_keeps_at_most_check_memo_size_encodings() -> None:
    serialization = Serialization(check_memo_size=4)
    core = handle_core(Remote(serialization))  # its frames are never built
    steady(core)

    sent = [core.next_message({"n": n}) for n in range(2, 11)]

    assert all(seq_msg is not None for seq_msg in sent)
    assert serialization.check_memo_count == 4


def test_refused_batches_keep_at_most_check_memo_size_encodings() -> None:
    serialization = Serialization(check_memo_size=4)
    core = handle_core(Remote(serialization))
    steady(core)

    for n in range(10):
        with pytest.raises(SerializationError):
            core.on_msg_batch(iter([{"n": n}, unencodable()]))

    assert serialization.check_memo_count == 4
    assert core.statistics().refused_payloads == 10


# --- WorkPullingCore ---------------------------------------------------------------------


def work_pulling(producer: Sink | None = None, **options: Any) -> WorkPullingCore:
    core = WorkPullingCore(
        "wp", Sink(), Sink(), lambda worker_id: Sink(), rng=random.Random(1), **options
    )
    if producer is not None:
        core.on_start(producer)
    return core


def open_window(core: WorkPullingCore) -> None:
    for worker in core.workers.values():
        core.on_worker_message(worker.worker_id, Request(0, 10))


def test_a_work_pulling_core_refuses_what_any_remote_worker_cannot_take() -> None:
    core = work_pulling(Sink())
    core.on_current_workers([Sink(), Remote()])
    open_window(core)
    before = core.snapshot()

    with pytest.raises(SerializationError):
        core.receive(SendNext(unencodable()))

    assert core.snapshot() == before
    assert core.statistics().refused_payloads == 1


def test_a_work_pulling_core_with_in_process_workers_takes_any_payload() -> None:
    core = work_pulling(Sink())
    core.on_current_workers([Sink()])
    open_window(core)

    core.on_msg(object())

    assert core.statistics().sent == 1


def test_a_message_buffered_before_a_remote_worker_came_is_dropped_with_an_error_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = work_pulling()
    core.on_msg(unencodable())  # no worker: buffered, unchecked
    core.on_msg("fine")

    with caplog.at_level(logging.ERROR, "pykka_delivery.work_pulling"):
        effects = core.on_current_workers([Remote()])
        effects += core.on_worker_message(next(iter(core.workers)), Request(0, 10))

    sent = [e.message.message for e in effects if type(e) is Send]
    assert sent == ["fine"]
    assert "drops seq_nr 1" in caplog.text
    assert core.statistics().refused_payloads == 1


def test_a_dropped_buffered_message_of_a_durable_core_is_confirmed_in_the_queue() -> None:
    core = work_pulling(durable_state=DurableProducerState(), clock_millis=lambda: 7)
    core.on_msg(unencodable())

    effects = core.on_current_workers([Remote()])
    effects += core.on_worker_message(next(iter(core.workers)), Request(0, 10))

    assert StoreMessageConfirmed(1, "", 7) in effects


def test_a_work_pulling_producer_whose_message_was_refused_is_told_its_request_next_again() -> None:
    producer = Sink()
    core = work_pulling(producer)
    core.on_current_workers([Remote()])
    open_window(core)
    with pytest.raises(SerializationError):
        core.receive(SendNext(unencodable()))

    effects = core.on_refused()

    assert [type(e.message) for e in effects if type(e) is Send] == [RequestNext]


def test_the_work_pulling_gate_is_aimed_again_at_every_listing() -> None:
    core = work_pulling()
    core.on_current_workers([Remote()])
    assert core.gate.check is not None

    core.receive(CurrentWorkers(frozenset()))

    assert core.gate.check is None
