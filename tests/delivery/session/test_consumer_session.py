"""The consumer session, driven with no thread: what a test accepts waits in the inbox
until it polls, what the session sends waits in the outbox until it is taken, and timers
fire only when the test fires them (`ManualTimerService`).

* poll: the first message, the steady state (from a message or a run), nothing yet, a
  delivery outstanding;
* confirm and reject of the outstanding delivery, and of any other;
* the deduplication store: a confirmation is recorded, and flushed before the Request
  that tells the producer side of it;
* the failure rule: a failing deduplication store or dead-letter destination closes the
  session at once, drops the outbox, tells the shell once, and is named by every later
  `ClosedError`;
* close, deliver_then_stop, and a session whose deliveries go out (the actor's).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pykka_delivery.delivery.core.consumer import REDELIVER, RETRY, ConsumerCore
from pykka_delivery.delivery.core.effects import Effect, Send
from pykka_delivery.delivery.core.settings import (
    ACTOR_FLOW_CONTROL_WINDOW,
    HANDLE_FLOW_CONTROL_WINDOW,
    ConsumerControllerSettings,
)
from pykka_delivery.delivery.messages import Delivery
from pykka_delivery.delivery.session.consumer import ConsumerSession
from pykka_delivery.delivery.stores.dead_letters import DeadLetterError, MemoryDeadLetters
from pykka_delivery.delivery.stores.dedup import DedupStoreError, MemoryDedupStore
from pykka_delivery.delivery.timers import Timers
from pykka_delivery.errors import ClosedError, LocalProtocolError
from pykka_delivery.protocol.messages import (
    Ack,
    Request,
    Resend,
    SequencedMessage,
    SequencedRun,
)
from tests.harness import ManualTimerService, Probe

PID = "p-1"
SETTINGS = ConsumerControllerSettings(
    flow_control_window=20,
    resend_interval_min=60.0,  # no retry unless a test fires the timers
    resend_interval_max=90.0,
    max_attempts=2,
    redelivery_backoff=0.5,
    redelivery_backoff_max=0.5,
    dedup_store_attempts=1,
    dedup_store_backoff=0.0,
    dedup_store_backoff_max=0.0,
)


class Ends:
    """Counts the session's calls of ``on_end``."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def session_of(
    timers: ManualTimerService,
    *,
    hand_out: bool = True,
    on_end: Callable[[], None] | None = None,
    **kwargs: Any,
) -> ConsumerSession:
    """A started session whose timer firings land in its inbox; each delivery has a
    ``confirm_to`` of its own, as the handles make them."""
    if "confirm_to" not in kwargs:
        kwargs["new_confirm_to"] = lambda: Probe("confirm_to")
    inbox: deque[Any] = deque()
    session = ConsumerSession(
        Probe("self"),
        SETTINGS,
        name="Consumer",
        timers=Timers(inbox.append, timers),
        inbox=inbox,
        hand_out=hand_out,
        on_end=on_end,
        **kwargs,
    )
    session.start()
    return session


def seq(pc: Probe, seq_nr: int, first: bool = False) -> SequencedMessage:
    return SequencedMessage(PID, seq_nr, f"m{seq_nr}", first, False, pc)


def run(pc: Probe, first_seq_nr: int, last_seq_nr: int) -> SequencedRun:
    messages = [f"m{n}" for n in range(first_seq_nr, last_seq_nr + 1)]
    return SequencedRun(PID, first_seq_nr, messages, pc)


def polled(session: ConsumerSession) -> Delivery:
    delivery = session.poll()
    assert delivery is not None
    return delivery


def open_stream(session: ConsumerSession, pc: Probe) -> None:
    """Message 1 delivered and confirmed, what the session sent taken."""
    session.accept(seq(pc, 1, first=True))
    session.confirm(polled(session).confirm_to)
    session.take_outbox()


@pytest.fixture
def timers() -> ManualTimerService:
    return ManualTimerService()


@pytest.fixture
def pc() -> Probe:
    return Probe("pc")


# --- poll ----------------------------------------------------------------------------


def test_poll_delivers_the_first_message_and_leaves_its_request_in_the_outbox(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers)
    session.accept(seq(pc, 1, first=True))

    delivery = polled(session)

    assert (delivery.message, delivery.producer_id, delivery.seq_nr) == ("m1", PID, 1)
    assert session.take_outbox() == [(pc, Request(0, 20))]
    assert session.take_outbox() == []


def test_poll_returns_none_when_nothing_arrived(timers: ManualTimerService) -> None:
    session = session_of(timers)

    assert session.poll() is None

    assert session.outbox == []


def test_poll_takes_the_steady_state_from_a_run_and_keeps_the_run_until_its_last(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers)
    open_stream(session, pc)
    whole = run(pc, 2, 3)
    session.accept(whole)

    second = polled(session)
    still_there = list(session.inbox)
    session.confirm(second.confirm_to)
    third = polled(session)

    assert (second.seq_nr, third.seq_nr) == (2, 3)
    assert still_there == [whole]
    assert not session.inbox
    assert session.outbox == []  # nothing to tell in the steady state


def test_poll_feeds_a_run_it_cannot_take_whole_one_message_at_a_time(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers)
    open_stream(session, pc)
    session.accept(run(pc, 3, 4))  # 2 is missing: a gap

    assert session.poll() is None

    assert session.take_outbox() == [(pc, Resend(2))]
    assert not session.inbox


def test_poll_refuses_while_a_delivery_is_outstanding(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers)
    session.accept(seq(pc, 1, first=True))
    polled(session)
    session.accept(seq(pc, 2))

    with pytest.raises(LocalProtocolError, match="seq_nr 1 is not confirmed yet"):
        session.poll()

    assert len(session.inbox) == 1  # not fed to the core


# --- confirm and reject --------------------------------------------------------------


def test_confirm_of_the_outstanding_delivery_lets_the_next_one_through(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers)
    session.accept(seq(pc, 1, first=True))
    session.accept(seq(pc, 2))
    first = polled(session)
    session.take_outbox()

    sends = session.confirm(first.confirm_to)

    assert list(sends) == [(pc, Request(1, 20))]
    assert polled(session).seq_nr == 2


def test_a_second_confirm_of_a_delivery_does_not_confirm_the_next_one(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers)
    open_stream(session, pc)
    session.accept(run(pc, 2, 3))
    second = polled(session)
    session.confirm(second.confirm_to)
    third = polled(session)

    with pytest.raises(LocalProtocolError, match="confirm each delivery once"):
        session.confirm(second.confirm_to)

    assert session.expects(third.confirm_to)
    assert session.statistics().confirmed == 2


def test_reject_without_dead_letters_is_refused_naming_the_shell_and_changes_nothing(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers)
    session.accept(seq(pc, 1, first=True))
    delivery = polled(session)

    with pytest.raises(LocalProtocolError, match=r"pass Consumer\(dead_letters="):
        session.reject(delivery.confirm_to, "no")

    assert session.expects(delivery.confirm_to)
    assert session.statistics().rejected == 0


def test_a_rejected_delivery_comes_again_when_its_timer_fires(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers, dead_letters=MemoryDeadLetters())
    session.accept(seq(pc, 1, first=True))
    delivery = polled(session)
    session.take_outbox()

    assert session.reject(delivery.confirm_to, "flaky") == []
    assert session.poll() is None
    timers.fire_all()
    again = polled(session)

    assert (again.message, again.seq_nr, again.attempt) == ("m1", 1, 2)
    assert session.core.snapshot().confirmed_seq_nr == 0


def test_an_answer_of_another_delivery_is_refused_and_changes_nothing(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers, dead_letters=MemoryDeadLetters())
    session.accept(seq(pc, 1, first=True))
    delivery = polled(session)

    with pytest.raises(LocalProtocolError, match="answer each delivery once"):
        session.reject(Probe("another"), "no")

    assert session.expects(delivery.confirm_to)


# --- the deduplication store ---------------------------------------------------------


def test_the_dedup_store_is_flushed_before_the_request_that_confirms_leaves(
    timers: ManualTimerService, pc: Probe
) -> None:
    calls: list[tuple[str, object, int]] = []
    made: list[ConsumerSession] = []

    def record(op: str, arg: object) -> bool:
        # What the store is asked, and how much waits in the outbox at that moment.
        calls.append((op, dict(arg) if isinstance(arg, dict) else arg, len(made[0].outbox)))
        return False

    store = MemoryDedupStore(fail_when=lambda op, arg: bool(made) and record(op, arg))
    session = session_of(timers, dedup_store=store)
    made.append(session)
    session.accept(seq(pc, 1, first=True))
    delivery = polled(session)
    session.take_outbox()
    calls.clear()

    sends = session.confirm(delivery.confirm_to)

    # Recorded, then flushed while nothing is in the outbox yet, then the Request.
    assert calls == [("record", (PID, 1), 0), ("flush", {PID: 1}, 0)]
    assert list(sends) == [(pc, Request(1, 20))]


def test_a_failing_dedup_store_closes_the_session_and_drops_the_outbox(
    timers: ManualTimerService, pc: Probe
) -> None:
    ends = Ends()
    store = MemoryDedupStore(fail_when=lambda op, _: op == "flush")
    session = session_of(timers, dedup_store=store, on_end=ends)
    session.accept(seq(pc, 1, first=True))
    delivery = polled(session)
    session.take_outbox()

    with pytest.raises(DedupStoreError, match="flush failed"):
        session.confirm(delivery.confirm_to)

    assert session.closed
    assert session.outbox == []  # the Request confirming 1 never leaves
    assert ends.count == 1
    assert timers.running() == 0
    with pytest.raises(ClosedError, match="deduplication store failed"):
        session.poll()


def test_a_failing_dead_letter_destination_closes_the_session_and_drops_the_outbox(
    timers: ManualTimerService, pc: Probe
) -> None:
    ends = Ends()
    letters = MemoryDeadLetters(fail_when=lambda _: True)
    session = session_of(timers, dead_letters=letters, on_end=ends)
    session.accept(seq(pc, 1, first=True))
    delivery = polled(session)
    session.take_outbox()
    session.reject(delivery.confirm_to, "bad")
    timers.fire_all()
    again = polled(session)

    with pytest.raises(DeadLetterError, match="injected failure"):
        session.reject(again.confirm_to, "still bad")

    assert session.outbox == []  # the Request confirming 1 never leaves
    assert ends.count == 1
    with pytest.raises(ClosedError, match="dead letter could not be written"):
        session.check_open()


def test_after_a_failure_run_carries_out_nothing(timers: ManualTimerService, pc: Probe) -> None:
    store = MemoryDedupStore(fail_when=lambda op, _: op == "flush")
    session = session_of(timers, dedup_store=store)
    session.accept(seq(pc, 1, first=True))
    with pytest.raises(DedupStoreError):
        session.confirm(polled(session).confirm_to)

    session.run(session.core.on_stopped())

    assert session.outbox == []


# --- the lifecycle -------------------------------------------------------------------


def test_close_leaves_the_ack_of_what_is_confirmed_in_the_outbox_and_stops_the_timers(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = session_of(timers)
    open_stream(session, pc)

    session.close()

    assert session.take_outbox() == [(pc, Ack(1))]
    assert timers.running() == 0
    with pytest.raises(ClosedError, match="Consumer is closed"):
        session.poll()


def test_close_a_second_time_does_nothing(timers: ManualTimerService, pc: Probe) -> None:
    session = session_of(timers)
    open_stream(session, pc)
    session.close()
    session.take_outbox()

    session.close()

    assert session.outbox == []


def test_deliver_then_stop_takes_what_arrived_delivers_it_then_stops(
    timers: ManualTimerService, pc: Probe
) -> None:
    ends = Ends()
    session = session_of(timers, on_end=ends)
    open_stream(session, pc)
    session.accept(seq(pc, 2))

    session.deliver_then_stop()
    last = polled(session)
    session.confirm(last.confirm_to)

    assert last.seq_nr == 2
    assert session.is_stopped
    assert ends.count == 1
    with pytest.raises(ClosedError, match="deliver_then_stop"):
        session.check_not_stopped()


def test_a_session_that_does_not_hand_out_sends_its_deliveries_to_the_consumer(
    timers: ManualTimerService, pc: Probe
) -> None:
    consumer = Probe("consumer")
    session = session_of(timers, hand_out=False, confirm_to=Probe("cc"))
    session.run(session.core.on_start(consumer))

    session.run(session.core.on_sequenced(seq(pc, 1, first=True)))

    sent = session.take_outbox()
    assert [(to, type(message).__name__) for to, message in sent] == [
        (pc, "Request"),
        (consumer, "Delivery"),
    ]


def test_a_message_the_session_cannot_handle_is_logged_and_dropped(
    timers: ManualTimerService, pc: Probe, caplog: pytest.LogCaptureFixture
) -> None:
    session = session_of(timers)
    session.accept("not a delivery message")
    session.accept(seq(pc, 1, first=True))

    with caplog.at_level(logging.ERROR, "pykka_delivery.consumer"):
        delivery = polled(session)

    assert "Consumer cannot handle str: dropped" in caplog.text
    assert delivery.seq_nr == 1


def test_a_stale_timer_firing_is_dropped(timers: ManualTimerService, pc: Probe) -> None:
    session = session_of(timers)
    stale = timers.entries[0]  # the retry timer of start(), restarted since
    open_stream(session, pc)
    assert stale.cancelled

    stale.callback()  # two firings that were on their way when it was restarted
    stale.callback()

    assert session.poll() is None
    assert session.outbox == []


# --- poll against the general path --------------------------------------------------

PCS = (Probe("pc-a"), Probe("pc-b"))
SELF = Probe("self")  # shared: RegisterConsumer names it
CONSUMER = Probe("consumer")
HYPOTHESIS = ConsumerControllerSettings(
    flow_control_window=6,
    resend_interval_min=60.0,
    resend_interval_max=90.0,
    max_attempts=2,
    redelivery_backoff=0.5,
    redelivery_backoff_max=0.5,
)


def plain(pc: int, seq_nr: int, first: bool = False, ack: bool = False) -> SequencedMessage:
    """What a run holds for ``seq_nr``, built here rather than by `SequencedRun.expand`."""
    return SequencedMessage(f"p{pc}", seq_nr, f"m{seq_nr}", first, ack, PCS[pc])


class General:
    """The general path, as a session would run it with no steady state: every message
    through `on_sequenced` (runs as their messages), confirmations without the core's
    shortcut; deliveries queued, what else is sent kept in an outbox."""

    def __init__(self, positions: dict[str, int] | None) -> None:
        self.core = ConsumerCore(SELF, HYPOTHESIS, dedup_positions=positions)
        self.core.on_spawned()
        self.core.on_start(CONSUMER)
        self.inbox: deque[SequencedMessage] = deque()
        self.ready: deque[Delivery] = deque()
        self.outbox: list[tuple[Any, Any]] = []

    def carry(self, effects: list[Effect]) -> None:
        for effect in effects:
            if type(effect) is Send and effect.to is CONSUMER:
                self.ready.append(effect.message)
            elif type(effect) is Send:
                self.outbox.append((effect.to, effect.message))

    def feed(self, until_ready: bool) -> None:
        while self.inbox and not (until_ready and self.ready):
            self.carry(self.core.on_sequenced(self.inbox.popleft()))

    def poll(self) -> Delivery | None:
        self.feed(until_ready=True)
        return self.ready.popleft() if self.ready else None

    def confirm(self) -> None:
        effects: list[Effect] = []
        self.core._complete(self.core._awaited("Confirmed"), effects)
        self.carry(effects)

    def take(self) -> list[tuple[Any, Any]]:
        sent, self.outbox = self.outbox, []
        return sent


class Both:
    """A `ConsumerSession` and the general path, given the same events."""

    def __init__(self, positions: dict[str, int] | None) -> None:
        self.general = General(positions)
        self.fast = ConsumerSession(
            SELF,
            HYPOTHESIS,
            name="Consumer",
            timers=Timers(lambda _: None, ManualTimerService()),  # the test fires the core's timers
            new_confirm_to=lambda: Probe("confirm_to"),
            dedup_store=None if positions is None else MemoryDedupStore(positions),
            dead_letters=MemoryDeadLetters(),
        )
        self.fast.start()
        self.told = [0, 0]  # per producer controller: the highest seq_nr told so far
        self.answered: list[tuple[Any, Any]] = []  # what confirm or reject returned
        self.outstanding: Delivery | None = None
        self.arrive(0, 1, 1, first=True)

    def arrive(self, pc: int, start: int, length: int, first: bool = False) -> None:
        """Messages start.. of producer controller ``pc``: alone, or as a run."""
        if length == 1:
            message = plain(pc, start, first)
            self.general.inbox.append(message)
            self.fast.accept(message)
        else:
            self.general.inbox.extend(plain(pc, n) for n in range(start, start + length))
            messages = [f"m{n}" for n in range(start, start + length)]
            self.fast.accept(SequencedRun(f"p{pc}", start, messages, PCS[pc]))
        self.told[pc] = max(self.told[pc], start + length - 1)

    def sent(self) -> tuple[list[tuple[Any, Any]], list[tuple[Any, Any]]]:
        """What each sent to the producer side since the last call."""
        answered, self.answered = self.answered, []
        return self.general.take(), answered + self.fast.take_outbox()

    def step(self, event: tuple[Any, ...]) -> tuple[Any, Any]:
        """Carry out ``event`` on both; what each returned, if anything."""
        kind = event[0]
        general, fast = self.general, self.fast
        if kind in ("run", "seq"):
            pc, shift, size = event[1:]
            start = max(1, self.told[pc] + 1 + shift)
            self.arrive(pc, start, size if kind == "run" else 1, first=kind == "seq" and size)
        elif kind == "poll" and self.outstanding is None:
            self.outstanding = fast.poll()
            return view(general.poll()), view(self.outstanding)
        elif kind in ("confirm", "reject") and self.outstanding is not None:
            confirm_to, self.outstanding = self.outstanding.confirm_to, None
            if kind == "confirm":
                self.answered = list(fast.confirm(confirm_to))
                general.confirm()
            else:
                self.answered = list(fast.reject(confirm_to, "bad"))
                general.carry(general.core.on_rejected("bad"))
        elif kind in ("redeliver", "tick"):
            key = REDELIVER if kind == "redeliver" else RETRY
            fast.run(fast.core.on_timer(key))
            general.carry(general.core.on_timer(key))
        elif kind == "register":
            fast.register_to(PCS[event[1]])
            general.carry(general.core.on_register_to(PCS[event[1]]))
        elif kind == "stop":
            fast.deliver_then_stop()
            general.feed(until_ready=False)
            general.carry(general.core.on_deliver_then_stop())
        return None, None


def view(delivery: Delivery | None) -> tuple[Any, ...] | None:
    if delivery is None:
        return None
    return (delivery.message, delivery.producer_id, delivery.seq_nr, delivery.attempt)


def pending(inbox: deque[Any]) -> list[tuple[str, int]]:
    """The messages waiting in an inbox, a run's one by one."""
    out = []
    for item in inbox:
        if type(item) is SequencedRun:
            out += [(item.producer_id, n) for n in range(item.seq_nr + 1, item.last_seq_nr + 1)]
        else:
            out.append((item.producer_id, item.seq_nr))
    return out


session_events = st.lists(
    st.one_of(
        # Arrivals: ("run" | "seq", producer controller, shift from the next seq_nr, size
        # of the run | first).
        st.tuples(st.just("run"), st.integers(0, 1), st.integers(-2, 2), st.integers(1, 5)),
        st.tuples(st.just("run"), st.just(0), st.just(0), st.integers(2, 5)),
        st.tuples(st.just("seq"), st.integers(0, 1), st.integers(-2, 2), st.booleans()),
        st.sampled_from([("poll",), ("poll",), ("confirm",), ("confirm",)]),
        st.sampled_from([("reject",), ("redeliver",), ("tick",), ("tick",), ("stop",)]),
        st.just(("tick",)),
        st.tuples(st.just("register"), st.integers(0, 1)),
    ),
    max_size=50,
)


@settings(max_examples=300, deadline=None)
@example(  # a message arriving while the retry timer backs off resets it
    events=[("poll",), ("confirm",), ("tick",), ("tick",), ("seq", 0, 0, False), ("poll",)],
    positions=None,
)
@given(
    events=session_events,
    positions=st.one_of(st.none(), st.fixed_dictionaries({"p0": st.integers(0, 6)})),
)
def test_poll_delivers_and_sends_as_the_general_path_does(
    events: list[tuple[Any, ...]], positions: dict[str, int] | None
) -> None:
    """`ConsumerSession.poll` (the steady state first, runs kept whole) against the
    general path, fed the same messages, runs as their messages: after every event the
    same deliveries, the same sends to the producer side, snapshots, statistics,
    deduplication positions and messages waiting. Each stream opens with seq_nr 1."""
    both = Both(positions)
    general, fast = both.general, both.fast
    for event in events:
        got_general, got_fast = both.step(event)

        assert got_general == got_fast, event
        sent_general, sent_fast = both.sent()
        assert sent_general == sent_fast, event
        assert general.core.snapshot() == fast.snapshot(), event
        assert general.core.statistics() == fast.statistics(), event
        assert general.core.dedup_positions() == fast.core.dedup_positions(), event
        assert [(m.producer_id, m.seq_nr) for m in general.inbox] == pending(fast.inbox), event


# --- the default window --------------------------------------------------------------


def default_window_session(timers: ManualTimerService, *, hand_out: bool) -> ConsumerSession:
    inbox: deque[Any] = deque()
    session = ConsumerSession(
        Probe("self"),
        ConsumerControllerSettings(resend_interval_min=60.0, resend_interval_max=60.0),
        name="Consumer",
        timers=Timers(inbox.append, timers),
        inbox=inbox,
        hand_out=hand_out,
        confirm_to=Probe("cc"),
    )
    session.start()
    return session


def test_a_handles_session_without_a_window_setting_grants_the_handles_default_of_500(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = default_window_session(timers, hand_out=True)
    session.accept(seq(pc, 1, first=True))

    polled(session)

    assert session.take_outbox() == [(pc, Request(0, HANDLE_FLOW_CONTROL_WINDOW))]
    assert HANDLE_FLOW_CONTROL_WINDOW == 500


def test_an_actors_session_without_a_window_setting_grants_akkas_default_of_50(
    timers: ManualTimerService, pc: Probe
) -> None:
    session = default_window_session(timers, hand_out=False)
    session.run(session.core.on_start(Probe("consumer")))

    session.run(session.core.on_sequenced(seq(pc, 1, first=True)))

    assert session.take_outbox()[0] == (pc, Request(0, ACTOR_FLOW_CONTROL_WINDOW))
    assert ACTOR_FLOW_CONTROL_WINDOW == 50


def test_a_window_setting_wins_over_either_default(timers: ManualTimerService, pc: Probe) -> None:
    for hand_out in (True, False):
        session = session_of(timers, hand_out=hand_out, confirm_to=Probe("cc"))
        if not hand_out:
            session.run(session.core.on_start(Probe("consumer")))
        session.accept(seq(pc, 1, first=True))
        session.run(session.core.on_sequenced(session.inbox.popleft()))

        assert session.take_outbox()[0] == (pc, Request(0, SETTINGS.flow_control_window))
