"""Replies of the coordinator actor handed to the gRPC server's loop, a batch at a time.

The actor answers a told `Execute` from its own thread; waking the loop for each answer
(`call_soon_threadsafe`: a write to its self-pipe, and a switch of the GIL) would cost more
than the group commit saves. `ReplyHandoff` queues the answers and wakes the loop once
for all those queued before it runs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from functools import partial
from typing import Any

from pykka_delivery.coordinator.actor_messages import ReplyTo
from pykka_delivery.coordinator.commands import Reply

__all__ = ["ReplyHandoff"]


class ReplyHandoff:
    """Hands the actor's answers to futures of ``loop``, with one wake-up per burst."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queued: collections.deque[tuple[asyncio.Future[Any], Reply | Exception]] = (
            collections.deque()
        )
        self._woken = False  # a wake-up is scheduled and has not started draining

    def reply_to(self, future: asyncio.Future[Any]) -> ReplyTo:
        """The ``reply_to`` of an `Execute` whose answer settles ``future``."""
        return partial(self._hand, future)

    def _hand(self, future: asyncio.Future[Any], outcome: Reply | Exception) -> None:
        # Any thread (the actor's). deque.append is atomic; a wake-up missed because the
        # loop is about to reset the flag finds this item when it drains.
        self._queued.append((future, outcome))
        if not self._woken:
            self._woken = True
            with contextlib.suppress(RuntimeError):  # the loop is closed: the server stopped
                self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        """On the loop: settle every queued future (one timed out or cancelled is skipped)."""
        self._woken = False  # before draining: an answer queued from now on wakes again
        queued = self._queued
        while queued:
            future, outcome = queued.popleft()
            if future.done():
                continue
            if isinstance(outcome, Exception):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)
