"""Drive pure cores without threads: probes, a fake clock and a lossy in-memory network.

* `Probe`: a ref that records what it is told; tests pop messages in order with `expect`.
* `Driver`: owns one core and a `FakeClock`; `feed(msg)` hands a message to the core and
  carries out the effects at once (Send -> ``to.tell``, timers -> the fake clock).
* `FakeClock`: fixed-delay timers on virtual time; `advance(seconds)` fires what is due, in
  time order, through the owning driver.
* `Network`: joins drivers through `Link` refs that can drop, duplicate or reorder messages
  (decided by a callable, so hypothesis or a seeded RNG can steer it); `run()` delivers
  queued messages until nothing is left.
"""

from __future__ import annotations

import heapq
import itertools
import json
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pykka_delivery.delivery.core.consumer import ConsumerCore
from pykka_delivery.delivery.core.effects import CancelTimer, Effect, Send, StartTimer, Stop
from pykka_delivery.delivery.core.producer import ProducerCore
from pykka_delivery.delivery.messages import SendNext
from pykka_delivery.delivery.timers import TimerService


class Probe:
    """A ref that records every message told to it."""

    def __init__(self, name: str = "probe") -> None:
        self.name = name
        self.messages: deque[Any] = deque()

    def __repr__(self) -> str:
        return f"Probe({self.name})"

    def tell(self, message: Any) -> None:
        self.messages.append(message)

    def receive(self) -> Any:
        assert self.messages, f"{self.name} expected a message, got none"
        return self.messages.popleft()

    def expect(self, expected: Any) -> Any:
        """Pop the next message and assert it equals ``expected``."""
        got = self.receive()
        assert got == expected, f"{self.name}: expected {expected!r}, got {got!r}"
        return got

    def expect_type(self, cls: type) -> Any:
        got = self.receive()
        assert isinstance(got, cls), f"{self.name}: expected a {cls.__name__}, got {got!r}"
        return got

    def expect_no_message(self) -> None:
        assert not self.messages, f"{self.name}: expected nothing, got {list(self.messages)!r}"

    def drain(self) -> list[Any]:
        out = list(self.messages)
        self.messages.clear()
        return out


@dataclass(order=True)
class _Timer:
    due: float
    order: int
    key: str = field(compare=False)
    interval: float = field(compare=False)
    owner: Driver = field(compare=False)
    generation: int = field(compare=False)


class FakeClock:
    """Virtual time with fixed-delay timers (Akka's ``startTimerWithFixedDelay``)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[_Timer] = []
        self._live: dict[tuple[int, str], int] = {}  # (owner id, key) -> generation
        self._order = itertools.count()

    def start(self, owner: Driver, key: str, interval: float) -> None:
        generation = next(self._order)
        self._live[(id(owner), key)] = generation
        heapq.heappush(
            self._heap,
            _Timer(self.now + interval, generation, key, interval, owner, generation),
        )

    def cancel(self, owner: Driver, key: str) -> None:
        self._live.pop((id(owner), key), None)

    def is_running(self, owner: Driver, key: str) -> bool:
        return (id(owner), key) in self._live

    def interval_of(self, owner: Driver, key: str) -> float | None:
        generation = self._live.get((id(owner), key))
        for timer in self._heap:
            if timer.generation == generation:
                return timer.interval
        return None

    def advance(self, seconds: float) -> None:
        """Move time forward, firing every due timer in order (re-arming fixed delays)."""
        until = self.now + seconds
        while self._heap and self._heap[0].due <= until:
            timer = heapq.heappop(self._heap)
            if self._live.get((id(timer.owner), timer.key)) != timer.generation:
                continue  # cancelled or replaced
            self.now = timer.due
            heapq.heappush(
                self._heap,
                _Timer(
                    self.now + timer.interval,
                    next(self._order),
                    timer.key,
                    timer.interval,
                    timer.owner,
                    timer.generation,
                ),
            )
            timer.owner.fire(timer.key)
        self.now = until


class Driver:
    """Feeds one core and carries out its effects immediately."""

    def __init__(self, core: ProducerCore | ConsumerCore, clock: FakeClock) -> None:
        self.core = core
        self.clock = clock
        self.stopped = False
        self.effects_log: list[Effect] = []

    def feed(self, message: Any) -> list[Effect]:
        return self.apply(self.core.receive(message))

    def fire(self, key: str) -> list[Effect]:
        if self.stopped:
            return []
        return self.apply(self.core.on_timer(key))

    def apply(self, effects: Iterable[Effect]) -> list[Effect]:
        done = []
        for effect in effects:
            done.append(effect)
            if isinstance(effect, Send):
                effect.to.tell(effect.message)
            elif isinstance(effect, StartTimer):
                self.clock.start(self, effect.key, effect.interval)
            elif isinstance(effect, CancelTimer):
                self.clock.cancel(self, effect.key)
            elif isinstance(effect, Stop):
                self.stopped = True
                self.clock.cancel(self, "retry")
                self.clock.cancel(self, "resend_first")
        self.effects_log.extend(done)
        return done


class SelfRef:
    """The ref a core stamps as its own address; tells go to a driver via a network or
    straight into a probe, as the test wires it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.target: Callable[[Any], None] | None = None

    def __repr__(self) -> str:
        return f"SelfRef({self.name})"

    def tell(self, message: Any) -> None:
        assert self.target is not None, f"{self.name} is not wired"
        self.target(message)


def producer_driver(
    clock: FakeClock, producer_id: str = "p-1", **core_kwargs: Any
) -> tuple[Driver, SelfRef, Probe]:
    """A producer core whose ``send_next_to`` wraps into SendNext and feeds the driver.

    Returns (driver, self_ref, producer_probe); ``self_ref`` feeds the driver directly.
    """
    self_ref = SelfRef(f"pc-{producer_id}")
    send_next_to = SelfRef(f"send-next-{producer_id}")
    core = ProducerCore(producer_id, self_ref, send_next_to, **core_kwargs)
    driver = Driver(core, clock)
    self_ref.target = driver.feed
    send_next_to.target = lambda m: driver.feed(SendNext(m))
    return driver, self_ref, Probe(f"producer-{producer_id}")


def consumer_driver(
    clock: FakeClock, name: str = "cc", **core_kwargs: Any
) -> tuple[Driver, SelfRef]:
    """A consumer core whose ``self_ref`` feeds the driver directly; starts its timer."""
    self_ref = SelfRef(name)
    core = ConsumerCore(self_ref, **core_kwargs)
    driver = Driver(core, clock)
    self_ref.target = driver.feed
    driver.apply(core.on_spawned())
    return driver, self_ref


# --- a lossy network between cores ------------------------------------------------------

Fate = Callable[[Any], str]
"""Decides what happens to one message on a link: "deliver", "drop", "duplicate" or "delay"
("delay" puts it behind whatever is queued after it: a reordering)."""


def always_deliver(_: Any) -> str:
    return "deliver"


class Network:
    """Queues messages between drivers so a test decides drops, duplicates and order."""

    def __init__(self) -> None:
        self.queue: deque[tuple[Callable[[Any], Any], Any]] = deque()
        self.delivered = 0

    def link(self, target: Callable[[Any], Any], fate: Fate = always_deliver) -> Link:
        return Link(self, target, fate)

    def run(self, max_steps: int = 1_000_000) -> None:
        """Deliver queued messages until none is left."""
        steps = 0
        while self.queue:
            steps += 1
            assert steps <= max_steps, "network did not settle"
            target, message = self.queue.popleft()
            self.delivered += 1
            target(message)


class Link:
    """A ref on a `Network`: tells are queued, and may be dropped, duplicated or delayed."""

    def __init__(self, network: Network, target: Callable[[Any], Any], fate: Fate) -> None:
        self.network = network
        self.target = target
        self.fate = fate

    def tell(self, message: Any) -> None:
        fate = self.fate(message)
        if fate == "drop":
            return
        entry = (self.target, message)
        queue = self.network.queue
        if fate == "delay" and queue:
            queue.insert(1, entry)  # behind the next queued message: a reorder
        else:
            queue.append(entry)
        if fate == "duplicate":
            queue.append(entry)


class _ManualEntry:
    def __init__(self, callback: Callable[[], None]) -> None:
        self.callback = callback
        self.cancelled = False


class ManualTimerService(TimerService):
    """A `TimerService` whose timers fire only when a test says so (no thread): for
    sessions and handles driven step by step. ``entries`` are the timers armed so far."""

    def __init__(self) -> None:
        self.entries: list[_ManualEntry] = []

    def call_later(self, delay: float, callback: Callable[[], None]) -> Any:
        entry = _ManualEntry(callback)
        self.entries.append(entry)
        return entry

    def running(self) -> int:
        """How many timers are armed and not cancelled."""
        return sum(not e.cancelled for e in self.entries)

    def fire_all(self) -> None:
        """Fire the timers armed and not cancelled (each firing reaches its owner, which
        re-arms the timer when it takes the firing in)."""
        self._fire(cancelled=False)

    def fire_cancelled(self) -> None:
        """Fire the timers cancelled or replaced since: their firings were on their way."""
        self._fire(cancelled=True)

    def _fire(self, *, cancelled: bool) -> None:
        due = [e for e in self.entries if e.cancelled == cancelled]
        self.entries = [e for e in self.entries if e.cancelled != cancelled]
        for entry in due:
            entry.callback()


WAIT = 20.0
"""How long `wait_until` waits by default: a bound on a wait expected to succeed, so
generous (the machine is shared); a failing test pays it once."""


def wait_until(
    condition: Callable[[], object], what: str = "the condition", timeout: float = WAIT
) -> None:
    """Poll ``condition`` every 10 ms until it is true; fail naming ``what`` after
    ``timeout`` seconds. For state that only polling can observe, never as a sleep."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.01)


def bench_figures(script: str, *args: str, timeout: float = 60.0) -> dict[str, Any]:
    """Run ``bench/<script>`` with ``args`` from the project's root; its final JSON line.
    Fails (naming its output) unless it exits with 0."""
    done = subprocess.run(
        [sys.executable, f"bench/{script}", *args],
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures
