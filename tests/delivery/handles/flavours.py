"""Both handle flavours behind one blocking-looking test API, and the helpers their tests share.

A scenario that holds for the blocking handles (`Producer` / `Consumer`) and for the asyncio
ones (`AsyncProducer` / `AsyncConsumer`) is written once, taking the `flavour` fixture
(parametrised ``sync`` / ``asyncio``, as pykka runs its suite over each runtime):

* `Blocking` makes the blocking handles themselves.
* `Asyncio` runs an event loop on a thread of its own, creates its handles there, and wraps
  each in `OnLoop`: a method called on the wrapper runs on the loop (awaited there if it is
  a coroutine) while the calling thread waits for its result. A `Delivery` it returns is
  wrapped too, so that ``confirm()`` runs on the loop as it does in asyncio code.

Nothing here knows what a handle does: the wrappers only call its public API.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pykka_delivery import (
    Consumer,
    ConsumerControllerSettings,
    Delivery,
    Producer,
    ProducerControllerSettings,
    Ref,
)
from pykka_delivery.delivery.handles.async_consumer import AsyncConsumer
from pykka_delivery.delivery.handles.async_producer import AsyncProducer
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import SequencedMessage

WAIT = 10.0  # bound on every wait that is expected to succeed
# The timeout of a call made on a helper thread that the test expects to be woken: longer
# than WAIT, so that a call which is not woken (and only returns at its timeout) fails.
LONG = 3 * WAIT
BLOCKED = 0.1  # how long a thread that should be blocked is given to (wrongly) finish
# How long the asyncio flavour waits for one call on its loop: longer than any call a test
# makes (a reader waits in receive for the whole test), shorter than pytest's timeout.
CALL_BOUND = 90.0

FAST_RETRY = ConsumerControllerSettings(
    resend_interval_min=0.02, resend_interval_max=0.1
)  # the consumer's retries on silence come quickly
# Window 50 (Akka's): the scenarios that count a window were written for it.
NO_RETRY = ConsumerControllerSettings(
    flow_control_window=50, resend_interval_min=60.0, resend_interval_max=60.0
)


# --- the flavours --------------------------------------------------------------------


class Blocking:
    """The blocking handles, as they are."""

    def __init__(self, timers: TimerService) -> None:
        self.timers = timers

    def producer(
        self,
        producer_id: str = "p-1",
        settings: ProducerControllerSettings | None = None,
        **options: Any,
    ) -> Any:
        return Producer(producer_id, settings, timer_service=self.timers, **options)

    def consumer(self, settings: ConsumerControllerSettings | None = None, **options: Any) -> Any:
        return Consumer(settings, timer_service=self.timers, **options)

    def settle(self) -> None:
        """Nothing to wait for: what another thread tells a blocking handle is processed
        before its ``tell`` returns, or by the call in progress."""

    def close(self) -> None:
        pass


class Asyncio:
    """The asyncio handles, on a loop run by a thread of this flavour."""

    def __init__(self, timers: TimerService) -> None:
        self.timers = timers
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="asyncio-flavour-loop", daemon=True
        )
        self._thread.start()

    def producer(
        self,
        producer_id: str = "p-1",
        settings: ProducerControllerSettings | None = None,
        **options: Any,
    ) -> Any:
        handle = self.call(
            AsyncProducer, producer_id, settings, timer_service=self.timers, **options
        )
        return OnLoop(handle, self)

    def consumer(self, settings: ConsumerControllerSettings | None = None, **options: Any) -> Any:
        return OnLoop(
            self.call(AsyncConsumer, settings, timer_service=self.timers, **options), self
        )

    def call(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``function(*args, **kwargs)`` run on the loop, awaited there if it is awaitable;
        its result (a `Delivery` wrapped in `OnLoop`), or what it raised."""

        async def step() -> Any:
            result = function(*args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        future = asyncio.run_coroutine_threadsafe(step(), self.loop)
        try:
            result = future.result(CALL_BOUND)
        except TimeoutError:
            if future.done():
                raise  # the call's own timeout (DeliveryTimeout is a TimeoutError)
            future.cancel()
            msg = f"{function!r} still ran on the loop after {CALL_BOUND} s"
            raise AssertionError(msg) from None
        return OnLoop(result, self) if isinstance(result, Delivery) else result

    def settle(self) -> None:
        """Let the loop run what other threads handed to it (as asyncio tests ``await
        asyncio.sleep(0)`` a few times): processing scheduled by an arrival, a wake-up."""

        async def turns() -> None:
            for _ in range(10):
                await asyncio.sleep(0)

        self.call(turns)

    def close(self) -> None:
        """Cancel what still runs on the loop (a reader a failed test left), then stop it."""

        async def cancel_the_rest() -> None:
            rest = asyncio.all_tasks() - {asyncio.current_task()}
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

        self.call(cancel_the_rest)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(WAIT)
        self.loop.close()


class OnLoop:
    """An asyncio handle, or a delivery it gave, used through the blocking API from any
    thread: each method runs on the loop, and the calling thread waits for its result."""

    __slots__ = ("_flavour", "_target")

    def __init__(self, target: Any, flavour: Asyncio) -> None:
        self._target = target
        self._flavour = flavour

    def __repr__(self) -> str:
        return f"OnLoop({self._target!r})"

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        if not callable(value):
            return value  # ref, message, seq_nr, ...
        return functools.partial(self._flavour.call, value)

    def __iter__(self) -> Iterator[Any]:
        """``async for``, one step per call."""
        iterator = self._flavour.call(self._target.__aiter__)
        while True:
            try:
                yield self._flavour.call(iterator.__anext__)
            except StopAsyncIteration:
                return

    def __enter__(self) -> OnLoop:
        self._flavour.call(self._target.__aenter__)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._flavour.call(self._target.__aexit__, *exc_info)


Flavour = Blocking | Asyncio


@pytest.fixture(params=["sync", "asyncio"])
def flavour(request: pytest.FixtureRequest) -> Iterator[Flavour]:
    """Each flavour with its own `TimerService`, shut down (and the loop stopped) after."""
    timers = TimerService(name=f"test-{request.param}-handles-timers")
    made: Flavour = Blocking(timers) if request.param == "sync" else Asyncio(timers)
    try:
        yield made
    finally:
        timers.shutdown()
        made.close()


# --- helpers for tests of either flavour ---------------------------------------------


def connected(
    flavour: Flavour,
    producer_settings: ProducerControllerSettings | None = None,
    consumer_settings: ConsumerControllerSettings | None = NO_RETRY,
) -> tuple[Any, Any]:
    producer = flavour.producer("p-1", producer_settings)
    consumer = flavour.consumer(consumer_settings)
    consumer.register_to(producer.ref)
    return producer, consumer


def in_thread(target: Callable[[], Any], name: str = "caller") -> tuple[threading.Thread, dict]:
    """Run ``target`` on a daemon thread; the dict gets ``result`` or ``error``."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = target()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, outcome


def receive_and_confirm(consumer: Any, count: int) -> list[Any]:
    """On the calling thread: receive and confirm ``count`` deliveries."""
    messages = []
    for _ in range(count):
        delivery = consumer.receive(timeout=WAIT)
        messages.append(delivery.message)
        delivery.confirm()
    return messages


class Reader:
    """Iterates a consumer (of either flavour) on its own thread, confirming each delivery
    at once.

    ``arrived`` is set once ``expected`` deliveries arrived (or, given ``last``, once the
    message ``last`` arrived); iteration goes on (so the consumer keeps sending its
    retries) until the consumer is closed or stopped.
    """

    def __init__(
        self, consumer: Any, expected: int | None = None, *, last: Any = None, name: str = "reader"
    ) -> None:
        self.consumer = consumer
        self.expected = expected
        self.last = last
        self.deliveries: list[Any] = []
        self.arrived = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for delivery in self.consumer:
                self.deliveries.append(delivery)
                delivery.confirm()
                if (
                    len(self.deliveries) >= self.expected
                    if self.expected is not None
                    else delivery.message == self.last
                ):
                    self.arrived.set()
        except BaseException as error:
            self.error = error
            raise
        finally:
            self.arrived.set()

    @property
    def messages(self) -> list[Any]:
        return [d.message for d in self.deliveries]

    def wait(self) -> list[Any]:
        """The messages, once ``expected`` arrived (fails if not within `WAIT`)."""
        assert self.arrived.wait(WAIT), f"only {len(self.deliveries)} arrived: {self.messages[-5:]}"
        assert self.error is None, f"reader failed: {self.error!r}"
        return self.messages

    def is_waiting(self) -> bool:
        """Still iterating after `BLOCKED` seconds: waiting for the next delivery."""
        self.thread.join(BLOCKED)
        return self.thread.is_alive()

    def ended(self) -> None:
        """The iteration must end (without error) within `WAIT`."""
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "iteration did not end"
        assert self.error is None, f"reader failed: {self.error!r}"

    def close(self) -> None:
        """Close the consumer; the iteration must end."""
        self.consumer.close()
        self.ended()


class DropOnce:
    """Passes everything to ``target`` but the first `SequencedMessage` with ``seq_nr``;
    records on which thread each later copy of it was told."""

    def __init__(self, target: Ref, seq_nr: int) -> None:
        self.target = target
        self.seq_nr = seq_nr
        self.dropped = False
        self.resent_on: list[threading.Thread] = []

    def tell(self, message: Any) -> None:
        if type(message) is SequencedMessage and message.seq_nr == self.seq_nr:
            if not self.dropped:
                self.dropped = True
                return
            self.resent_on.append(threading.current_thread())
        self.target.tell(message)
