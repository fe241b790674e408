"""What only the blocking handles, `Producer` and `Consumer`, have: their lock races.

Every scenario that holds for both flavours is in test_handle_scenarios.py or
test_handle_streams.py. Here are the races of a handle whose core runs inline in whichever
thread calls it, under the handle's lock: a reply that arrives just before the sender
waits, a reply told back on the thread that holds the lock, a registration while another
thread waits in ``receive``, and the thread on which an idle producer answers a retry.
Threads are daemons, synchronised with Events and joins, every wait bounded by `WAIT`. No
test asserts how long anything took.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from pykka_delivery import Consumer, Producer
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import Request, Resend, SequencedMessage
from tests.delivery.handles.flavours import (
    FAST_RETRY,
    LONG,
    NO_RETRY,
    WAIT,
    Blocking,
    DropOnce,
    Reader,
    connected,
    in_thread,
    receive_and_confirm,
)


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-blocking-handles-timers")
    yield service
    service.shutdown()


# --- Producer: the lock and the sender's wait ----------------------------------------


def test_a_reply_arriving_just_before_the_sender_waits_still_wakes_it(
    timers: TimerService,
) -> None:
    # Regression (handles/producer.py, Producer._wait_for): a message from the consumer side that
    # arrives while the sending thread holds the lock after its last _drain() but before
    # _changed.wait() finds the lock taken, is queued, and nobody processes it: the sender
    # sleeps until its timeout (timeout=None: until some other message or timer firing).
    # With a real Consumer the rescue is its retry timer, so a send stalls for
    # resend_interval_min (2 s by default). The race is forced here by an internal hook:
    # the first demand check inside _wait_for lets the consumer's Request arrive from
    # another thread.
    p, c = connected(Blocking(timers))
    p.send(0, timeout=WAIT)
    receive_and_confirm(c, 1)  # the window is open up to 50; demand is the consumer's
    for i in range(1, 50):
        p.send(i, timeout=WAIT)
    assert not p._core.has_demand

    forced = threading.Event()
    has_demand = p._has_demand

    def demand_check() -> bool:
        if not forced.is_set():
            forced.set()
            # 25 confirmed: the consumer sends Request(25, 75) from its own thread.
            replier, _ = in_thread(lambda: receive_and_confirm(c, 25), "consumer")
            replier.join(WAIT)
        return has_demand()

    p._has_demand = demand_check  # type: ignore[method-assign]
    sender, outcome = in_thread(lambda: p.send(50, timeout=LONG), "sender")
    sender.join(2.0)  # far longer than the send needs once the Request is processed

    assert forced.is_set()
    assert not sender.is_alive(), "send slept with the consumer's Request(25, 75) queued"
    assert outcome == {"result": 51}


class AnswersAtOnce:
    """A consumer side that answers a SequencedMessage (the first, and every one once
    ``answering``) with a Request on the telling thread, before its tell returns (as an
    in-process ref may)."""

    def __init__(self) -> None:
        self.producer: Producer | None = None
        self.seq_nrs: list[int] = []
        self.answering = False

    def tell(self, message: Any) -> None:
        if isinstance(message, SequencedMessage):
            self.seq_nrs.append(message.seq_nr)
            if message.seq_nr == 1 or self.answering:
                assert self.producer is not None
                request = Request(message.seq_nr, message.seq_nr + 1, True, False)
                self.producer.ref.tell(request)


def test_an_answer_told_back_on_the_draining_thread_while_the_sender_waits_does_not_deadlock(
    timers: TimerService,
) -> None:
    """Thread B processes a Resend while the sender waits for demand; the resent message's
    answer comes back on B, under the lock B holds: it must be left to B's own drain, not
    wait for the lock (which B would wait for for ever)."""
    p = Producer("p-1", timer_service=timers)
    consumer = AnswersAtOnce()
    consumer.producer = p
    p.register_consumer(consumer)
    p.send("a", timeout=WAIT)  # the first message: answered with Request(1, 2)
    p.send("b", timeout=WAIT)  # not answered: no demand left
    sender, outcome = in_thread(lambda: p.send("c", timeout=WAIT), "sender")  # no demand yet
    deadline = time.monotonic() + WAIT
    while not p._sleeping:  # the sender announced its wait
        assert time.monotonic() < deadline
        time.sleep(0.001)

    consumer.answering = True
    p.ref.tell(Resend(2))  # on this thread: resends 2, whose answer opens the window

    sender.join(WAIT)
    assert not sender.is_alive(), "deadlock"
    assert outcome.get("error") is None
    assert consumer.seq_nrs[:4] == [1, 2, 2, 3]
    p.close()


# --- Consumer: register_to under the lock ------------------------------------------


def test_register_to_while_another_thread_waits_in_receive_does_not_deadlock(
    timers: TimerService,
) -> None:
    # Regression (handles/consumer.py): register_to holds the consumer's lock while it tells the
    # producer; a Producer with unconfirmed messages answers at once, inline, with a
    # SequencedMessage to the consumer's endpoint, which takes the same (non-reentrant)
    # lock to wake the waiting reader: the registering thread deadlocks with itself.
    p, c1 = connected(Blocking(timers))
    p.send("unconfirmed", timeout=WAIT)
    c1.receive(timeout=WAIT)  # never confirmed

    c2 = Consumer(NO_RETRY, timer_service=timers)  # no timer firing into a deadlocked c2
    reader = Reader(c2, 1)
    # Let the reader block in receive(); the internal flag, if there is one, says when.
    pause = threading.Event()
    for _ in range(100):
        if getattr(c2, "_waiting", True):
            break
        pause.wait(0.01)
    registrar, outcome = in_thread(lambda: c2.register_to(p.ref), "registrar")
    registrar.join(3.0)

    assert not registrar.is_alive(), "register_to deadlocked"
    assert "error" not in outcome, outcome
    assert reader.wait() == ["unconfirmed"]


# --- where an idle producer runs ---------------------------------------------------


def test_an_idle_producer_resends_the_lost_last_message_on_the_thread_of_the_consumers_retry(
    timers: TimerService,
) -> None:
    p = Producer("p-1", timer_service=timers)
    c = Consumer(FAST_RETRY, timer_service=timers)
    link = DropOnce(c.ref, seq_nr=10)
    p.register_consumer(link)
    got: list[Any] = []
    sending_done, all_arrived = threading.Event(), threading.Event()

    def consume() -> None:
        delivery = c.receive(timeout=WAIT)
        got.append(delivery.message)
        delivery.confirm()
        # Hold back until the producer's thread is idle, so that nothing the consumer
        # sends can be processed by a producer call still in progress.
        sending_done.wait(WAIT)
        while len(got) < 10:
            delivery = c.receive(timeout=WAIT)
            got.append(delivery.message)
            delivery.confirm()
        all_arrived.set()

    in_thread(consume, "consumer")
    p.send(0, timeout=WAIT)
    p.wait_confirmed(timeout=WAIT)  # first confirmed: no later resend of everything
    for i in range(1, 10):
        p.send(i, timeout=WAIT)
    sending_done.set()  # from here the test's thread makes no call on the producer

    assert all_arrived.wait(WAIT), f"got only {got}"
    assert got == list(range(10))
    assert link.dropped
    assert link.resent_on, "the last message arrived without being resent"
    # Resent by the producer's core run on the consumer's thread (its retry Request).
    assert {t.name for t in link.resent_on} == {"consumer"}
    assert c.statistics().retries >= 1
