"""Items handed from other threads to an asyncio loop, with one wake-up per burst.

Waking a loop from another thread (`call_soon_threadsafe`: a write to its self-pipe, a
read of it on the loop, and a switch of the GIL) costs more than handling a small item.
`LoopHandoff` queues the items and wakes the loop once for all those queued before it
runs: the coordinator's answers to its gRPC loop (_replies.py), a client's requests to its
loop (client.py).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["LoopHandoff"]

T = TypeVar("T")


class LoopHandoff(Generic[T]):
    """Hands items from any thread to ``consume``, called on ``loop`` in the order handed."""

    def __init__(self, loop: asyncio.AbstractEventLoop, consume: Callable[[T], object]) -> None:
        self._loop = loop
        self._consume = consume
        self._queued: collections.deque[T] = collections.deque()
        self._woken = False  # a wake-up is scheduled and has not started draining

    def hand(self, item: T) -> None:
        """Queue ``item`` for the loop (any thread).

        Raises:
            RuntimeError: the loop is closed; ``item`` is not handed.
        """
        # deque.append is atomic; a wake-up missed because the loop is about to reset the
        # flag finds this item when it drains.
        self._queued.append(item)
        if self._woken:
            return
        self._woken = True
        try:
            self._loop.call_soon_threadsafe(self._drain)
        except RuntimeError:
            self._woken = False
            with contextlib.suppress(ValueError):  # drained meanwhile
                self._queued.remove(item)
            raise

    def _drain(self) -> None:
        """On the loop: consume every queued item."""
        self._woken = False  # before draining: an item queued from now on wakes again
        queued, consume = self._queued, self._consume
        while queued:
            consume(queued.popleft())
