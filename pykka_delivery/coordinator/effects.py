"""Effects: the orders the coordinator's state machine hands to its shell.

The machine never sends, watches or times anything itself. `machine.apply` returns these,
and the shell (the coordinator actor, or a test) carries them out in order. Don't subclass
these.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pykka_delivery.coordinator.commands import DisconnectedTimeout
from pykka_delivery.coordinator.state import Consumer, GroupId

__all__ = [
    "CancelTimer",
    "CheckConnection",
    "Effect",
    "SendConsumerUpdate",
    "StartTimer",
    "UnwatchConnection",
    "WatchConnection",
    "activate",
    "step_down",
]


@dataclass(frozen=True, slots=True)
class SendConsumerUpdate:
    """Tell the subscription ``subscription_id`` of ``connection`` its part in ``group``.

    ``active=True``: start consuming. ``active=False`` always means *stepping down*
    (the coordinator never sends a bare "inactive"): finish what is in flight, stop, and
    answer with `ActivateConsumer` for the group. The connection answers even if it no
    longer has the subscription, so the group can hand over. Receiving the update it is
    already in is harmless (`Recover` re-sends them).

    ``epoch`` is the fencing epoch of the activation: the one it starts (``active=True``)
    or the one it ends (a step-down, which the answer names back); 0 from an older
    coordinator. Not compared: two updates are the same order whatever epoch they carry
    (the machine drops a repeated step-down by equality), and tests about epochs read it.
    """

    connection: str
    subscription_id: int
    group: GroupId
    active: bool
    epoch: int = field(default=0, compare=False)

    @property
    def stepping_down(self) -> bool:
        return not self.active


@dataclass(frozen=True, slots=True)
class StartTimer:
    """Start the one-shot timer ``key`` (replacing one with the same key); when it fires
    after ``delay`` seconds, apply ``key`` (a `DisconnectedTimeout`) to the machine."""

    key: DisconnectedTimeout
    delay: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    """Cancel the timer ``key``. A firing that races the cancel is harmless."""

    key: DisconnectedTimeout


@dataclass(frozen=True, slots=True)
class CheckConnection:
    """Ask ``connection`` whether it is alive. Alive: apply `ConnectionReconnected`;
    gone: apply `ConnectionDown`; no answer: nothing (it stays as it is)."""

    connection: str


@dataclass(frozen=True, slots=True)
class WatchConnection:
    """``connection`` has its first consumer: track its liveness and report it as
    `ConnectionLost`, `ConnectionReconnected` and `ConnectionDown`."""

    connection: str


@dataclass(frozen=True, slots=True)
class UnwatchConnection:
    """``connection`` has no consumer left: stop tracking it."""

    connection: str


Effect = (
    SendConsumerUpdate
    | StartTimer
    | CancelTimer
    | CheckConnection
    | WatchConnection
    | UnwatchConnection
)


def activate(group: GroupId, consumer: Consumer) -> SendConsumerUpdate:
    """Tell ``consumer`` it is the active consumer of ``group`` (under its epoch)."""
    return SendConsumerUpdate(
        consumer.connection, consumer.subscription_id, group, True, consumer.epoch
    )


def step_down(group: GroupId, consumer: Consumer) -> SendConsumerUpdate:
    """Tell ``consumer`` to step down in ``group`` from its epoch's activation and answer
    with `ActivateConsumer`."""
    return SendConsumerUpdate(
        consumer.connection, consumer.subscription_id, group, False, consumer.epoch
    )
