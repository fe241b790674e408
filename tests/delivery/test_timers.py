"""`TimerService` (one thread, a heap of deadlines) and keyed `Timers` on top of it.

Each test gets its own `TimerService`, shut down afterwards. No test asserts how long
anything took: ordering is checked through the service's single thread (a callback due
later cannot run before one due earlier), and "did not happen" is checked by a sentinel
callback scheduled after the thing that must not happen.

`Timers` are exercised the way an owner uses them: firings are told into a queue (the
owner's inbox), and the test, playing the owner, takes them out and calls `accept`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Iterator

import pytest

from pykka_delivery.delivery.timers import TimerFired, Timers, TimerService

WAIT = 5.0  # bound on every wait; nothing here should take more than a fraction of it


@pytest.fixture
def service() -> Iterator[TimerService]:
    svc = TimerService(name="test-timers")
    yield svc
    svc.shutdown()


def run_after(service: TimerService, delay: float) -> threading.Event:
    """An Event set by a callback due after ``delay``: once it is set, every callback due
    earlier on the same service has run (or was skipped)."""
    done = threading.Event()
    service.call_later(delay, done.set)
    return done


# --- TimerService ------------------------------------------------------------------


def test_callbacks_run_in_the_order_they_are_due_not_the_order_they_were_scheduled(
    service: TimerService,
) -> None:
    ran: list[str] = []
    last = threading.Event()

    def record(label: str) -> None:
        ran.append(label)
        if label == "late":
            last.set()

    service.call_later(0.15, lambda: record("late"))
    service.call_later(0.05, lambda: record("early"))
    service.call_later(0.10, lambda: record("middle"))

    assert last.wait(WAIT)
    assert ran == ["early", "middle", "late"]


def test_a_cancelled_entry_does_not_run(service: TimerService) -> None:
    ran: list[str] = []
    entry = service.call_later(0.02, lambda: ran.append("cancelled"))
    TimerService.cancel(entry)
    later = run_after(service, 0.1)

    assert later.wait(WAIT)
    assert ran == []


def test_cancelling_one_entry_leaves_the_others_due_at_the_same_time_running(
    service: TimerService,
) -> None:
    ran: list[str] = []
    keep_1 = service.call_later(0.05, lambda: ran.append("keep 1"))
    drop = service.call_later(0.05, lambda: ran.append("drop"))
    service.call_later(0.05, lambda: ran.append("keep 2"))
    TimerService.cancel(drop)
    later = run_after(service, 0.1)

    assert later.wait(WAIT)
    assert sorted(ran) == ["keep 1", "keep 2"]
    assert not keep_1.cancelled


def test_an_exception_in_a_callback_is_logged_and_later_callbacks_still_run(
    service: TimerService, caplog: pytest.LogCaptureFixture
) -> None:
    def boom() -> None:
        raise RuntimeError("boom in a timer callback")

    caplog.set_level(logging.ERROR, logger="pykka_delivery.timers")
    service.call_later(0.02, boom)
    later = run_after(service, 0.1)

    assert later.wait(WAIT)
    failures = [r for r in caplog.records if r.name == "pykka_delivery.timers"]
    assert len(failures) == 1
    assert failures[0].levelno == logging.ERROR
    assert failures[0].exc_info is not None
    assert isinstance(failures[0].exc_info[1], RuntimeError)
    assert "boom in a timer callback" in str(failures[0].exc_info[1])


def test_a_callback_scheduled_sooner_than_the_one_being_waited_for_is_not_held_up(
    service: TimerService,
) -> None:
    # The thread sleeps until the head of the heap is due; a new, earlier head must wake
    # it. If it did not, "soon" would run after "far" (or not within the wait at all).
    ran: list[str] = []
    soon_ran = threading.Event()
    service.call_later(30.0, lambda: ran.append("far"))
    service.call_later(0.02, lambda: (ran.append("soon"), soon_ran.set()))

    assert soon_ran.wait(WAIT)
    assert ran == ["soon"]


def test_shutdown_drops_pending_callbacks(service: TimerService) -> None:
    ran: list[str] = []
    service.call_later(0.2, lambda: ran.append("pending"))
    service.shutdown()
    # A second service proves time went by past the pending entry's deadline.
    other = TimerService(name="test-timers-other")
    try:
        assert run_after(other, 0.4).wait(WAIT)
    finally:
        other.shutdown()
    assert ran == []


# --- Timers ------------------------------------------------------------------------


class Owner:
    """Plays the owner of `Timers`: firings land in an inbox queue, read by the test."""

    def __init__(self, service: TimerService) -> None:
        self.inbox: queue.Queue[TimerFired] = queue.Queue()
        self.timers = Timers(self.inbox.put, service)

    def next_firing(self) -> TimerFired:
        return self.inbox.get(timeout=WAIT)

    def assert_no_firing_before(self, service: TimerService, delay: float) -> None:
        """Nothing arrives from timers due before a sentinel ``delay`` from now."""
        assert run_after(service, delay).wait(WAIT)
        assert self.inbox.empty(), f"unexpected firing {self.inbox.queue[0]!r}"


def test_a_started_timer_fires_repeatedly_while_its_owner_accepts_each_firing(
    service: TimerService,
) -> None:
    owner = Owner(service)
    owner.timers.start("tick", 0.01)

    firings = []
    for _ in range(3):
        fired = owner.next_firing()
        assert fired.key == "tick"
        assert owner.timers.accept(fired)  # re-arms: the next firing follows
        firings.append(fired)
    # Same generation throughout: re-arming is not restarting.
    assert len({fired.generation for fired in firings}) == 1
    assert owner.timers.is_running("tick")


def test_a_firing_that_is_not_accepted_does_not_rearm_the_timer(service: TimerService) -> None:
    # Fixed delay: the next firing is counted from the accepted one, so an owner that is
    # busy (has not handled the firing yet) is not flooded with firings.
    owner = Owner(service)
    owner.timers.start("tick", 0.01)
    owner.next_firing()

    owner.assert_no_firing_before(service, 0.1)


def test_cancel_makes_a_firing_already_in_the_inbox_stale(service: TimerService) -> None:
    owner = Owner(service)
    owner.timers.start("tick", 0.01)
    fired = owner.next_firing()  # queued, not handled yet

    owner.timers.cancel("tick")

    assert not owner.timers.is_running("tick")
    assert not owner.timers.accept(fired)
    owner.assert_no_firing_before(service, 0.1)  # and it was not re-armed


def test_cancel_before_the_timer_is_due_stops_it_from_firing(service: TimerService) -> None:
    owner = Owner(service)
    owner.timers.start("tick", 0.02)
    owner.timers.cancel("tick")

    owner.assert_no_firing_before(service, 0.1)


def test_restarting_a_key_makes_the_old_generations_firing_stale(service: TimerService) -> None:
    owner = Owner(service)
    owner.timers.start("tick", 0.01)
    old = owner.next_firing()

    owner.timers.start("tick", 0.01)
    new = owner.next_firing()

    assert new.key == "tick"
    assert new.generation != old.generation
    assert not owner.timers.accept(old)
    assert owner.timers.accept(new)


def test_restarting_a_key_replaces_its_interval(service: TimerService) -> None:
    # Restarted from 30 s to 10 ms: the firing comes from the new interval (a stale
    # 30 s entry could not fire within the wait anyway, so only one firing can arrive).
    owner = Owner(service)
    owner.timers.start("tick", 30.0)
    owner.timers.start("tick", 0.01)

    fired = owner.next_firing()

    assert owner.timers.accept(fired)


def test_cancel_all_stops_every_key_and_makes_their_queued_firings_stale(
    service: TimerService,
) -> None:
    owner = Owner(service)
    owner.timers.start("queued", 0.01)
    queued = owner.next_firing()  # in the inbox, not handled yet
    owner.timers.start("not due", 0.05)

    owner.timers.cancel_all()

    assert not owner.timers.is_running("queued")
    assert not owner.timers.is_running("not due")
    assert not owner.timers.accept(queued)
    owner.assert_no_firing_before(service, 0.15)  # "not due" never fires


def test_accept_refuses_a_firing_for_a_key_never_started(service: TimerService) -> None:
    owner = Owner(service)

    assert not owner.timers.accept(TimerFired("never", 1))


def test_timers_of_two_owners_with_the_same_key_do_not_interfere(service: TimerService) -> None:
    first, second = Owner(service), Owner(service)
    first.timers.start("tick", 0.01)
    second.timers.start("tick", 0.01)
    first_fired, second_fired = first.next_firing(), second.next_firing()

    first.timers.cancel("tick")

    assert not first.timers.accept(first_fired)
    assert second.timers.accept(second_fired)
    assert second.next_firing().key == "tick"
