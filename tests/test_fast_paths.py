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
from pykka_delivery.actors.durable_queue import DurableProducerState
from pykka_delivery.actors.effects import (
    Effect,
    Send,
    StoreMessageSent,
    StoreMessagesSent,
)
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


# With deduplication, also "next": the next seq_nr in order (the steady state), so that
# runs of duplicates below the floor are met often.
dedup_consumer_events = st.lists(
    st.one_of(
        st.tuples(
            st.just("seq"),
            st.integers(0, 1),
            st.integers(1, 12),
            st.booleans(),
            st.sampled_from([False, False, False, True]),
        ),
        st.tuples(st.just("next"), st.integers(0, 1)),
        st.tuples(st.just("next"), st.integers(0, 1)),
        st.tuples(st.just("confirm")),
        st.tuples(st.just("timer")),
        st.tuples(st.just("register"), st.integers(0, 1)),
        st.tuples(st.just("stop")),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(
    events=dedup_consumer_events,
    window=st.sampled_from([1, 2, 4, 20]),
    lossy=st.booleans(),
    positions=st.fixed_dictionaries({"p0": st.integers(0, 10), "p1": st.integers(0, 10)}),
    restart=st.sampled_from(["drop", "reset"]),
)
def test_consumer_fast_path_matches_on_sequenced_with_deduplication(
    events: list[tuple[Any, ...]],
    window: int,
    lossy: bool,
    positions: dict[str, int],
    restart: str,
) -> None:
    """The same with deduplication positions (dedup.py): a message at or below the
    session's floor must leave the fast path to the general one."""
    config = ConsumerControllerSettings(
        flow_control_window=window, only_flow_control=lossy, on_sequence_restart=restart
    )
    self_ref = Probe("self")
    general, fast = (ConsumerCore(self_ref, config, dedup_positions=positions) for _ in range(2))
    for core in (general, fast):
        core.on_start(CONSUMER)
    for drawn in events:
        event = drawn
        if drawn[0] == "next":
            event = ("seq", drawn[1], general.received_seq_nr + 1, False, False)
        assert consumer_step(general, event, False) == consumer_step(fast, event, True), event
        assert general.snapshot() == fast.snapshot(), event
        assert general.statistics() == fast.statistics(), event
        assert general.dedup_positions() == fast.dedup_positions(), event


def test_consumer_fast_path_leaves_duplicates_to_the_general_path() -> None:
    core = ConsumerCore(Probe("self"), dedup_positions={"p0": 3})
    core.on_start(CONSUMER)
    core.on_sequenced(sequenced(0, 2, True, False))  # a session from 2: a duplicate

    assert core.next_delivery(sequenced(0, 3, False, False)) is None  # 3 is one too
    core.on_sequenced(sequenced(0, 3, False, False))
    delivery = core.next_delivery(sequenced(0, 4, False, False))

    assert delivery is not None
    assert delivery.seq_nr == 4
    assert core.statistics().dedup_duplicates == 2


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


def durable_core(chunked: bool = False) -> ProducerCore:
    config = ProducerControllerSettings(chunk_large_messages=3 if chunked else 0)
    return ProducerCore(
        "p",
        Probe("self"),
        Probe("send-next"),
        config,
        announce_demand=False,
        durable_state=DurableProducerState(),
        clock_millis=lambda: 0,
    )


def test_producer_fast_path_is_not_taken_in_durable_mode() -> None:
    """The fast path has no room for the store that must come before the send."""
    core = durable_core()
    core.on_start(PRODUCER)
    core.on_register_consumer(CONSUMER)
    core.on_msg("first")
    core.on_request(Request(1, 3, True, False))

    assert core.has_demand
    assert core.next_message("second") is None
    assert core.snapshot().current_seq_nr == 2  # nothing changed
    assert type(core.on_msg("second")[0]) is StoreMessageSent


def split(effects: list[Effect]) -> tuple[list[Any], list[Any], list[Effect]]:
    """(messages sent in order, messages stored in order, the other effects)."""
    sent = [e.message for e in effects if isinstance(e, Send)]
    stored: list[Any] = []
    others: list[Effect] = []
    for e in effects:
        if isinstance(e, StoreMessagesSent):
            stored += e.sents
        elif isinstance(e, StoreMessageSent):
            stored.append(e.sent)
        elif not isinstance(e, Send):
            others.append(e)
    return sent, stored, others


def producer_batch_step(
    core: ProducerCore, event: tuple[Any, ...], batch: bool, k: int
) -> list[Effect]:
    if event[0] != "msg":
        return producer_step(core, event, False)
    if not core.has_demand:
        return []
    payloads = [f"payload-{i}" for i in range(k)]
    if batch:
        return core.on_msg_batch(iter(payloads))
    effects: list[Effect] = []
    for payload in payloads[: 1 if core.settings.chunk_large_messages else k]:
        if not core.has_demand:
            break
        effects += core.on_msg(payload)
    return effects


@settings(max_examples=200, deadline=None)
@given(
    events=producer_events,
    chunked=st.booleans(),
    durable=st.booleans(),
    k=st.integers(1, 6),
)
def test_producer_batch_path_matches_on_msg_one_message_at_a_time(
    events: list[tuple[Any, ...]], chunked: bool, durable: bool, k: int
) -> None:
    """`on_msg_batch` of k messages: the same sends, stores, state and statistics as
    `on_msg` for each while there is demand (the stores as one effect instead of k)."""
    if durable:
        cores = [durable_core(chunked) for _ in range(2)]
    else:
        config = ProducerControllerSettings(chunk_large_messages=3 if chunked else 0)
        cores = [
            ProducerCore("p", Probe("self"), Probe("send-next"), config, announce_demand=False)
            for _ in range(2)
        ]
    single, batched = cores
    for core in cores:
        core.on_start(PRODUCER)
        core.on_register_consumer(CONSUMER)
    for event in events:
        one = split(producer_batch_step(single, event, False, k))
        many = split(producer_batch_step(batched, event, True, k))
        assert one == many, event
        assert single.snapshot() == batched.snapshot(), event
        assert single.statistics() == batched.statistics(), event
