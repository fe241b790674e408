"""Timers for pykka actors and handles (pykka has none).

`TimerService` is one daemon thread with a heap of deadlines; when one is due it calls its
callback, typically ``ref.tell(TimerFired(...))``, so the timer firing arrives as an ordinary
message in the owner's inbox and is handled in the owner's thread.

`Timers` gives an owner Akka's keyed fixed-delay timers on top of it. A cancelled or
replaced timer may already have a `TimerFired` in the owner's inbox; every firing carries a
generation number and `Timers.accept` drops the stale ones, so a cancel always wins.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["TimerFired", "TimerService", "Timers", "default_timer_service"]

logger = logging.getLogger("pykka_delivery.timers")


class _Entry:
    __slots__ = ("callback", "cancelled", "due")

    def __init__(self, due: float, callback: Callable[[], None]) -> None:
        self.due = due
        self.callback = callback
        self.cancelled = False


class TimerService:
    """Runs callbacks after a delay on one shared daemon thread.

    Callbacks must be quick (a ``tell``): they run on the service's thread one after another.
    An exception from a callback is logged and does not stop the service.
    """

    def __init__(self, name: str = "pykka-delivery-timers") -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, _Entry]] = []
        self._order = itertools.count()
        self._running = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def call_later(self, delay: float, callback: Callable[[], None]) -> _Entry:
        """Run ``callback`` after ``delay`` seconds; returns a handle for `cancel`."""
        entry = _Entry(time.monotonic() + delay, callback)
        with self._cond:
            heapq.heappush(self._heap, (entry.due, next(self._order), entry))
            if self._heap[0][2] is entry:
                self._cond.notify()
        return entry

    @staticmethod
    def cancel(entry: _Entry) -> None:
        """Make sure ``entry``'s callback does not run (if it has not started yet)."""
        entry.cancelled = True

    def shutdown(self) -> None:
        """Stop the thread; pending callbacks are dropped."""
        with self._cond:
            self._running = False
            self._cond.notify()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        heap = self._heap
        while True:
            with self._cond:
                while self._running:
                    if not heap:
                        self._cond.wait()
                        continue
                    wait = heap[0][0] - time.monotonic()
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                if not self._running:
                    return
                entry = heapq.heappop(heap)[2]
            if entry.cancelled:
                continue
            try:
                entry.callback()
            except Exception:
                logger.exception("Timer callback failed")


_default: TimerService | None = None
_default_lock = threading.Lock()


def default_timer_service() -> TimerService:
    """The process-wide `TimerService`, started on first use."""
    global _default  # noqa: PLW0603 - one lazily created service per process
    with _default_lock:
        if _default is None:
            _default = TimerService()
        return _default


@dataclass(frozen=True, slots=True)
class TimerFired:
    """The timer ``key`` of the receiving owner fired (generation ``generation``)."""

    key: str
    generation: int


class Timers:
    """Keyed fixed-delay timers for one owner.

    Args:
        tell: how a firing reaches the owner (usually its ref's ``tell``); called on the
            timer thread with a `TimerFired`.
        service: the `TimerService` to use (default: the process-wide one).
    """

    def __init__(self, tell: Callable[[TimerFired], None], service: TimerService | None = None):
        self._tell = tell
        self._service = service or default_timer_service()
        self._generation = itertools.count(1)
        self._live: dict[str, tuple[int, float, _Entry]] = {}

    def start(self, key: str, interval: float) -> None:
        """(Re)start ``key`` to fire every ``interval`` seconds until cancelled."""
        self.cancel(key)
        self._arm(key, next(self._generation), interval)

    def cancel(self, key: str) -> None:
        live = self._live.pop(key, None)
        if live is not None:
            TimerService.cancel(live[2])

    def cancel_all(self) -> None:
        for key in list(self._live):
            self.cancel(key)

    def is_running(self, key: str) -> bool:
        return key in self._live

    def accept(self, fired: TimerFired) -> bool:
        """True if ``fired`` is the current generation of its timer; re-arms it (fixed
        delay: the next firing is counted from now). False for a stale firing."""
        live = self._live.get(fired.key)
        if live is None or live[0] != fired.generation:
            return False
        self._arm(fired.key, fired.generation, live[1])
        return True

    def _arm(self, key: str, generation: int, interval: float) -> None:
        fired = TimerFired(key, generation)
        entry = self._service.call_later(interval, lambda: self._tell(fired))
        self._live[key] = (generation, interval, entry)
