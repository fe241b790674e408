"""`CoordinatedConsumer` against a real `CoordinatorServer`: its ``on_activated`` /
``on_deactivated`` hooks, and `close` from another thread ending a consuming loop.

Each consumer iterates on a thread of its own. Hooks record into one `Journal`, so the
order of events across consumers is checked; threads meet through events with bounded
waits.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pykka_delivery import Producer
from pykka_delivery.coordinator import (
    ActivationInterval,
    CoordinatedConsumer,
    CoordinatorClient,
    CoordinatorServer,
)
from pykka_delivery.errors import ClosedError
from pykka_delivery.protocol.messages import Ref
from tests.coordinator.servers import Clients, served

WAIT = 10.0
GROUP = ("test", "orders", "billing")


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    with served() as server:
        yield server


@pytest.fixture
def connect(server: CoordinatorServer) -> Iterator[Callable[[], CoordinatorClient]]:
    opener = Clients(server)
    yield opener
    opener.close_all()


class NoProducer:
    """A producer ref that never sends: its consumers wait for a message for ever."""

    def tell(self, message: object) -> None:
        pass


class Journal:
    """Hook calls, in the order they happened, with the thread that made each."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: list[tuple[str, str, ActivationInterval, str]] = []
        self.changed = threading.Condition(self.lock)

    def hooks(self, name: str) -> dict[str, Callable[[ActivationInterval], None]]:
        def record(what: str) -> Callable[[ActivationInterval], None]:
            def hook(interval: ActivationInterval) -> None:
                with self.lock:
                    entry = (name, what, interval, threading.current_thread().name)
                    self.entries.append(entry)
                    self.changed.notify_all()

            return hook

        return {"on_activated": record("activated"), "on_deactivated": record("deactivated")}

    def events(self) -> list[tuple[str, str]]:
        with self.lock:
            return [(name, what) for name, what, _, _ in self.entries]

    def wait_for(self, name: str, what: str) -> tuple[ActivationInterval, str]:
        with self.lock:
            found = self.changed.wait_for(
                lambda: [e for e in self.entries if e[:2] == (name, what)], WAIT
            )
            if not found:
                pytest.fail(f"no {what} hook of {name} within {WAIT} s: {self.entries}")
            _, _, interval, thread = found[0]
            return interval, thread


class Loop:
    """``for delivery in consumer:`` on a thread named ``name``, confirming each."""

    def __init__(self, name: str, consumer: CoordinatedConsumer) -> None:
        self.consumer = consumer
        self.received: list[Any] = []
        self.confirmed = threading.Semaphore(0)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for delivery in self.consumer:
            self.received.append(delivery.message)
            delivery.confirm()
            self.confirmed.release()

    def ended(self) -> bool:
        self.thread.join(WAIT)
        return not self.thread.is_alive()


def consumer(
    client: CoordinatorClient, producer: Ref | None = None, **hooks: Any
) -> CoordinatedConsumer:
    return CoordinatedConsumer(client, *GROUP, producer or NoProducer(), **hooks)


def test_the_next_consumer_is_activated_after_the_first_closes_and_is_deactivated(
    connect: Callable[[], CoordinatorClient],
) -> None:
    journal = Journal()
    first = consumer(connect(), **journal.hooks("first"))
    second = consumer(connect(), **journal.hooks("second"))
    loops = [Loop("first-loop", first), Loop("second-loop", second)]
    journal.wait_for("first", "activated")

    first.close()

    ended, closing_thread = journal.wait_for("first", "deactivated")
    _, activating_thread = journal.wait_for("second", "activated")
    assert journal.events() == [
        ("first", "activated"),
        ("first", "deactivated"),
        ("second", "activated"),
    ]
    assert ended == first.intervals()[0] and ended.end is not None
    assert closing_thread == threading.current_thread().name
    assert activating_thread == "second-loop"
    second.close()
    assert all(loop.ended() for loop in loops)


def test_a_hook_that_raises_is_logged_and_consuming_goes_on(
    connect: Callable[[], CoordinatorClient], caplog: pytest.LogCaptureFixture
) -> None:
    def fail(interval: ActivationInterval) -> None:
        msg = "hook failed"
        raise RuntimeError(msg)

    producer = Producer("orders")
    coordinated = consumer(connect(), producer.ref, on_activated=fail)
    loop = Loop("loop", coordinated)

    producer.send("after the hook", timeout=WAIT)
    producer.send("and more", timeout=WAIT)

    assert loop.confirmed.acquire(timeout=WAIT) and loop.confirmed.acquire(timeout=WAIT)
    coordinated.close()
    producer.close()
    assert loop.ended()
    assert loop.received == ["after the hook", "and more"]
    assert any(
        r.levelno == logging.ERROR and "on_activated hook raised" in r.getMessage()
        for r in caplog.records
    )


def test_close_from_another_thread_ends_a_loop_waiting_for_a_message(
    connect: Callable[[], CoordinatorClient],
) -> None:
    journal = Journal()
    coordinated = consumer(connect(), **journal.hooks("only"))
    loop = Loop("loop", coordinated)
    journal.wait_for("only", "activated")  # active, and waiting for a message

    closer = threading.Thread(target=coordinated.close)
    closer.start()

    assert loop.ended()
    closer.join(WAIT)
    assert not closer.is_alive()


def test_close_from_another_thread_ends_a_loop_waiting_to_be_activated(
    connect: Callable[[], CoordinatorClient],
) -> None:
    active = consumer(connect())
    standby = consumer(connect())
    assert not standby.registered.active
    loop = Loop("standby-loop", standby)

    threading.Thread(target=standby.close).start()

    assert loop.ended()
    assert standby.intervals() == ()
    active.close()


def test_receive_blocked_in_another_thread_raises_closed_when_closed(
    connect: Callable[[], CoordinatorClient],
) -> None:
    coordinated = consumer(connect())
    raised: list[BaseException] = []
    started = threading.Event()

    def receive() -> None:
        started.set()
        try:
            coordinated.receive()
        except BaseException as error:  # recorded for the assertion
            raised.append(error)

    thread = threading.Thread(target=receive)
    thread.start()
    started.wait(WAIT)

    coordinated.close()

    thread.join(WAIT)
    assert not thread.is_alive()
    assert [type(e) for e in raised] == [ClosedError]
