"""What only the asyncio handles, `AsyncProducer` and `AsyncConsumer`, have.

Every scenario that holds for both flavours is in test_handle_scenarios.py or
test_handle_streams.py. Here are the asyncio handles' own rules and races: the thread they
must be called on, a second receiving task, a confirmation made on a worker thread, the
wake-ups of a loop by other threads (lost ones, and how many), and a stream between an
asyncio handle and a blocking one.

Each test is a coroutine run by pytest-asyncio in its own event loop; the handles are
created inside it. Where the other side is a blocking handle, it runs on its own (daemon)
thread. Every wait is bounded by `WAIT` (``asyncio.timeout`` on the loop,
``join``/``Event.wait`` on threads); no test asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pykka_delivery import (
    Consumer,
    ConsumerControllerSettings,
    Delivery,
    LocalProtocolError,
    Producer,
    ProducerControllerSettings,
    Ref,
)
from pykka_delivery.delivery.handles.async_consumer import AsyncConsumer
from pykka_delivery.delivery.handles.async_producer import AsyncProducer
from pykka_delivery.delivery.timers import TimerService
from pykka_delivery.protocol.messages import Ack, Request
from tests.delivery.handles.flavours import FAST_RETRY, NO_RETRY, WAIT, DropOnce, in_thread


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-async-handles-timers")
    yield service
    service.shutdown()


# --- helpers -----------------------------------------------------------------------


async def settle() -> None:
    """Let every task that is ready run (all in this loop: no time involved)."""
    for _ in range(10):
        await asyncio.sleep(0)


class AsyncReader:
    """Iterates an `AsyncConsumer` in a task of this loop, confirming each delivery at once.

    `wait` returns once ``expected`` deliveries arrived; iteration goes on (so the consumer
    keeps sending its retries) until the consumer is closed or stopped.
    """

    def __init__(self, consumer: AsyncConsumer, expected: int) -> None:
        self.consumer = consumer
        self.expected = expected
        self.deliveries: list[Delivery] = []
        self.arrived = asyncio.Event()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for delivery in self.consumer:
                self.deliveries.append(delivery)
                delivery.confirm()
                if len(self.deliveries) >= self.expected:
                    self.arrived.set()
        finally:
            self.arrived.set()

    @property
    def messages(self) -> list[Any]:
        return [d.message for d in self.deliveries]

    async def wait(self) -> list[Any]:
        async with asyncio.timeout(WAIT):
            await self.arrived.wait()
        if self.task.done():
            self.task.result()  # raises what the reader raised
        assert len(self.deliveries) >= self.expected, f"only {len(self.deliveries)} arrived"
        return self.messages

    async def close(self) -> None:
        """Close the consumer; the iteration must end without error."""
        self.consumer.close()
        async with asyncio.timeout(WAIT):
            await self.task


class ThreadReader:
    """Iterates a blocking `Consumer` on its own thread, confirming each delivery at once."""

    def __init__(self, consumer: Consumer, expected: int) -> None:
        self.consumer = consumer
        self.expected = expected
        self.messages: list[Any] = []
        self.arrived = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="reader", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for delivery in self.consumer:
                self.messages.append(delivery.message)
                delivery.confirm()
                if len(self.messages) >= self.expected:
                    self.arrived.set()
        except BaseException as error:
            self.error = error
            raise
        finally:
            self.arrived.set()

    async def wait(self) -> list[Any]:
        assert await asyncio.to_thread(self.arrived.wait, WAIT), f"got {len(self.messages)}"
        assert self.error is None, f"reader failed: {self.error!r}"
        return self.messages

    async def close(self) -> None:
        self.consumer.close()
        await asyncio.to_thread(self.thread.join, WAIT)
        assert not self.thread.is_alive(), "iteration did not end after close()"
        assert self.error is None, f"reader failed: {self.error!r}"


async def join(thread: threading.Thread) -> None:
    await asyncio.to_thread(thread.join, WAIT)
    assert not thread.is_alive(), f"{thread.name} did not finish"


async def receive_and_confirm(consumer: AsyncConsumer, count: int) -> list[Any]:
    messages = []
    for _ in range(count):
        delivery = await consumer.receive(timeout=WAIT)
        messages.append(delivery.message)
        delivery.confirm()
    return messages


def connected(
    timers: TimerService,
    producer_settings: ProducerControllerSettings | None = None,
    consumer_settings: ConsumerControllerSettings | None = NO_RETRY,
) -> tuple[AsyncProducer, AsyncConsumer]:
    producer = AsyncProducer("p-1", producer_settings, timer_service=timers)
    consumer = AsyncConsumer(consumer_settings, timer_service=timers)
    consumer.register_to(producer.ref)
    return producer, consumer


# --- interoperation with a blocking handle ----------------------------------------


async def test_an_async_producer_delivers_to_a_blocking_consumer_on_another_thread(
    timers: TimerService,
) -> None:
    p = AsyncProducer("p-1", timer_service=timers)
    c = Consumer(FAST_RETRY, timer_service=timers)
    p.register_consumer(c.ref)
    reader = ThreadReader(c, 1000)

    for i in range(1000):
        await p.send(i, timeout=WAIT)

    assert await reader.wait() == list(range(1000))
    await reader.close()
    await p.wait_confirmed(timeout=WAIT)
    assert p.snapshot().confirmed_seq_nr == 1000


async def test_a_blocking_producer_on_another_thread_delivers_to_an_async_consumer(
    timers: TimerService,
) -> None:
    p = Producer("p-1", timer_service=timers)
    c = AsyncConsumer(FAST_RETRY, timer_service=timers)
    c.register_to(p.ref)
    reader = AsyncReader(c, 1000)

    sender, outcome = in_thread(lambda: [p.send(i, timeout=WAIT) for i in range(1000)], "sender")

    assert await reader.wait() == list(range(1000))
    assert [d.seq_nr for d in reader.deliveries] == list(range(1, 1001))
    await join(sender)
    assert outcome == {"result": list(range(1, 1001))}
    await reader.close()
    await asyncio.to_thread(p.wait_confirmed, WAIT)


# --- AsyncConsumer: the loop's thread, one receiving task -------------------------


async def test_a_delivery_confirmed_on_a_worker_thread_lets_the_next_receive_go_on(
    timers: TimerService,
) -> None:
    p, c = connected(timers)
    for i in range(3):
        await p.send(i, timeout=WAIT)
        if i == 0:
            await receive_and_confirm(c, 1)

    got = [0]
    for _ in range(2):
        delivery = await c.receive(timeout=WAIT)
        got.append(delivery.message)
        await asyncio.to_thread(delivery.confirm)  # handed to the loop before to_thread ends
        with pytest.raises(LocalProtocolError):
            await asyncio.to_thread(delivery.confirm)  # still refused on a second thread

    assert got == [0, 1, 2]
    assert c.snapshot().confirmed_seq_nr == 3


async def test_calling_a_handle_from_another_thread_raises_runtime_error(
    timers: TimerService,
) -> None:
    p, c = connected(timers)

    with pytest.raises(RuntimeError, match="event loop"):
        await asyncio.to_thread(c.receive_nowait)
    with pytest.raises(RuntimeError, match="event loop"):
        await asyncio.to_thread(p.send_nowait, "a")
    assert p.snapshot().current_seq_nr == 1


async def test_a_second_task_receiving_while_one_waits_raises_local_protocol_error(
    timers: TimerService,
) -> None:
    p, c = connected(timers)
    first = asyncio.create_task(c.receive(timeout=WAIT))
    await settle()

    with pytest.raises(LocalProtocolError, match="another task"):
        await c.receive(timeout=WAIT)

    await p.send("a", timeout=WAIT)
    async with asyncio.timeout(WAIT):
        assert (await first).message == "a"


# --- an idle producer, a blocking consumer on a thread -----------------------------


async def test_an_idle_async_producer_answers_the_retry_of_a_blocking_consumer_on_a_thread(
    timers: TimerService,
) -> None:
    # The retry Request arrives on the consumer's thread: the idle producer must have
    # its processing scheduled on the loop, with no producer call to do it.
    p = AsyncProducer("p-1", timer_service=timers)
    c = Consumer(FAST_RETRY, timer_service=timers)
    link = DropOnce(c.ref, seq_nr=10)
    p.register_consumer(link)
    reader = ThreadReader(c, 10)
    await p.send(0, timeout=WAIT)
    await p.wait_confirmed(timeout=WAIT)
    for i in range(1, 10):
        await p.send(i, timeout=WAIT)
    # From here no task calls the producer; the loop only waits for the reader.

    assert await reader.wait() == list(range(10))
    assert link.dropped
    assert link.resent_on, "the last message arrived without being resent"
    assert c.statistics().retries >= 1
    await reader.close()


# --- wake-ups ----------------------------------------------------------------------


async def test_a_request_arriving_from_a_thread_just_before_the_sender_parks_still_wakes_it(
    timers: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race is forced by an internal hook: the first demand check inside send lets the
    # blocking consumer's Request arrive from its thread while the send is running (so the
    # arrival leaves it to the send) and before the send parks. The send must find it
    # before parking; nothing else would wake it.
    p = AsyncProducer("p-1", timer_service=timers)
    c = Consumer(NO_RETRY, timer_service=timers)
    p.register_consumer(c.ref)
    await p.send(0, timeout=WAIT)
    await asyncio.to_thread(lambda: c.receive(timeout=WAIT).confirm())
    await p.wait_confirmed(timeout=WAIT)  # the window is open up to 50
    for i in range(1, 50):
        await p.send(i, timeout=WAIT)
    assert (p.snapshot().current_seq_nr, p.snapshot().requested_seq_nr) == (51, 50)  # no demand

    forced = threading.Event()
    has_demand = p._has_demand

    def demand_check() -> bool:
        if not forced.is_set():
            forced.set()
            # 25 confirmed: the consumer sends Request(25, 75) from its own thread.
            replier, outcome = in_thread(
                lambda: [c.receive(timeout=WAIT).confirm() for _ in range(25)], "consumer"
            )
            replier.join(WAIT)
            assert outcome == {"result": [None] * 25}
        return has_demand()

    monkeypatch.setattr(p, "_has_demand", demand_check)

    assert await p.send(50, timeout=WAIT) == 51
    assert forced.is_set()


async def test_a_request_arriving_from_a_thread_while_a_send_runs_is_processed_before_it_returns(
    timers: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An arrival from another thread while a producer call runs on the loop is left to
    # that call (nothing is scheduled): the call must process it before it returns, or it
    # waits for whatever arrives next. Forced by an internal hook on the send's effects.
    told: list[Any] = []

    class Sink:
        def tell(self, message: Any) -> None:
            told.append(message)

    p = AsyncProducer("p-1", timer_service=timers)
    p.register_consumer(Sink())
    run = p._run
    forced = threading.Event()

    def run_effects(effects: list[Any]) -> None:
        run(effects)
        if not forced.is_set():
            forced.set()
            replier, _ = in_thread(lambda: p.ref.tell(Request(1, 50)), "consumer")
            replier.join(WAIT)

    monkeypatch.setattr(p, "_run", run_effects)

    assert await p.send("a", timeout=WAIT) == 1

    assert forced.is_set()
    assert (p.snapshot().confirmed_seq_nr, p.snapshot().requested_seq_nr) == (1, 50)
    assert [m.seq_nr for m in told] == [1]


async def test_a_message_arriving_from_a_thread_just_before_the_reader_parks_still_wakes_it(
    timers: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forced by an internal hook, as above: receive finds nothing, then the blocking
    # producer's message arrives from its thread before the reader announced that it
    # parks (so no wake-up is sent). The reader must find it before parking. (The
    # first-message resend, which would also wake it, is pushed out of the test.)
    p = Producer(
        "p-1", ProducerControllerSettings(resend_first_interval=60.0), timer_service=timers
    )
    c = AsyncConsumer(NO_RETRY, timer_service=timers)
    c.register_to(p.ref)
    forced = threading.Event()
    next_ready = c._next_ready

    def look() -> Delivery | None:
        delivery = next_ready()
        if delivery is None and not forced.is_set():
            forced.set()
            sender, outcome = in_thread(lambda: p.send("a", timeout=WAIT), "sender")
            sender.join(WAIT)
            assert outcome == {"result": 1}
        return delivery

    monkeypatch.setattr(c, "_next_ready", look)

    assert (await c.receive(timeout=WAIT)).message == "a"
    assert forced.is_set()


class CountingCalls:
    """Counts the loop's ``call_soon_threadsafe`` calls (installed with monkeypatch)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.calls = 0
        self._call = loop.call_soon_threadsafe

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self._call(*args, **kwargs)


class Batching:
    """A ref that holds what it is told until `flush` hands it on in one ``tell_many``,
    as a transport's reader does with a frame of envelopes."""

    def __init__(self, target: Any) -> None:
        self.target = target
        self.held: list[Any] = []

    def tell(self, message: Any) -> None:
        self.held.append(message)

    def flush(self) -> None:
        held, self.held = self.held, []
        self.target.tell_many(held)


async def test_a_batch_told_at_once_by_a_transport_thread_wakes_a_parked_consumer_once(
    timers: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    links: list[Batching] = []

    def batching(ref: Ref) -> Ref:
        links.append(Batching(ref))
        return links[0]

    p = Producer("p-1", timer_service=timers)
    c = AsyncConsumer(NO_RETRY, timer_service=timers, self_ref_factory=batching)
    c.register_to(p.ref)
    p.send(0, timeout=WAIT)  # the first message: it opens the window when received
    links[0].flush()
    assert await receive_and_confirm(c, 1) == [0]
    for i in range(1, 50):
        p.send(i, timeout=WAIT)  # held by the link
    reader = AsyncReader(c, 49)
    await settle()  # the reader is parked in receive
    counter = CountingCalls(asyncio.get_running_loop())
    monkeypatch.setattr(asyncio.get_running_loop(), "call_soon_threadsafe", counter)

    transport, _ = in_thread(links[0].flush, "transport")
    transport.join(WAIT)  # on the loop's thread: nothing else runs meanwhile
    woken = counter.calls
    assert await reader.wait() == list(range(1, 50))

    assert woken == 1
    await reader.close()


async def test_a_batch_told_at_once_by_a_transport_thread_is_processed_by_an_idle_producer_once(
    timers: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    told: list[Any] = []

    class Sink:
        def tell(self, message: Any) -> None:
            told.append(message)

    p = AsyncProducer("p-1", timer_service=timers)
    p.register_consumer(Sink())
    await p.send("a", timeout=WAIT)
    counter = CountingCalls(asyncio.get_running_loop())
    monkeypatch.setattr(asyncio.get_running_loop(), "call_soon_threadsafe", counter)

    endpoint: Any = p.ref
    transport, _ = in_thread(lambda: endpoint.tell_many([Request(0, 50), Ack(1)]), "transport")
    transport.join(WAIT)
    assert counter.calls == 1
    await settle()  # no producer call: only the scheduled processing can take them

    assert (p.snapshot().confirmed_seq_nr, p.snapshot().requested_seq_nr) == (1, 50)
    assert p.statistics().requests == 1
    assert p.statistics().acks == 1


async def test_a_producer_and_a_consumer_in_one_loop_exchange_a_stream_without_thread_hops(
    timers: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every message and every answer is told on the loop's thread: each is handled at
    # once, and none goes through call_soon_threadsafe. (No timer fires meanwhile: the
    # first-message resend is cancelled by the first confirmation, and retries wait 60 s.)
    counter = CountingCalls(asyncio.get_running_loop())
    monkeypatch.setattr(asyncio.get_running_loop(), "call_soon_threadsafe", counter)
    p, c = connected(timers)
    reader = AsyncReader(c, 1000)

    for i in range(1000):
        await p.send(i, timeout=WAIT)
    assert await reader.wait() == list(range(1000))
    await reader.close()
    await p.wait_confirmed(timeout=WAIT)

    assert counter.calls == 0


async def test_a_batch_from_a_blocking_producer_thread_costs_one_wake_up_not_one_per_message(
    timers: TimerService, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = asyncio.get_running_loop()
    counter = CountingCalls(loop)
    monkeypatch.setattr(loop, "call_soon_threadsafe", counter)
    count = 2000
    p = Producer("p-1", timer_service=timers)
    c = AsyncConsumer(NO_RETRY, timer_service=timers)  # no timer firings into the loop
    c.register_to(p.ref)
    sender, outcome = in_thread(lambda: [p.send(i, timeout=WAIT) for i in range(count)], "sender")

    got = []
    async with asyncio.timeout(WAIT):
        async for delivery in c:
            got.append(delivery.message)
            delivery.confirm()
            if len(got) == count:
                break
    woken = counter.calls  # before anything else (to_thread) uses call_soon_threadsafe

    await join(sender)
    assert "error" not in outcome, outcome
    assert got == list(range(count))
    # A wake-up is only sent to a reader parked in receive(), and only by the first
    # message arriving while it is parked: the rest of a batch is appended to the inbox
    # and taken by the same wake-up. The producer can only send what the window allows
    # (50, refilled by half a window per Request), so it sends in bursts of 25 to 50 and
    # the reader parks about once per burst: 40 to 80 wake-ups (40 measured). A wake-up
    # per message would be 2000; a fifth of that leaves room for shorter bursts on a
    # busy machine and still fails any per-message hop.
    assert woken < count // 5, f"{woken} wake-ups for {count} messages"
    c.close()
