"""The coordinator actor's pending batch: commands applied to its state, not yet stored.

Group commit: the actor applies consecutive told `Execute` messages to its in-memory
state one by one and keeps them here; it then stores the commands that changed the state
with one `CommandLog.append_all`, and only after that carries out their effects and
answers their requesters, in order. If the store refuses, the state goes back to
`PendingBatch.before` and every requester gets the error (`answer_all`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import pykka

from pykka_delivery.coordinator.actor_messages import Execute, ReplyTo
from pykka_delivery.coordinator.commands import Command, Reply
from pykka_delivery.coordinator.machine import Outcome
from pykka_delivery.coordinator.state import CoordinatorState
from pykka_delivery.coordinator.store import LogFencedError

__all__ = [
    "DEFAULT_MAX_BATCH",
    "PendingBatch",
    "Staged",
    "answer",
    "answer_all",
    "fenced_error",
    "refuse_queued",
]

logger = logging.getLogger("pykka_delivery.coordinator")

DEFAULT_MAX_BATCH = 256
"""Default most commands the coordinator stores with one append (group commit)."""


class _Inbox(Protocol):
    """A pykka actor's inbox, as far as `refuse_queued` reads it."""

    def empty(self) -> bool: ...

    def get(self) -> Any: ...


class Staged(NamedTuple):
    """One command of a batch: applied to the state, its effects and reply held back."""

    command: Command
    before: CoordinatorState  # the state it was applied to
    outcome: Outcome
    changed: bool  # stored, and its activation changes recorded, at the commit
    reply_to: ReplyTo | None  # None: asked, answered by the actor's return value


class PendingBatch:
    """The staged commands, in order, and the state before the first of them."""

    __slots__ = ("before", "items")

    def __init__(self) -> None:
        self.items: list[Staged] = []
        self.before: CoordinatorState | None = None

    def add(self, staged: Staged) -> None:
        if not self.items:
            self.before = staged.before
        self.items.append(staged)

    def take(self) -> tuple[CoordinatorState, list[Staged]]:
        """The state before the batch and its commands; the batch is empty afterwards."""
        before, items = self.before, self.items
        assert before is not None, "take() of an empty batch"
        self.items, self.before = [], None
        return before, items

    def commit(
        self,
        store: Callable[[Sequence[Command]], None],
        carry_out: Callable[[Staged], None],
    ) -> tuple[CoordinatorState, Exception | None]:
        """Store the commands that changed the state with one call of ``store``, then
        ``carry_out`` each staged command and answer its requester, in order. If
        ``store`` raises, nothing is carried out and each requester gets the error.

        Returns the state before the batch (to go back to if ``store`` failed) and the
        store's error, or None. The batch is empty afterwards."""
        before, items = self.take()
        commands = [item.command for item in items if item.changed]
        if commands:
            try:
                store(commands)
            except Exception as error:
                logger.warning(
                    "The coordinator could not store %d commands (their requesters get "
                    "the error): %s",
                    len(commands),
                    error,
                )
                answer_all(items, error)
                return before, error
        for item in items:
            carry_out(item)
        for item in items:
            if item.reply_to is not None:
                answer(item.reply_to, item.outcome.reply)
        return before, None


def answer(reply_to: ReplyTo, outcome: Reply | Exception) -> None:
    """Call ``reply_to``; its failure is logged, never raised into the actor's batch."""
    try:
        reply_to(outcome)
    except Exception:
        logger.exception("A requester's reply_to failed on %r", outcome)


def answer_all(items: list[Staged], error: Exception) -> None:
    """Give ``error`` to every told requester of ``items``."""
    for item in items:
        if item.reply_to is not None:
            answer(item.reply_to, error)


def refuse_queued(inbox: _Inbox, error: pykka.ActorDeadError) -> None:
    """Answer what still waits in a stopped actor's ``inbox`` with ``error``: pykka
    answers only the asks, and a told `Execute`'s requester would wait for nothing."""
    while not inbox.empty():
        envelope = inbox.get()
        message = envelope.message
        if type(message) is Execute and message.reply_to is not None:
            answer(message.reply_to, error)
        elif envelope.reply_to is not None:
            envelope.reply_to.set_exception(exc_info=(type(error), error, None))


def fenced_error() -> LogFencedError:
    """What a coordinator whose log was fenced answers while it stops."""
    msg = (
        "this coordinator lost leadership: another coordinator leads, and this one is "
        "stopping; reconnect to the leader"
    )
    return LogFencedError(msg)
