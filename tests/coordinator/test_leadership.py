"""The election core (coordinator/leadership.py) driven with a fake clock: each test feeds
events at chosen monotonic times and checks the whole state and the exact effects."""

from __future__ import annotations

import math

import pytest

from pykka_delivery.coordinator.leadership import (
    Acquired,
    ActorStopped,
    Close,
    Fenced,
    Follow,
    Lead,
    LeaderSeen,
    LeadershipState,
    LeaseLost,
    LeaseUnreachable,
    Release,
    Renew,
    Renewed,
    Role,
    Tick,
    TryAcquire,
    initial,
    step,
)

ACQUIRE = 0.5
RENEW = 1.0
TTL = 3.0


def follower(now: float = 0.0) -> LeadershipState:
    """A follower whose first attempt was answered: the lease is held elsewhere."""
    state, _ = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=now)
    state, _ = step(state, LeaderSeen("b:2", seconds_left=10.0), now)
    return state


def leader(now: float = 0.0, epoch: int = 7) -> LeadershipState:
    state, _ = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=now)
    state, _ = step(state, Acquired(epoch, valid_until=now + TTL), now)
    return state


def test_a_new_replica_tries_to_take_the_lease_at_once() -> None:
    state, effects = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=100.0)

    assert effects == [TryAcquire()]
    assert state == LeadershipState(Role.FOLLOWER, ACQUIRE, RENEW, pending=True, next_request=100.0)


def test_taking_the_lease_makes_the_replica_lead_under_its_epoch() -> None:
    state, _ = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=0.0)

    state, effects = step(state, Acquired(7, valid_until=3.0), 0.1)

    assert effects == [Lead(7)]
    assert state == LeadershipState(
        Role.LEADER, ACQUIRE, RENEW, pending=False, next_request=1.1, epoch=7, valid_until=3.0
    )


def test_a_grant_answered_after_its_lease_ran_out_is_not_used() -> None:
    state, _ = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=0.0)

    state, effects = step(state, Acquired(7, valid_until=3.0), 3.5)

    assert effects == [Follow("the lease expired before its grant was answered"), TryAcquire()]
    assert state.role is Role.FOLLOWER
    assert state.pending


def test_a_follower_learns_the_leader_and_tries_again_after_the_acquire_interval() -> None:
    state, _ = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=0.0)

    state, effects = step(state, LeaderSeen("b:2", seconds_left=10.0), 0.1)

    assert effects == []
    assert state == LeadershipState(
        Role.FOLLOWER, ACQUIRE, RENEW, pending=False, next_request=0.6, leader="b:2"
    )
    assert state.wake_at() == 0.6


def test_a_follower_tries_again_as_soon_as_the_known_lease_runs_out() -> None:
    state, _ = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=0.0)

    state, _ = step(state, LeaderSeen("b:2", seconds_left=0.2), 1.0)

    assert state.next_request == pytest.approx(1.2)


def test_a_follower_forgets_a_leader_whose_lease_ran_out() -> None:
    state, _ = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=0.0)

    state, _ = step(state, LeaderSeen("b:2", seconds_left=-0.5), 1.0)

    assert state.leader is None
    assert state.next_request == 1.0


def test_a_follower_asks_nothing_before_its_attempt_is_due() -> None:
    state = follower(now=0.0)

    after, effects = step(state, Tick(), 0.4)

    assert effects == []
    assert after == state


def test_a_follower_asks_for_the_lease_when_its_attempt_is_due() -> None:
    state = follower(now=0.0)

    state, effects = step(state, Tick(), 0.5)

    assert effects == [TryAcquire()]
    assert state.pending


def test_a_follower_sends_one_request_at_a_time() -> None:
    state, _ = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=0.0)

    after, effects = step(state, Tick(), 5.0)

    assert effects == []
    assert after == state
    assert state.wake_at() == math.inf


def test_a_follower_retries_after_the_acquire_interval_when_the_database_fails() -> None:
    state, _ = initial(acquire_interval=ACQUIRE, renew_interval=RENEW, now=0.0)

    state, effects = step(state, LeaseUnreachable("connection refused"), 2.0)

    assert effects == []
    assert state.role is Role.FOLLOWER
    assert not state.pending
    assert state.next_request == 2.5


def test_a_leader_renews_every_renew_interval() -> None:
    start = leader(now=0.0)

    early, none = step(start, Tick(), 0.9)
    state, effects = step(start, Tick(), 1.0)

    assert (early, none) == (start, [])
    assert effects == [Renew()]
    assert state.pending


def test_a_renewal_extends_the_time_the_leader_may_serve() -> None:
    state = leader(now=0.0)
    state, _ = step(state, Tick(), 1.0)

    state, effects = step(state, Renewed(valid_until=4.0), 1.1)

    assert effects == []
    assert state == LeadershipState(
        Role.LEADER, ACQUIRE, RENEW, pending=False, next_request=2.1, epoch=7, valid_until=4.0
    )
    assert state.wake_at() == 2.1


def test_a_refused_renewal_makes_the_leader_step_down_and_ask_who_leads() -> None:
    state = leader(now=0.0)
    state, _ = step(state, Tick(), 1.0)

    state, effects = step(state, LeaseLost(), 1.1)

    assert effects == [Follow("a renewal of the lease was refused"), TryAcquire()]
    assert state == LeadershipState(
        Role.FOLLOWER, ACQUIRE, RENEW, pending=True, next_request=1.1, epoch=0, valid_until=0.0
    )


def test_a_leader_steps_down_when_its_lease_runs_out_without_a_renewal_answered() -> None:
    state = leader(now=0.0)
    state, _ = step(state, Tick(), 1.0)  # a renewal that never comes back
    assert state.wake_at() == 3.0

    state, effects = step(state, Tick(), 3.0)

    assert effects == [Follow("the lease ran out before a renewal was answered")]
    assert state.role is Role.FOLLOWER
    assert state.pending  # the stuck renewal: no second request meanwhile


def test_a_leader_resumed_after_a_pause_past_its_lease_steps_down_at_its_first_tick() -> None:
    state = leader(now=0.0)

    state, effects = step(state, Tick(), 60.0)

    assert effects == [Follow("the lease ran out before a renewal was answered"), TryAcquire()]
    assert state.role is Role.FOLLOWER


def test_a_renewal_answered_after_the_step_down_is_ignored() -> None:
    state = leader(now=0.0)
    state, _ = step(state, Tick(), 1.0)
    state, _ = step(state, Tick(), 3.0)

    state, effects = step(state, Renewed(valid_until=6.0), 3.2)

    assert effects == []
    assert state.role is Role.FOLLOWER
    assert not state.pending
    assert state.wake_at() == 3.0  # so it asks for the lease at once


def test_a_leader_whose_database_fails_keeps_leading_until_its_lease_runs_out() -> None:
    state = leader(now=0.0)
    state, _ = step(state, Tick(), 1.0)

    state, effects = step(state, LeaseUnreachable("timeout"), 1.2)

    assert effects == []
    assert state.role is Role.LEADER
    assert state.next_request == pytest.approx(1.7)
    assert state.valid_until == 3.0


def test_a_fenced_log_makes_the_leader_step_down() -> None:
    state = leader(now=0.0)

    state, effects = step(state, Fenced(), 0.5)

    assert effects == [Follow("the log refused an append (a newer epoch exists)"), TryAcquire()]
    assert state.role is Role.FOLLOWER


def test_a_stopped_actor_makes_the_leader_step_down_release_and_wait_a_turn() -> None:
    state = leader(now=0.0)

    state, effects = step(state, ActorStopped(), 0.5)

    assert effects == [Follow("the coordinator actor stopped"), Release()]
    assert state == LeadershipState(Role.FOLLOWER, ACQUIRE, RENEW, pending=False, next_request=1.0)


def test_a_follower_ignores_a_fenced_log_or_a_stopped_actor() -> None:
    state = follower(now=0.0)

    after_fenced, fenced_effects = step(state, Fenced(), 0.1)
    after_stopped, stopped_effects = step(state, ActorStopped(), 0.1)

    assert (after_fenced, fenced_effects) == (state, [])
    assert (after_stopped, stopped_effects) == (state, [])


def test_closing_a_leader_stops_serving_then_releases_the_lease() -> None:
    state = leader(now=0.0)

    state, effects = step(state, Close(), 0.5)

    assert effects == [Follow("closing"), Release()]
    assert state.role is Role.CLOSED
    assert state.wake_at() == math.inf


def test_a_closed_replica_does_nothing_more() -> None:
    state, _ = step(follower(), Close(), 0.5)

    after, effects = step(state, Acquired(8, valid_until=10.0), 1.0)

    assert effects == []
    assert after == state


@pytest.mark.parametrize("interval", [0.0, -1.0, math.inf, math.nan])
def test_an_interval_that_is_not_finite_seconds_above_zero_is_refused(interval: float) -> None:
    with pytest.raises(ValueError, match="acquire_interval must be a finite number"):
        initial(acquire_interval=interval, renew_interval=RENEW, now=0.0)
