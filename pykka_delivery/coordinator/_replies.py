"""Replies of the coordinator actor handed to the gRPC server's loop, a batch at a time.

The actor answers a told `Execute` from its own thread; waking the loop for each answer
(`call_soon_threadsafe`: a write to its self-pipe, and a switch of the GIL) would cost more
than the group commit saves. `ReplyHandoff` queues the answers and wakes the loop once
for all those queued before it runs (`LoopHandoff`). `Expiry` bounds how long they are
waited for, with one timer for all of them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from functools import partial
from typing import Any

from pykka_delivery.coordinator._handoff import LoopHandoff
from pykka_delivery.coordinator.actor_messages import ReplyTo
from pykka_delivery.coordinator.commands import Reply

__all__ = ["Expired", "Expiry", "ReplyHandoff"]


class ReplyHandoff:
    """Hands the actor's answers to futures of ``loop``, with one wake-up per burst
    (`LoopHandoff`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._handoff: LoopHandoff[tuple[asyncio.Future[Any], Reply | Exception]] = LoopHandoff(
            loop, _settle
        )

    def reply_to(self, future: asyncio.Future[Any]) -> ReplyTo:
        """The ``reply_to`` of an `Execute` whose answer settles ``future``."""
        return partial(self._hand, future)

    def _hand(self, future: asyncio.Future[Any], outcome: Reply | Exception) -> None:
        # Any thread (the actor's).
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
            self._handoff.hand((future, outcome))


def _settle(answer: tuple[asyncio.Future[Any], Reply | Exception]) -> None:
    """On the loop: settle a future (one timed out or cancelled is skipped)."""
    future, outcome = answer
    if future.done():
        return
    if isinstance(outcome, Exception):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


class Expired(Exception):
    """A future of `Expiry` was not done within its timeout."""


class Expiry:
    """Fails futures of ``loop`` not done within ``timeout`` seconds with `Expired`.

    One timer for all: a timer per future (``call_later``, then ``cancel``) would push
    and leave a cancelled entry in the loop's heap on every request. The timeout is the
    same for every future, so their deadlines come in the order they are added. On the
    loop only.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self._loop = loop
        self._timeout = timeout
        self._waiting: collections.deque[tuple[float, asyncio.Future[Any]]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, future: asyncio.Future[Any]) -> None:
        waiting = self._waiting
        while waiting and waiting[0][1].done():  # answered: no longer watched
            waiting.popleft()
        deadline = self._loop.time() + self._timeout
        waiting.append((deadline, future))
        if self._timer is None:
            self._timer = self._loop.call_at(deadline, self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = self._loop.time()
        waiting = self._waiting
        while waiting:
            deadline, future = waiting[0]
            if not future.done():
                if deadline > now:
                    self._timer = self._loop.call_at(deadline, self._expire)
                    return
                future.set_exception(Expired())
            waiting.popleft()
