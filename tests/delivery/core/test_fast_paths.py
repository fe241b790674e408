"""The cores' steady-state fast paths behave exactly like the general handlers.

`ConsumerCore.next_delivery` and `ProducerCore.next_message` skip the effect lists of
`on_sequenced` and `on_msg` when nothing but one delivery (one send) can result. Here two
cores get the same random events; one always takes the general path, the other tries the
fast path first, as the sessions do. After every event their effects (the fast path's
result counted as the one `Send` it stands for), snapshots and statistics must be equal.

`ConsumerCore.next_delivery` is also the steady state for the next message of a
`SequencedRun` (what a transport hands the consumer handles), and `on_confirmed` has a
shortcut of its own for the steady state: both are compared the same way, with the cores
fed as `ConsumerSession.poll` feeds them (`Fed`).
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykka_delivery.delivery.core.consumer import REDELIVER, RETRY, ConsumerCore
from pykka_delivery.delivery.core.effects import (
    CancelTimer,
    Effect,
    Send,
    StartTimer,
    StoreMessageSent,
    StoreMessagesSent,
    WriteDeadLetter,
)
from pykka_delivery.delivery.core.producer import RESEND_FIRST, ProducerCore
from pykka_delivery.delivery.core.settings import (
    ConsumerControllerSettings,
    ProducerControllerSettings,
)
from pykka_delivery.delivery.core.work_pulling import WorkPullingCore
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.stores.durable_queue import DurableProducerState
from pykka_delivery.errors import LocalProtocolError
from pykka_delivery.protocol.messages import (
    Ack,
    ChunkedMessage,
    Request,
    Resend,
    SequencedMessage,
    SequencedRun,
)
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
        if fast:  # tried first, demand or not, as `ProducerSession.try_send` does
            seq_msg = core.next_message("payload")
            if seq_msg is not None:
                assert core.consumer is not None
                return [Send(core.consumer, seq_msg)]
        if not core.has_demand:
            return []
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


def durable_core(chunked: bool = False, store_ahead: int = 0) -> ProducerCore:
    config = ProducerControllerSettings(
        chunk_large_messages=3 if chunked else 0, durable_store_ahead=store_ahead
    )
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
    `on_msg` for each while there is demand (the stores as one effect instead of k).
    Durable cores store nothing ahead here (``durable_store_ahead=0``): see below."""
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


# --- WorkPullingCore.next_message ----------------------------------------------------


class FirstChoice(random.Random):
    """Picks the first worker with demand, and numbers worker ids: two cores pick alike
    however often each asks (the fast path asks once more when it declines)."""

    def __init__(self) -> None:
        super().__init__(0)
        self._ids = itertools.count(1)

    def choice(self, seq: Any) -> Any:
        return seq[0]

    def getrandbits(self, k: int) -> int:
        return next(self._ids)


WORKERS = (Probe("worker-a"), Probe("worker-b"), Probe("worker-c"))

work_pulling_events = st.lists(
    st.one_of(
        st.tuples(st.just("msg")),
        st.tuples(st.just("msg")),
        st.tuples(st.just("msg")),
        st.tuples(st.just("request"), st.integers(0, 2), st.integers(0, 3), st.integers(0, 6)),
        st.tuples(st.just("ack"), st.integers(0, 2), st.integers(0, 3)),
        st.tuples(st.just("workers"), st.sets(st.integers(0, 2))),
    ),
    max_size=60,
)


def work_pulling_step(core: WorkPullingCore, event: tuple[Any, ...], fast: bool) -> list[Effect]:
    kind = event[0]
    if kind == "msg":
        if fast:  # tried first, demand or not, as `WorkPullingSession.try_send` does
            picked = core.next_message("payload")
            if picked is not None:
                return [Send(*picked)]
        return core.on_msg("payload") if core.has_demand else []
    if kind == "workers":
        return core.on_current_workers(WORKERS[i] for i in sorted(event[1]))
    workers = list(core.workers.values())
    if not workers:
        return []
    worker = workers[event[1] % len(workers)]
    confirmed = max(0, worker.core.current_seq_nr - 1 - event[2])
    message = Request(confirmed, confirmed + event[3]) if kind == "request" else Ack(confirmed)
    return core.on_worker_message(worker.worker_id, message)


@settings(max_examples=300, deadline=None)
@given(events=work_pulling_events)
def test_work_pulling_fast_path_matches_on_msg(events: list[tuple[Any, ...]]) -> None:
    cores = [
        WorkPullingCore(
            "p",
            Probe("send-next"),
            Probe("ask-next"),
            lambda _: Probe("worker-ref"),
            rng=FirstChoice(),
            ack_each_message=False,
        )
        for _ in range(2)
    ]
    general, fast = cores
    for event in events:
        assert work_pulling_step(general, event, False) == work_pulling_step(fast, event, True)
        assert general.snapshot() == fast.snapshot(), event
        assert general.statistics() == fast.statistics(), event


def test_work_pulling_fast_path_is_taken_in_the_steady_state() -> None:
    core = WorkPullingCore(
        "p",
        Probe("send-next"),
        Probe("ask-next"),
        lambda _: Probe("worker-ref"),
        rng=FirstChoice(),
        ack_each_message=False,
    )
    core.on_current_workers([WORKERS[0]])
    assert core.next_message("first") is None  # a session's first message starts a timer
    core.on_msg("first")
    (worker,) = core.workers.values()
    core.on_worker_message(worker.worker_id, Request(1, 3))

    picked = core.next_message("second")

    assert picked is not None
    assert (picked[0], picked[1].message, picked[1].first) == (WORKERS[0], "second", False)
    assert core.snapshot().current_seq_nr == 3


# --- runs: ConsumerCore.next_delivery(run, True) -------------------------------------


def plain(pc: int, seq_nr: int) -> SequencedMessage:
    """What a run holds for ``seq_nr``, as the general path gets it (built here, not by
    `SequencedRun.expand`, so that the comparison does not trust the code under test)."""
    return SequencedMessage(f"p{pc}", seq_nr, f"m{seq_nr}", False, False, PRODUCERS[pc])


def single(pc: int, seq_nr: int, first: bool, chunk: bool, ack: bool) -> SequencedMessage:
    """A message that travels alone, not in a run (first, a chunk, or asking for an Ack)."""
    msg = sequenced(pc, seq_nr, first, chunk)
    return SequencedMessage(msg.producer_id, seq_nr, msg.message, first, ack, PRODUCERS[pc])


def run_of(pc: int, first_seq_nr: int, length: int) -> SequencedRun:
    messages = [f"m{n}" for n in range(first_seq_nr, first_seq_nr + length)]
    return SequencedRun(f"p{pc}", first_seq_nr, messages, PRODUCERS[pc])


def confirm_slowly(core: ConsumerCore) -> list[Effect]:
    """`on_confirmed` without its steady-state shortcut: what it does when the shortcut
    does not apply (raises `LocalProtocolError` as it does)."""
    current = core._awaited("Confirmed")
    effects: list[Effect] = []
    core._complete(current, effects)
    return effects


class Fed:
    """A consumer core fed as `ConsumerSession` feeds it: what arrives waits in an
    inbox, and one message is fed only when no delivery is out (``outstanding``: handed
    to the consumer, not yet confirmed or rejected). The general one gets every message
    as a `SequencedMessage` through `on_sequenced` and confirms without the shortcut; the
    fast one gets runs as `SequencedRun` and tries the fast paths first, as the session
    does (``poll``, ``deliver_then_stop``)."""

    def __init__(self, core: ConsumerCore, fast: bool) -> None:
        self.core = core
        self.fast = fast
        self.inbox: deque[SequencedMessage | SequencedRun] = deque()
        self.outstanding = False

    def pending(self) -> list[tuple[str, int, Any]]:
        """What waits in the inbox, message by message."""
        out = []
        for item in self.inbox:
            for m in item.expand() if type(item) is SequencedRun else [item]:
                out.append((m.producer_id, m.seq_nr, m.message))
        return out

    def arrive(self, pc: int, first_seq_nr: int, length: int) -> None:
        if self.fast:
            self.inbox.append(run_of(pc, first_seq_nr, length))
        else:
            self.inbox.extend(plain(pc, n) for n in range(first_seq_nr, first_seq_nr + length))

    def feed_one(self) -> list[Effect]:
        """Feed the inbox's next message, unless a delivery is out (the shell waits)."""
        if self.outstanding or not self.inbox:
            return []
        core = self.core
        head = self.inbox[0]
        if type(head) is SequencedRun:
            delivery = core.next_delivery(head, True)
            if delivery is not None:
                if head.remaining == 0:
                    self.inbox.popleft()
                assert core.consumer is not None
                return [Send(core.consumer, delivery)]
            assert head.remaining > 0, "a refused run must not be taken from"
            self.inbox.popleft()
            self.inbox.extendleft(reversed(head.expand()))
            head = self.inbox[0]
        self.inbox.popleft()
        assert type(head) is SequencedMessage
        if self.fast:
            delivery = core.next_delivery(head)
            if delivery is not None:
                assert core.consumer is not None
                return [Send(core.consumer, delivery)]
        return core.on_sequenced(head)

    def feed_all_then_stop(self) -> list[Effect]:
        """``deliver_then_stop``: everything in the inbox into the core, then stop."""
        effects: list[Effect] = []
        while self.inbox:
            item = self.inbox.popleft()
            for m in item.expand() if type(item) is SequencedRun else [item]:
                effects += self.core.on_sequenced(m)
        return effects + self.core.on_deliver_then_stop()

    def answer(self, confirm: bool) -> list[Effect] | str:
        """Confirm or reject the delivery that is out (nothing if none is)."""
        if not self.outstanding:
            return []
        self.outstanding = False
        try:
            if not confirm:
                return self.core.on_rejected("bad")
            return self.core.on_confirmed() if self.fast else confirm_slowly(self.core)
        except LocalProtocolError as error:
            return f"refused: {error}"

    def step(self, event: tuple[Any, ...]) -> list[Effect] | str:
        kind = event[0]
        core = self.core
        effects: list[Effect] | str
        if kind == "run":
            self.arrive(*event[1:])
            effects = []
        elif kind == "seq":
            self.inbox.append(single(*event[1:]))
            effects = []
        elif kind == "direct":  # straight into the core, as the controller actor does
            effects = core.on_sequenced(single(*event[1:]))
        elif kind == "feed":
            effects = self.feed_one()
        elif kind in ("confirm", "reject"):
            effects = self.answer(kind == "confirm")
        elif kind == "timer":
            effects = core.on_timer(RETRY)
        elif kind == "redeliver":
            effects = core.on_timer(REDELIVER)
        elif kind == "register":
            effects = core.on_register_to(PRODUCERS[event[1]])
        else:
            effects = self.feed_all_then_stop()
        if not isinstance(effects, str) and any(
            type(e) is Send and e.to is CONSUMER for e in effects
        ):
            self.outstanding = True
        return effects


# Mostly the steady state (runs that continue the stream, fed and confirmed), with the
# events that leave it: gaps, duplicates, the other producer controller, single messages
# (first, chunks), rejections, retry ticks, registering elsewhere, stopping.
_steady = st.one_of(
    st.tuples(st.just("next-run"), st.integers(1, 6)),
    st.tuples(st.just("flow"), st.integers(1, 8)),  # feed and confirm, n times
    st.sampled_from([("feed",), ("confirm",), ("bounce",), ("timer",)]),
    st.tuples(st.just("next-seq"), st.booleans(), st.booleans()),  # a chunk, an ack
)
# Composite events, expanded into their steps (each step compared).
COMPOSITES: dict[str, list[tuple[Any, ...]]] = {
    "flow": [("feed",), ("confirm",)],  # repeated n times
    # Out, rejected, the session feeds on while the redelivery waits, redelivered.
    "bounce": [("feed",), ("reject",), ("feed",), ("redeliver",)],
}
run_events = st.lists(
    st.one_of(
        _steady,
        _steady,
        _steady,
        _steady,
        st.tuples(st.just("run"), st.integers(0, 1), st.integers(1, 15), st.integers(1, 5)),
        st.tuples(
            st.sampled_from(["seq", "direct"]),
            st.integers(0, 1),
            st.integers(1, 15),
            st.booleans(),
            st.sampled_from([False, False, False, True]),
            st.sampled_from([False, False, True]),
        ),
        st.sampled_from([("reject",), ("redeliver",), ("stop",)]),
        st.tuples(st.just("register"), st.integers(0, 1)),
    ),
    min_size=5,
    max_size=60,
)


def continued(fed: Fed, drawn: tuple[Any, ...]) -> tuple[Any, ...]:
    """``next-run`` and ``next-seq`` as a ``run`` or ``seq`` that continues what the
    general core received and holds in its inbox (the steady state), from its producer
    controller."""
    core = fed.core
    pc = 1 if core.producer_controller is PRODUCERS[1] else 0
    pending = [seq_nr for pid, seq_nr, _ in fed.pending() if pid == f"p{pc}"]
    seq_nr = (pending[-1] if pending else core.received_seq_nr) + 1
    if drawn[0] == "next-run":
        return ("run", pc, seq_nr, drawn[1])
    return ("seq", pc, seq_nr, False, *drawn[1:])


@settings(max_examples=400, deadline=None)
@given(
    events=run_events,
    window=st.sampled_from([1, 2, 4, 20, 50]),
    lossy=st.booleans(),
    positions=st.one_of(
        st.none(),
        st.none(),
        st.fixed_dictionaries({"p0": st.integers(0, 8), "p1": st.integers(0, 8)}),
    ),
    opened=st.sampled_from([True, True, True, False]),
)
def test_consumer_run_fast_path_matches_on_sequenced_message_by_message(
    events: list[tuple[Any, ...]],
    window: int,
    lossy: bool,
    positions: dict[str, int] | None,
    opened: bool,
) -> None:
    """Runs (`SequencedRun`) fed as `ConsumerSession.poll` feeds them: the fast core tries
    `next_delivery` and on None feeds the rest of the run through `on_sequenced`; the
    general core gets each message through `on_sequenced` and confirms without the
    `on_confirmed` shortcut. Rejections and redeliveries may come while a run's message
    is out. Most examples start with a session opened by seq_nr 1 (``opened``). After
    every event: the same effects, snapshots, statistics, deduplication
    positions, and the same messages waiting in the inboxes."""
    config = ConsumerControllerSettings(
        flow_control_window=window,
        only_flow_control=lossy,
        max_attempts=2,
        redelivery_backoff=0.1,
    )
    self_ref = Probe("self")
    general, fast = (
        Fed(ConsumerCore(self_ref, config, dedup_positions=positions), fast)
        for fast in (False, True)
    )
    opening = [("seq", 0, 1, True, False, False), ("feed",), ("confirm",)] if opened else []
    for fed in (general, fast):
        fed.core.on_start(CONSUMER)
    steps = []
    for e in [*opening, *events]:
        if e[0] in COMPOSITES:
            steps += COMPOSITES[e[0]] * (e[1] if len(e) > 1 else 1)
        else:
            steps.append(e)
    for drawn in steps:
        event = continued(general, drawn) if drawn[0].startswith("next-") else drawn
        assert general.step(event) == fast.step(event), event
        assert general.core.snapshot() == fast.core.snapshot(), event
        assert general.core.statistics() == fast.core.statistics(), event
        assert general.core.dedup_positions() == fast.core.dedup_positions(), event
        assert general.pending() == fast.pending(), event
        assert general.outstanding == fast.outstanding, event


def steady_core(settings: ConsumerControllerSettings | None = None) -> ConsumerCore:
    """A core in the steady state with producer controller 0: seq_nr 1 confirmed."""
    core = ConsumerCore(Probe("self"), settings)
    core.on_start(CONSUMER)
    core.on_sequenced(sequenced(0, 1, True, False))
    core.on_confirmed()
    return core


def test_consumer_run_fast_path_is_taken_in_the_steady_state() -> None:
    core = steady_core()
    run = run_of(0, 2, 3)

    delivery = core.next_delivery(run, True)

    assert delivery is not None
    assert (delivery.message, delivery.producer_id, delivery.seq_nr) == ("m2", "p0", 2)
    assert (run.seq_nr, run.message, run.remaining) == (2, "m2", 2)
    assert core.current is run  # the run stands for seq_nr 2 until it is confirmed
    assert core.next_delivery(run, True) is None  # 2 unconfirmed: nothing taken
    assert (run.seq_nr, run.remaining) == (2, 2)
    assert core.on_confirmed() == []  # the steady state: nothing to tell
    third = core.next_delivery(run, True)
    assert third is not None
    assert (third.message, third.seq_nr, third.attempt) == ("m3", 3, 1)
    core.on_confirmed()
    assert core.next_delivery(run, True) is not None
    assert run.remaining == 0
    core.on_confirmed()
    snapshot = core.snapshot()
    assert (snapshot.received_seq_nr, snapshot.confirmed_seq_nr) == (4, 4)
    assert (core.statistics().delivered, core.statistics().confirmed) == (4, 4)


@pytest.mark.parametrize(
    ("run", "why"),
    [
        (run_of(0, 3, 2), "a gap: 2 is missing"),
        (run_of(0, 1, 3), "duplicates: 1 was received"),
        (run_of(1, 2, 2), "another producer controller"),
    ],
    ids=["gap", "duplicate", "other-producer"],
)
def test_consumer_run_fast_path_is_refused_outside_the_steady_state(
    run: SequencedRun, why: str
) -> None:
    core = steady_core()
    before = (core.snapshot(), core.statistics())

    assert core.next_delivery(run, True) is None, why

    assert run.remaining == len(run.expand()) == run.last_seq_nr - run.seq_nr  # untouched
    assert run.expand()[0].seq_nr == run.seq_nr + 1
    assert (core.snapshot(), core.statistics()) == before
    assert core.current is None


def test_consumer_run_fast_path_is_refused_while_a_delivery_is_unconfirmed() -> None:
    core = steady_core()
    core.on_sequenced(plain(0, 2))  # delivered, not confirmed
    run = run_of(0, 3, 2)

    assert core.next_delivery(run, True) is None

    assert (run.seq_nr, run.remaining) == (2, 2)
    assert core.snapshot().received_seq_nr == 2


def test_consumer_run_fast_path_is_refused_before_the_first_message_of_a_session() -> None:
    core = ConsumerCore(Probe("self"))
    core.on_start(CONSUMER)

    assert core.next_delivery(run_of(0, 1, 2), True) is None
    assert core.next_delivery(run_of(0, 2, 2), True) is None

    assert core.snapshot().received_seq_nr == 0


def test_a_message_taken_from_a_run_counts_as_heard_by_the_retry_timer() -> None:
    """P6 (consumer_core.py): no retry after a tick interval in which a message arrived,
    also when it came through the run fast path."""
    core = steady_core()
    assert core.on_timer(RETRY) == []  # seq_nr 1 arrived in this interval
    run = run_of(0, 2, 1)

    assert core.next_delivery(run, True) is not None
    core.on_confirmed()

    assert core.on_timer(RETRY) == []  # seq_nr 2 arrived in this interval
    retried = core.on_timer(RETRY)  # silence: now it retries
    assert Send(PRODUCERS[0], Request(2, 50, True, True)) in retried


def test_consumer_fast_path_leaves_a_message_during_a_retry_backoff_to_the_general_path() -> None:
    """The general path resets the retry timer for it (Akka's ``retryTimer.reset()``)."""
    core = steady_core()
    core.on_timer(RETRY)  # seq_nr 1 arrived in this interval
    core.on_timer(RETRY)  # silence: a retry, and the interval backs off
    assert core.snapshot().retry_interval == 3.0

    assert core.next_delivery(sequenced(0, 2, False, False)) is None
    effects = core.on_sequenced(sequenced(0, 2, False, False))

    assert effects[0] == StartTimer(RETRY, 2.0)
    assert core.snapshot().retry_interval == 2.0


REJECTING = ConsumerControllerSettings(
    max_attempts=2, redelivery_backoff=0.1, redelivery_backoff_max=0.1
)


def test_a_rejected_run_message_is_redelivered_before_the_run_moves_on() -> None:
    core = steady_core(REJECTING)
    run = run_of(0, 2, 2)
    core.next_delivery(run, True)

    assert core.on_rejected("flaky") == [StartTimer(REDELIVER, 0.1)]
    assert core.next_delivery(run, True) is None  # the rejected one comes again first
    assert (run.seq_nr, run.remaining) == (2, 1)
    redelivered = core.on_timer(REDELIVER)

    assert redelivered == [
        CancelTimer(REDELIVER),
        Send(CONSUMER, Delivery("m2", CONSUMER, "p0", 2, 2)),
    ]
    assert core.next_delivery(run, True) is None  # still out
    core.on_confirmed()
    third = core.next_delivery(run, True)
    assert third is not None
    assert (third.message, third.seq_nr, third.attempt) == ("m3", 3, 1)
    assert core.statistics().rejected == 1


def test_a_run_message_rejected_max_attempts_times_is_dead_lettered_then_the_run_goes_on() -> None:
    core = steady_core(REJECTING)
    run = run_of(0, 2, 2)
    core.next_delivery(run, True)
    core.on_rejected("bad")
    core.on_timer(REDELIVER)

    effects = core.on_rejected("still bad")

    assert effects[0] == WriteDeadLetter("p0", 2, "m2", "still bad", 2)
    assert core.snapshot().confirmed_seq_nr == 2
    third = core.next_delivery(run, True)
    assert third is not None
    assert (third.message, third.seq_nr, third.attempt) == ("m3", 3, 1)
    assert core.statistics().dead_lettered == 1


def test_a_run_message_can_be_redelivered_from_a_run_given_up_on_by_the_feeder() -> None:
    """While a run's message waits for its redelivery the session feeds the rest of the run
    as messages (they are stashed); the redelivery still names the run's message."""
    core = steady_core(REJECTING)
    run = run_of(0, 2, 3)
    core.next_delivery(run, True)
    core.on_rejected("flaky")
    for message in run.expand():
        assert core.on_sequenced(message) == []
    assert core.snapshot().stashed == (3, 4)

    assert core.on_timer(REDELIVER)[1] == Send(CONSUMER, Delivery("m2", CONSUMER, "p0", 2, 2))
    confirmed = core.on_confirmed()

    assert Send(CONSUMER, Delivery("m3", CONSUMER, "p0", 3, 1)) in confirmed
    assert core.snapshot().stashed == (4,)


@settings(max_examples=300, deadline=None)
@given(events=producer_events, k=st.integers(1, 8), ahead=st.integers(1, 5))
def test_stored_ahead_messages_are_stored_before_sent_and_sent_in_order_as_demand_comes(
    events: list[tuple[Any, ...]], k: int, ahead: int
) -> None:
    """A durable batch that takes more than the demand (``durable_store_ahead``): every
    message is stored before its first send, each seq_nr is sent for the first time in
    order, never beyond the window, the producer gets no demand while some wait, and
    nothing counts as all confirmed until they are sent and confirmed."""
    core = durable_core(store_ahead=ahead)
    core.on_start(PRODUCER)
    core.on_register_consumer(CONSUMER)
    stored: set[int] = set()
    first_sends: list[int] = []
    numbered = 0
    for event in events:
        before = core.last_seq_nr
        effects = producer_batch_step(core, event, True, k)
        numbered += core.last_seq_nr - before
        for effect in effects:
            if isinstance(effect, StoreMessagesSent):
                stored.update(m.seq_nr for m in effect.sents)
            elif isinstance(effect, Send) and isinstance(effect.message, SequencedMessage):
                seq_nr = effect.message.seq_nr
                assert seq_nr in stored, "sent before it was stored"
                if seq_nr not in first_sends:
                    first_sends.append(seq_nr)
        assert first_sends == list(range(1, len(first_sends) + 1))
        snapshot = core.snapshot()
        if first_sends:
            assert first_sends[-1] <= max(snapshot.requested_seq_nr, 1)
        if snapshot.remaining_chunks:
            assert not core.has_demand
            if snapshot.confirmed_seq_nr < snapshot.remaining_chunks[-1]:
                assert not core.all_confirmed
        assert core.last_seq_nr == numbered
        assert sorted(stored) == list(range(1, numbered + 1))


def test_a_durable_batch_stores_ahead_in_one_write_and_sends_the_rest_on_demand() -> None:
    """With a window of 2 and ``durable_store_ahead`` 3: five messages stored at once, two
    sent; the next Request sends the other three with no further store."""
    core = durable_core(store_ahead=3)
    core.on_start(PRODUCER)
    core.on_register_consumer(CONSUMER)
    core.on_msg("first")
    core.on_request(Request(1, 3, True, False))
    effects = core.on_msg_batch(iter(["a", "b", "c", "d", "e", "f"]))
    stores = [e for e in effects if isinstance(e, StoreMessagesSent)]
    sent = [e.message.seq_nr for e in effects if isinstance(e, Send)]
    assert [[m.seq_nr for m in e.sents] for e in stores] == [[2, 3, 4, 5, 6]]
    assert sent == [2, 3]
    assert core.last_seq_nr == 6
    assert not core.has_demand
    later = core.on_request(Request(3, 8, True, False))
    assert not any(isinstance(e, StoreMessagesSent | StoreMessageSent) for e in later)
    assert [
        e.message.seq_nr
        for e in later
        if isinstance(e, Send) and isinstance(e.message, SequencedMessage)
    ] == [4, 5, 6]
    assert core.has_demand
