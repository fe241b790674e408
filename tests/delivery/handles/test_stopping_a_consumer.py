"""Stopping a consumer loop from outside it (issue 19, "hooks users asked for").

The documented way (docs/delivery.md, "Stopping a consumer loop"): another thread calls
``consumer.close()``. A thread waiting in ``receive()`` (no timeout) or in a ``for`` loop
wakes at once: ``receive`` raises `ClosedError`, the loop ends. A delivery being handled
at that moment stays unconfirmed (its ``confirm()`` raises `ClosedError`) and goes to the
next consumer. From a signal handler, which runs on the thread that may be inside the
consumer, the close is started on a thread of its own. An `AsyncConsumer` is closed by
another task, or from another thread through ``loop.call_soon_threadsafe``.

Every wait is bounded: a thread that close did not wake is still alive after its join.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from pykka_delivery import (
    AsyncConsumer,
    AsyncProducer,
    ClosedError,
    Consumer,
    Producer,
)
from pykka_delivery.delivery.timers import TimerService
from tests.delivery.handles.flavours import BLOCKED, WAIT, in_thread


@pytest.fixture
def timers() -> Iterator[TimerService]:
    service = TimerService(name="test-stopping-timers")
    yield service
    service.shutdown()


def pair(timers: TimerService) -> tuple[Producer, Consumer]:
    producer = Producer("p-1", timer_service=timers)
    consumer = Consumer(timer_service=timers)
    consumer.register_to(producer.ref)
    return producer, consumer


def test_close_from_another_thread_wakes_a_receive_waiting_without_a_timeout(
    timers: TimerService,
) -> None:
    _, consumer = pair(timers)
    receiver, outcome = in_thread(consumer.receive, "receiver")
    receiver.join(BLOCKED)
    assert receiver.is_alive(), f"receive did not wait: {outcome}"

    consumer.close()

    receiver.join(WAIT)
    assert not receiver.is_alive(), "close did not wake the receiver"
    assert isinstance(outcome.get("error"), ClosedError)


def test_a_delivery_being_handled_when_another_thread_closes_goes_to_the_next_consumer(
    timers: TimerService,
) -> None:
    producer, consumer = pair(timers)
    producer.send("a", timeout=WAIT)
    handling, release = threading.Event(), threading.Event()

    def loop() -> str:
        for delivery in consumer:
            handling.set()
            release.wait(WAIT)
            try:
                delivery.confirm()
            except ClosedError:
                return "closed while handling"
        return "ended"

    worker, outcome = in_thread(loop, "worker")
    assert handling.wait(WAIT)

    consumer.close()
    release.set()

    worker.join(WAIT)
    assert outcome == {"result": "closed while handling"}
    successor = Consumer(timer_service=timers)
    producer.register_consumer(successor.ref)
    delivery = successor.receive(timeout=WAIT)
    assert (delivery.message, delivery.seq_nr) == ("a", 1)
    delivery.confirm()
    successor.close()
    producer.close()


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_the_documented_signal_recipe_stops_a_loop_on_the_main_thread() -> None:
    script = textwrap.dedent(
        """
        import signal, sys, threading
        from pykka_delivery import Consumer, ConsumerControllerSettings, Producer

        producer = Producer("p-1")
        # No retry on silence for a minute: only the close may wake the loop.
        quiet = ConsumerControllerSettings(resend_interval_min=60.0, resend_interval_max=60.0)
        consumer = Consumer(quiet)
        consumer.register_to(producer.ref)
        producer.send("a", timeout=10)

        def on_sigterm(signum, frame):
            # The handler runs on the main thread, which may be inside the consumer:
            # close it from a thread of its own.
            threading.Thread(target=consumer.close).start()

        signal.signal(signal.SIGTERM, on_sigterm)
        for delivery in consumer:
            delivery.confirm()
            print("ready", flush=True)
        print("stopped", flush=True)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "ready"

        process.send_signal(signal.SIGTERM)

        out, err = process.communicate(timeout=WAIT)
        assert process.returncode == 0, err
        assert out.strip() == "stopped"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# --- AsyncConsumer ----------------------------------------------------------------------


async def reading(consumer: AsyncConsumer, got: list[Any], first: asyncio.Event) -> str:
    async for delivery in consumer:
        got.append(delivery.message)
        delivery.confirm()
        first.set()
    return "ended"


async def test_another_task_closing_an_async_consumer_ends_its_async_for(
    timers: TimerService,
) -> None:
    producer = AsyncProducer("p-1", timer_service=timers)
    consumer = AsyncConsumer(timer_service=timers)
    consumer.register_to(producer.ref)
    got: list[Any] = []
    first = asyncio.Event()
    reader = asyncio.create_task(reading(consumer, got, first))
    await producer.send("a", timeout=WAIT)
    await asyncio.wait_for(first.wait(), WAIT)

    consumer.close()

    assert await asyncio.wait_for(reader, WAIT) == "ended"
    assert got == ["a"]
    producer.close()


async def test_another_thread_closes_an_async_consumer_through_call_soon_threadsafe(
    timers: TimerService,
) -> None:
    consumer = AsyncConsumer(timer_service=timers)
    reader = asyncio.create_task(reading(consumer, [], asyncio.Event()))
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    closer = threading.Thread(target=lambda: loop.call_soon_threadsafe(consumer.close))

    closer.start()

    assert await asyncio.wait_for(reader, WAIT) == "ended"
    closer.join(WAIT)


async def test_an_async_consumer_closed_directly_from_another_thread_names_the_way(
    timers: TimerService,
) -> None:
    consumer = AsyncConsumer(timer_service=timers)

    closer, outcome = in_thread(consumer.close, "closer")
    closer.join(WAIT)

    assert isinstance(outcome.get("error"), RuntimeError)
    assert "call_soon_threadsafe" in str(outcome["error"])
    consumer.close()
