"""Test actors for end-to-end tests on real pykka actors: Pekko's delivery test kit, ported.

* `TestConsumer` (Pekko's ``TestConsumer``): registers with its consumer controller,
  confirms each `Delivery` (at once, or after a delay), reports a duplicate
  ``(producer_id, seq_nr)`` as a violation, and at the end seq_nr reports `Collected` and
  stops.
* `TestProducer` (``TestProducer``): answers each `RequestNext` with ``msg-1``, ``msg-2``,
  ... at once, or one tick of ``delay`` later; a second `RequestNext` while one is held is a
  violation.
* `TestProducerWithAsk` (``TestProducerWithAsk``): the same with `MessageWithConfirmation`;
  each confirmed seq_nr is recorded.
* `Recorder`: what these actors report to the test thread, and the only place the test
  waits (bounded, on a condition variable, never a bare sleep: STYLE.md rule 15).
* `BlockingProbe`: a ref that queues what it is told, for tests that play one side by hand.
* `TapRef`: a ref that records chosen messages told through it, then forwards them.

An exception in a pykka actor's ``on_receive`` would only stop that actor (and make the test
time out without saying why), so the kit actors never raise: a broken expectation is
recorded with `Recorder.violation`, which wakes the waiting test and fails it at once.

Payloads are plain strings, ``msg-<n>``: the STR serializer writes them as UTF-8, so with
``chunk_large_messages=1`` each message is cut into one chunk per character, as the
original's ``TestSerializer`` does with ``Job("msg-n")``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import pykka

from pykka_delivery.delivery.messages import (
    CONFIRMED,
    ConsumerStart,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    RequestNext,
)
from pykka_delivery.delivery.timers import default_timer_service
from pykka_delivery.protocol.messages import Ref

__all__ = [
    "BlockingProbe",
    "Collected",
    "Processed",
    "Recorder",
    "TapRef",
    "TestConsumer",
    "TestProducer",
    "TestProducerWithAsk",
    "describe_controller",
    "last_chunk_seq_nrs",
    "messages_until",
]

logger = logging.getLogger("tests.actor_kit")

T = TypeVar("T")

DEFAULT_WAIT = 10.0  # seconds; the original waits 5 s, our machine is shared and noisy


# --- what the test thread sees ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Collected:
    """A `TestConsumer` reached its end: which producers it heard from, how many messages."""

    producer_ids: frozenset[str]
    message_count: int


@dataclass(frozen=True, slots=True)
class Processed:
    """One delivery a `TestConsumer` processed (and confirmed)."""

    producer_id: str
    seq_nr: int
    message: Any


class Recorder:
    """Shared by the test thread and the kit actors of one test; thread-safe.

    Actors report with the ``add_*`` methods and `violation`; the test waits with
    `wait_until` (or `wait_collected`, `wait_replies`), which fails at once on a violation
    and, on timeout, with a summary of everything reported so far.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.processed: dict[str, list[Processed]] = defaultdict(list)
        self.collected: dict[str, Collected] = {}
        self.sent: dict[str, int] = defaultdict(int)
        self.replies: dict[str, list[int]] = defaultdict(list)
        self.violations: list[str] = []

    # Reports, from the actors' threads.

    def add_processed(self, consumer: str, processed: Processed) -> None:
        with self._cond:
            self.processed[consumer].append(processed)
            self._cond.notify_all()

    def add_collected(self, consumer: str, collected: Collected) -> None:
        with self._cond:
            self.collected[consumer] = collected
            self._cond.notify_all()

    def add_sent(self, producer: str) -> None:
        with self._cond:
            self.sent[producer] += 1

    def add_reply(self, producer: str, seq_nr: int) -> None:
        with self._cond:
            self.replies[producer].append(seq_nr)
            self._cond.notify_all()

    def violation(self, text: str) -> None:
        logger.error("Violation: %s", text)
        with self._cond:
            self.violations.append(text)
            self._cond.notify_all()

    # Waits and checks, from the test thread.

    def wait_until(
        self,
        condition: Callable[[], bool],
        what: str,
        timeout: float = DEFAULT_WAIT,
        context: str | Callable[[], str] = "",
    ) -> None:
        """Wait until ``condition()`` holds (checked under the recorder's lock).

        Raises:
            AssertionError: a violation was reported (at once), or ``timeout`` seconds
                passed; the message names ``what`` and shows everything reported so far,
                plus ``context`` (a callable is called only on failure).
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self.violations:
                    headline = f"violation while waiting for {what}"
                    break
                if condition():
                    return
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    headline = f"{what}: not within {timeout} s"
                    break
                self._cond.wait(remaining)
        extra = context() if callable(context) else context  # outside the lock: it may ask actors
        raise AssertionError(self._failure(headline, extra))

    def wait_collected(
        self,
        consumer: str,
        timeout: float = DEFAULT_WAIT,
        context: str | Callable[[], str] = "",
    ) -> Collected:
        """Wait for ``consumer``'s `Collected` (Pekko's ``consumerEndProbe.receiveMessage``)."""
        self.wait_until(
            lambda: consumer in self.collected, f"Collected from {consumer}", timeout, context
        )
        return self.collected[consumer]

    def wait_replies(self, producer: str, count: int, timeout: float = DEFAULT_WAIT) -> list[int]:
        """Wait until ``producer`` recorded ``count`` confirmed seq_nrs; returns all of them."""
        self.wait_until(
            lambda: len(self.replies[producer]) >= count,
            f"{count} confirmation replies to {producer}",
            timeout,
        )
        with self._cond:
            return list(self.replies[producer])

    def assert_no_violations(self) -> None:
        with self._cond:
            if self.violations:
                raise AssertionError(self._failure("violations reported"))

    def deliveries(self, consumer: str) -> list[tuple[Any, int]]:
        """``(message, seq_nr)`` of each delivery ``consumer`` processed, in order."""
        with self._cond:
            return [(p.message, p.seq_nr) for p in self.processed[consumer]]

    def summary(self) -> str:
        with self._cond:
            lines = []
            for consumer, processed in self.processed.items():
                tail = [(p.producer_id, p.seq_nr, p.message) for p in processed[-5:]]
                lines.append(f"  {consumer} processed {len(processed)}, last {tail}")
            lines += [f"  {name} collected {c}" for name, c in self.collected.items()]
            lines += [f"  {name} sent {n} messages" for name, n in self.sent.items()]
            lines += [
                f"  {name} got {len(r)} replies, last {r[-5:]}" for name, r in self.replies.items()
            ]
            lines += [f"  violation: {v}" for v in self.violations]
            return "\n".join(lines) or "  nothing reported"

    def _failure(self, headline: str, extra: str = "") -> str:
        text = f"{headline}\nreported so far:\n{self.summary()}"
        return f"{text}\n{extra}" if extra else text


def describe_controller(ref: pykka.ActorRef[Any]) -> str:
    """Best-effort snapshot and statistics of a controller actor, for failure messages."""
    try:
        proxy = ref.proxy()
        snapshot = proxy.snapshot().get(timeout=1)
        stats = proxy.statistics().get(timeout=1)
    except Exception as error:  # dead, or stuck: say so rather than hide the real failure
        return f"{ref}: no snapshot ({type(error).__name__})"
    return f"{ref}:\n    {snapshot}\n    {stats}"


# --- what the tests expect -------------------------------------------------------------


def last_chunk_seq_nrs(payloads: Iterable[str], chunk_size: int) -> list[int]:
    """The seq_nr each payload's `Delivery` carries in a session starting at seq_nr 1.

    Unchunked, one seq_nr per message. With chunking every piece takes a seq_nr and a
    `Delivery` carries its last piece's (a string is cut as its UTF-8 bytes).
    """
    seq_nrs = []
    seq_nr = 0
    for payload in payloads:
        seq_nr += math.ceil(len(payload.encode()) / chunk_size) if chunk_size else 1
        seq_nrs.append(seq_nr)
    return seq_nrs


def messages_until(end_seq_nr: int, chunk_size: int) -> list[tuple[str, int]]:
    """``(msg-n, seq_nr)`` for msg-1, msg-2, ... up to the first whose seq_nr reaches
    ``end_seq_nr``: what a `TestConsumer` ending there processes when nothing is lost."""
    plan: list[tuple[str, int]] = []
    n = 0
    while not plan or plan[-1][1] < end_seq_nr:
        n += 1
        payloads = [f"msg-{i}" for i in range(1, n + 1)]
        plan = list(zip(payloads, last_chunk_seq_nrs(payloads, chunk_size), strict=True))
    return plan


# --- refs ------------------------------------------------------------------------------


class BlockingProbe:
    """A ref that queues what it is told; the test takes messages out with bounded waits."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._queue: queue.Queue[Any] = queue.Queue()

    def __repr__(self) -> str:
        return f"BlockingProbe({self.name})"

    def tell(self, message: Any) -> None:
        self._queue.put(message)

    def receive(self, timeout: float = DEFAULT_WAIT) -> Any:
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            msg = f"{self.name}: no message within {timeout} s"
            raise AssertionError(msg) from None

    def expect_type(self, cls: type[T], timeout: float = DEFAULT_WAIT) -> T:
        got = self.receive(timeout)
        assert isinstance(got, cls), f"{self.name}: expected a {cls.__name__}, got {got!r}"
        return got


class TapRef:
    """Forwards everything to ``target`` and records the messages of ``types`` in ``seen``.

    Equality and hashing follow ``target``, like `LossyRef`'s.
    """

    def __init__(self, target: Ref, types: tuple[type, ...] = (object,)) -> None:
        self.target = target
        self.types = types
        self._lock = threading.Lock()
        self._seen: list[Any] = []

    def __repr__(self) -> str:
        return f"TapRef({self.target!r})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TapRef):
            return bool(self.target == other.target)
        return bool(self.target == other)

    def __hash__(self) -> int:
        return hash(self.target)

    @property
    def seen(self) -> list[Any]:
        with self._lock:
            return list(self._seen)

    def tell(self, message: Any) -> None:
        if isinstance(message, self.types):
            with self._lock:
                self._seen.append(message)
        self.target.tell(message)


def _tell_quietly(ref: Ref, message: Any) -> None:
    """Tell, ignoring a stopped target: the test may be over and its actors stopped."""
    with contextlib.suppress(pykka.ActorDeadError):
        ref.tell(message)


def _tell_later(delay: float, ref: Ref, message: Any) -> None:
    """Tell ``message`` after ``delay`` seconds, from the timer thread (pykka has no timers)."""
    default_timer_service().call_later(delay, lambda: _tell_quietly(ref, message))


class _Adapter:
    """A ref that wraps what it is told in ``wrap`` for ``ref`` (Akka's message adapter)."""

    __slots__ = ("_ref", "_wrap")

    def __init__(self, ref: Ref, wrap: Callable[[Any], Any]) -> None:
        self._ref = ref
        self._wrap = wrap

    def tell(self, message: Any) -> None:
        self._ref.tell(self._wrap(message))


# --- the actors ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Process:
    """`TestConsumer`'s own message: now process (and confirm) this delivery."""

    delivery: Delivery


@dataclass(frozen=True, slots=True)
class _Tick:
    """A producer's own message: the delay since the held `RequestNext` is over."""


@dataclass(frozen=True, slots=True)
class _Confirmed:
    """`TestProducerWithAsk`'s own message: the producer controller confirmed ``seq_nr``."""

    seq_nr: int


class TestConsumer(pykka.ThreadingActor):
    """Pekko's ``TestConsumer``: confirms every delivery and stops at the end seq_nr.

    Args:
        controller: the consumer controller to register with (`ConsumerStart`).
        recorder: where processed deliveries, `Collected` and violations go.
        name: this consumer's key in ``recorder``.
        end_seq_nr: stop after processing a delivery with a seq_nr at least this.
        delay: confirm this many seconds after the delivery arrives (0: at once, through
            the inbox, as the original's "async job").
    """

    __test__ = False  # not a pytest test class
    use_daemon_thread = True

    def __init__(
        self,
        controller: Ref,
        recorder: Recorder,
        *,
        name: str,
        end_seq_nr: int,
        delay: float = 0.0,
    ) -> None:
        super().__init__()
        self._controller = controller
        self._recorder = recorder
        self._name = name
        self._end_seq_nr = end_seq_nr
        self._delay = delay
        self._processed: set[tuple[str, int]] = set()
        self._count = 0
        self._ended = False

    def on_start(self) -> None:
        self._controller.tell(ConsumerStart(self.actor_ref))

    def on_receive(self, message: Any) -> None:
        if self._ended:
            return  # stopping: Akka's would already be stopped, so this is a dead letter
        if type(message) is Delivery:
            job = _Process(message)
            if self._delay:
                _tell_later(self._delay, self.actor_ref, job)
            else:
                self.actor_ref.tell(job)
        elif type(message) is _Process:
            self._process(message.delivery)
        else:
            self._recorder.violation(f"{self._name} got unexpected {message!r}")

    def _process(self, delivery: Delivery) -> None:
        producer_id, seq_nr = key = (delivery.producer_id, delivery.seq_nr)
        if seq_nr == 1:  # a replaced producer starts again from 1
            self._processed = {p for p in self._processed if p[0] != producer_id}
        if key in self._processed:
            # The original throws, which stops the consumer (and then its controller).
            self._recorder.violation(f"{self._name} received duplicate {key}")
            self._end()
            return
        self._processed.add(key)
        self._count += 1
        self._recorder.add_processed(self._name, Processed(producer_id, seq_nr, delivery.message))
        _tell_quietly(delivery.confirm_to, CONFIRMED)
        if seq_nr >= self._end_seq_nr:
            producer_ids = frozenset(p for p, _ in self._processed)
            self._recorder.add_collected(self._name, Collected(producer_ids, self._count))
            self._end()

    def _end(self) -> None:
        self._ended = True
        self.stop()


class TestProducer(pykka.ThreadingActor):
    """Pekko's ``TestProducer``: sends ``msg-1``, ``msg-2``, ... one per `RequestNext`.

    Args:
        controller: the producer controller to register with (`ProducerStart`).
        recorder: counts what is sent; gets violations.
        name: this producer's key in ``recorder``.
        delay: 0 sends on each `RequestNext` at once (a fast producer); otherwise the
            `RequestNext` is held and the message sent one tick of ``delay`` later.
    """

    __test__ = False
    use_daemon_thread = True

    def __init__(
        self, controller: Ref, recorder: Recorder, *, name: str, delay: float = 0.0
    ) -> None:
        super().__init__()
        self._controller = controller
        self._recorder = recorder
        self._name = name
        self._delay = delay
        self._n = 0
        self._held: RequestNext | None = None

    def on_start(self) -> None:
        self._controller.tell(ProducerStart(self.actor_ref))

    def on_receive(self, message: Any) -> None:
        if type(message) is RequestNext:
            if self._held is not None:
                self._recorder.violation(
                    f"{self._name} got {message!r} while already holding {self._held!r}"
                )
            elif self._delay:
                self._held = message
                _tell_later(self._delay, self.actor_ref, _Tick())
            else:
                self._send(message)
        elif type(message) is _Tick:
            if self._held is not None:
                held, self._held = self._held, None
                self._send(held)
        else:
            self._on_other(message)

    def _on_other(self, message: Any) -> None:
        self._recorder.violation(f"{self._name} got unexpected {message!r}")

    def _send(self, request_next: RequestNext) -> None:
        self._n += 1
        self._recorder.add_sent(self._name)
        _tell_quietly(request_next.send_next_to, f"msg-{self._n}")


class TestProducerWithAsk(TestProducer):
    """Pekko's ``TestProducerWithAsk``: sends with `MessageWithConfirmation` and records
    each seq_nr the producer controller confirms (``recorder.replies[name]``)."""

    __test__ = False

    def __init__(
        self, controller: Ref, recorder: Recorder, *, name: str, delay: float = 0.0
    ) -> None:
        super().__init__(controller, recorder, name=name, delay=delay)
        self._replies = _Adapter(self.actor_ref, _Confirmed)

    def _on_other(self, message: Any) -> None:
        if type(message) is _Confirmed:
            self._recorder.add_reply(self._name, message.seq_nr)
        else:
            super()._on_other(message)

    def _send(self, request_next: RequestNext) -> None:
        self._n += 1
        self._recorder.add_sent(self._name)
        ask = MessageWithConfirmation(f"msg-{self._n}", self._replies)
        _tell_quietly(request_next.ask_next_to, ask)
