"""Who leads: the pure core of a coordinator replica's election (no threads, no clock, no
database).

Theory of operation:

* Several replicas share one lease (holder, epoch, expiry by the database's clock). A
  replica is a FOLLOWER or the LEADER; the shell (replica.py) feeds this core what
  happened (`Tick`, the answers of the lease, the actor's end, `Close`) with the
  monotonic ``now``, and carries out the effects it returns: `TryAcquire`, `Renew` and
  `Release` talk to the lease, `Lead` starts the coordinator actor and serves it,
  `Follow` stops it and ends every stream.
* A follower tries to take the lease every ``acquire_interval``, or as soon as the lease
  it was told about runs out, whichever comes first: a fail-over costs at most the lease's
  ttl plus one interval.
* A leader renews every ``renew_interval`` (a third of the ttl by default) and stops
  leading as soon as a renewal is refused, its log is fenced, its actor stops, or
  ``valid_until`` passes without a renewal answered (a renewal stuck on a dead database
  does not keep it leading). Stepping down, it asks for the lease again at once (it may
  be free, and a refusal names the new leader), except after its actor stopped: then it
  releases the lease, so that another replica may lead, and waits one interval.
  ``valid_until`` is reckoned from before each request was sent, so the replica stops
  before the database would grant the lease to another one.
* One lease request at a time (``pending``): an answer that arrives after the replica
  stepped down (a late renewal) is ignored.
* Failures of the lease itself (`LeaseUnreachable`: the database is down) change no role:
  a follower tries again after ``acquire_interval``, a leader renews again after it and
  keeps leading until ``valid_until``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass

__all__ = [
    "DEFAULT_ACQUIRE_INTERVAL",
    "Acquired",
    "ActorStopped",
    "Close",
    "Effect",
    "Event",
    "Fenced",
    "Follow",
    "Lead",
    "LeaderSeen",
    "LeadershipState",
    "LeaseLost",
    "LeaseUnreachable",
    "Release",
    "Renew",
    "Renewed",
    "Role",
    "Tick",
    "TryAcquire",
    "initial",
    "step",
]


DEFAULT_ACQUIRE_INTERVAL = 0.5
"""Default seconds between a follower's attempts to take the lease."""


class Role(enum.Enum):
    FOLLOWER = "follower"
    LEADER = "leader"
    CLOSED = "closed"


# --- events: what happened -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed (the shell wakes at `LeadershipState.wake_at`)."""


@dataclass(frozen=True, slots=True)
class Acquired:
    """The lease was taken, under ``epoch``, valid until ``valid_until`` (monotonic)."""

    epoch: int
    valid_until: float


@dataclass(frozen=True, slots=True)
class LeaderSeen:
    """The lease is held by another replica, reachable at ``address`` (None: unknown),
    for ``seconds_left`` more by the database's clock (None: unknown)."""

    address: str | None
    seconds_left: float | None


@dataclass(frozen=True, slots=True)
class Renewed:
    """The lease was renewed, valid until ``valid_until`` (monotonic)."""

    valid_until: float


@dataclass(frozen=True, slots=True)
class LeaseLost:
    """A renewal was refused: another replica holds the lease (or it expired)."""


@dataclass(frozen=True, slots=True)
class LeaseUnreachable:
    """A lease request failed (the database did not answer); ``error`` says why."""

    error: str


@dataclass(frozen=True, slots=True)
class Fenced:
    """The log refused an append: a newer epoch exists."""


@dataclass(frozen=True, slots=True)
class ActorStopped:
    """The coordinator actor stopped by itself (failed, or fenced)."""


@dataclass(frozen=True, slots=True)
class Close:
    """The replica is closing."""


Event = (
    Tick
    | Acquired
    | LeaderSeen
    | Renewed
    | LeaseLost
    | LeaseUnreachable
    | Fenced
    | ActorStopped
    | Close
)


# --- effects: what the shell does ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TryAcquire:
    """Ask the lease for leadership; answer `Acquired`, `LeaderSeen` or `LeaseUnreachable`."""


@dataclass(frozen=True, slots=True)
class Renew:
    """Renew the lease; answer `Renewed`, `LeaseLost` or `LeaseUnreachable`."""


@dataclass(frozen=True, slots=True)
class Release:
    """Give the lease up, so that a follower takes over at once (closing)."""


@dataclass(frozen=True, slots=True)
class Lead:
    """Start the coordinator actor under ``epoch`` and serve it."""

    epoch: int


@dataclass(frozen=True, slots=True)
class Follow:
    """Stop the actor at once, end every stream, answer clients with the leader's address;
    ``reason`` is logged."""

    reason: str


Effect = TryAcquire | Renew | Release | Lead | Follow


# --- state -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LeadershipState:
    """One replica's view of the election.

    Attributes:
        role: FOLLOWER, LEADER or CLOSED.
        acquire_interval: seconds between two attempts of a follower (and between two
            renewals of a leader whose database does not answer).
        renew_interval: seconds between two renewals of a leader.
        pending: a lease request is in flight (its answer not fed back yet).
        next_request: when the next `TryAcquire` / `Renew` is due (monotonic).
        epoch: the leader's epoch (0 for a follower).
        valid_until: until when the leader may serve (monotonic; 0 for a follower).
        leader: the address of the replica believed to lead, if known (a follower's).
    """

    role: Role
    acquire_interval: float
    renew_interval: float
    pending: bool = False
    next_request: float = 0.0
    epoch: int = 0
    valid_until: float = 0.0
    leader: str | None = None

    @property
    def leading(self) -> bool:
        return self.role is Role.LEADER

    def wake_at(self) -> float:
        """When the shell must feed the next `Tick` (monotonic; ``inf``: only on an event)."""
        if self.role is Role.CLOSED:
            return math.inf
        due = math.inf if self.pending else self.next_request
        return min(due, self.valid_until) if self.leading else due


def initial(
    *, acquire_interval: float, renew_interval: float, now: float
) -> tuple[LeadershipState, list[Effect]]:
    """A follower that tries to take the lease at once.

    Raises:
        ValueError: an interval is not a finite number of seconds above 0.
    """
    for name, value in (("acquire_interval", acquire_interval), ("renew_interval", renew_interval)):
        if not (math.isfinite(value) and value > 0):
            msg = f"{name} must be a finite number of seconds above 0, got {value!r}"
            raise ValueError(msg)
    state = LeadershipState(Role.FOLLOWER, acquire_interval, renew_interval, next_request=now)
    return step(state, Tick(), now)


def step(state: LeadershipState, event: Event, now: float) -> tuple[LeadershipState, list[Effect]]:
    """The state after ``event`` at monotonic time ``now``, and the effects to carry out,
    in order."""
    if state.role is Role.CLOSED:
        return state, []
    if type(event) is Close:
        return _close(state)
    if state.leading:
        return _leader(state, event, now)
    return _follower(state, event, now)


def _close(state: LeadershipState) -> tuple[LeadershipState, list[Effect]]:
    closed = dataclasses.replace(state, role=Role.CLOSED, epoch=0, valid_until=0.0)
    if state.leading:
        return closed, [Follow("closing"), Release()]
    return closed, []


def _follower(
    state: LeadershipState, event: Event, now: float
) -> tuple[LeadershipState, list[Effect]]:
    """A follower waits for its turn: it asks for the lease when due, one request at a
    time, and learns who leads from the refusals."""
    replace = dataclasses.replace
    if type(event) is Acquired:
        leading = replace(
            state,
            role=Role.LEADER,
            pending=False,
            epoch=event.epoch,
            valid_until=event.valid_until,
            next_request=now + state.renew_interval,
            leader=None,
        )
        if event.valid_until <= now:  # granted, but its answer came too late to use
            return _step_down(leading, "the lease expired before its grant was answered", now)
        return leading, [Lead(event.epoch)]
    if type(event) is LeaderSeen:
        wait = state.acquire_interval
        if event.seconds_left is not None:
            wait = min(wait, max(event.seconds_left, 0.0))
        held = event.seconds_left is None or event.seconds_left > 0
        leader = event.address if held else None
        return replace(state, pending=False, next_request=now + wait, leader=leader), []
    if type(event) is LeaseUnreachable:
        return replace(state, pending=False, next_request=now + state.acquire_interval), []
    if type(event) in (Renewed, LeaseLost):
        return replace(state, pending=False), []  # a renewal answered after a step-down
    if not state.pending and now >= state.next_request:
        return replace(state, pending=True), [TryAcquire()]
    return state, []  # Tick before it is due, Fenced / ActorStopped of an actor already gone


def _leader(
    state: LeadershipState, event: Event, now: float
) -> tuple[LeadershipState, list[Effect]]:
    """A leader renews when due and steps down on any sign that it may no longer lead."""
    replace = dataclasses.replace
    if type(event) is LeaseLost:
        return _step_down(replace(state, pending=False), "a renewal of the lease was refused", now)
    if type(event) is Fenced:
        return _step_down(state, "the log refused an append (a newer epoch exists)", now)
    if type(event) is ActorStopped:
        # Another replica may lead where this one failed: give the lease up, wait a turn.
        follower, effects = _step_down(state, "the coordinator actor stopped", now)
        follower = dataclasses.replace(
            follower, pending=state.pending, next_request=now + state.acquire_interval
        )
        return follower, [effects[0], Release()]
    if type(event) is Renewed:
        renewed = replace(
            state, pending=False, valid_until=max(state.valid_until, event.valid_until)
        )
        state = replace(renewed, next_request=now + state.renew_interval)
    elif type(event) is LeaseUnreachable:
        wait = min(state.renew_interval, state.acquire_interval)
        state = replace(state, pending=False, next_request=now + wait)
    if now >= state.valid_until:
        return _step_down(state, "the lease ran out before a renewal was answered", now)
    if not state.pending and now >= state.next_request:
        return replace(state, pending=True), [Renew()]
    return state, []


def _step_down(
    state: LeadershipState, reason: str, now: float
) -> tuple[LeadershipState, list[Effect]]:
    """Back to follower; it asks for the lease again at once (it may be free)."""
    follower = dataclasses.replace(
        state, role=Role.FOLLOWER, epoch=0, valid_until=0.0, next_request=now, leader=None
    )
    effects: list[Effect] = [Follow(reason)]
    if not follower.pending:
        follower = dataclasses.replace(follower, pending=True)
        effects.append(TryAcquire())
    return follower, effects
