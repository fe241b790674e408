"""The cores' steady-state fast paths behave exactly like the general handlers.

`ConsumerCore.next_delivery` and `ProducerCore.next_message` skip the effect lists of
`on_sequenced` and `on_msg` when nothing but one delivery (one send) can result. Here two
cores get the same random events; one always takes the general path, the other tries the
fast path first, as the handles do. After every event their effects (the fast path's
result counted as the one `Send` it stands for), snapshots and statistics must be equal.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pykka_delivery.actors.consumer_core import RETRY, ConsumerCore
from pykka_delivery.actors.effects import Effect, Send
from pykka_delivery.actors.messages import (
    ChunkedMessage,
    Request,
    Resend,
    SequencedMessage,
)
from pykka_delivery.actors.producer_core import RESEND_FIRST, ProducerCore
from pykka_delivery.actors.settings import ConsumerControllerSettings, ProducerControllerSettings
from tests.harness import Probe

PRODUCERS = (Probe("pc-a"), Probe("pc-b"))
CONSUMER = Probe("consumer")
PRODUCER = Probe("producer")


def sequenced(pc: int, seq_nr: int, first: bool, chunk: bool) -> SequencedMessage:
    message: Any = ChunkedMessage(b"c", True, True, 1, "") if chunk else f"m{seq_nr}"
    return SequencedMessage(f"p{pc}", seq_nr, message, first, False, PRODUCERS[pc])


consumer_events = st.lists(
    st.one_of(
        st.tuples(
            st.just("seq"),
            st.integers(0, 1),
            st.integers(1, 12),
            st.booleans(),
            st.sampled_from([False, False, False, True]),
        ),
        st.tuples(st.just("confirm")),
        st.tuples(st.just("timer")),
        st.tuples(st.just("register"), st.integers(0, 1)),
        st.tuples(st.just("stop")),
    ),
    max_size=60,
)


def consumer_step(core: ConsumerCore, event: tuple[Any, ...], fast: bool) -> list[Effect]:
    kind = event[0]
    if kind == "seq":
        msg = sequenced(*event[1:])
        if fast:
            delivery = core.next_delivery(msg)
            if delivery is not None:
                assert core.consumer is not None
                return [Send(core.consumer, delivery)]
        return core.on_sequenced(msg)
    if kind == "confirm":
        return core.on_confirmed() if core.current is not None else []
    if kind == "timer":
        return core.on_timer(RETRY)
    if kind == "register":
        return core.on_register_to(PRODUCERS[event[1]])
    return core.on_deliver_then_stop()


@settings(max_examples=300, deadline=None)
@given(events=consumer_events, window=st.sampled_from([1, 2, 4, 20]), lossy=st.booleans())
def test_consumer_fast_path_matches_on_sequenced(
    events: list[tuple[Any, ...]], window: int, lossy: bool
) -> None:
    config = ConsumerControllerSettings(flow_control_window=window, only_flow_control=lossy)
    self_ref = Probe("self")  # shared: RegisterConsumer names it
    general, fast = (ConsumerCore(self_ref, config) for _ in range(2))
    for core in (general, fast):
        core.on_start(CONSUMER)
    for event in events:
        assert consumer_step(general, event, False) == consumer_step(fast, event, True), event
        assert general.snapshot() == fast.snapshot(), event
        assert general.statistics() == fast.statistics(), event


def test_consumer_fast_path_is_taken_in_the_steady_state() -> None:
    core = ConsumerCore(Probe("self"))
    core.on_start(CONSUMER)
    core.on_sequenced(sequenced(0, 1, True, False))  # a new session: the general path
    core.on_confirmed()
    delivery = core.next_delivery(sequenced(0, 2, False, False))
    assert delivery is not None
    assert (delivery.message, delivery.seq_nr) == ("m2", 2)
    assert core.next_delivery(sequenced(0, 3, False, False)) is None  # 2 unconfirmed
    core.on_confirmed()
    assert core.next_delivery(sequenced(0, 4, False, False)) is None  # a gap
    assert core.snapshot().received_seq_nr == 2


producer_events = st.lists(
    st.one_of(
        st.tuples(st.just("msg")),
        st.tuples(st.just("msg")),
        st.tuples(
            st.just("request"),
            st.integers(0, 10),
            st.integers(0, 25),
            st.booleans(),
            st.booleans(),
        ),
        st.tuples(st.just("ack"), st.integers(0, 10)),
        st.tuples(st.just("resend"), st.integers(0, 10)),
        st.tuples(st.just("timer")),
        st.tuples(st.just("register"), st.integers(0, 1)),
    ),
    max_size=60,
)


def producer_step(core: ProducerCore, event: tuple[Any, ...], fast: bool) -> list[Effect]:
    kind = event[0]
    if kind == "msg":
        if not core.has_demand:
            return []
        if fast:
            seq_msg = core.next_message("payload")
            if seq_msg is not None:
                assert core.consumer is not None
                return [Send(core.consumer, seq_msg)]
        return core.on_msg("payload")
    if kind == "request":
        confirmed, extra, resend, via_timeout = event[1:]
        return core.on_request(Request(confirmed, confirmed + extra, resend, via_timeout))
    if kind == "ack":
        return core.on_ack(event[1])
    if kind == "resend":
        return core.receive(Resend(event[1]))
    if kind == "timer":
        return core.on_timer(RESEND_FIRST)
    return core.on_register_consumer(PRODUCERS[event[1]])


@settings(max_examples=300, deadline=None)
@given(events=producer_events, chunked=st.booleans())
def test_producer_fast_path_matches_on_msg(events: list[tuple[Any, ...]], chunked: bool) -> None:
    config = ProducerControllerSettings(chunk_large_messages=3 if chunked else 0)
    self_ref, send_next_to = Probe("self"), Probe("send-next")  # shared: RequestNext names them
    cores = [
        ProducerCore("p", self_ref, send_next_to, config, announce_demand=False) for _ in range(2)
    ]
    general, fast = cores
    for core in cores:
        core.on_start(PRODUCER)
        core.on_register_consumer(CONSUMER)
    for event in events:
        assert producer_step(general, event, False) == producer_step(fast, event, True), event
        assert general.snapshot() == fast.snapshot(), event
        assert general.statistics() == fast.statistics(), event


def test_producer_fast_path_is_taken_in_the_steady_state() -> None:
    core = ProducerCore("p", Probe("self"), Probe("send-next"), announce_demand=False)
    core.on_start(Probe("producer"))
    core.on_register_consumer(CONSUMER)
    assert core.next_message("first") is None  # the first message starts a timer
    core.on_msg("first")
    core.on_request(Request(1, 3, True, False))
    second = core.next_message("second")
    assert second is not None
    assert (second.seq_nr, second.message, second.first) == (2, "second", False)
    assert [m.seq_nr for m in core.unconfirmed] == [2]  # first confirmed, second kept
    assert core.next_message("third") is not None
    assert core.next_message("fourth") is None  # window full
    assert core.on_ack(3) == []
