"""`LoopHandoff` (items of other threads handed to a loop, one wake-up per burst) and
`Expiry` (futures failed past a timeout, one timer for all)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pykka_delivery.coordinator._handoff import LoopHandoff
from pykka_delivery.coordinator._replies import Expired, Expiry


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop counting the wake-ups asked of it from other threads and its timers."""

    wakeups = 0
    timers = 0

    def call_soon_threadsafe(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        self.wakeups += 1
        return super().call_soon_threadsafe(callback, *args, context=context)

    def call_at(  # type: ignore[override]
        self, when: float, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.TimerHandle:
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


@pytest.fixture
def loop() -> Iterator[CountingLoop]:
    loop = CountingLoop()
    yield loop
    loop.close()


def test_items_of_several_threads_handed_before_the_loop_runs_are_consumed_in_order_on_one_wakeup(
    loop: CountingLoop,
) -> None:
    consumed: list[int] = []
    handoff = LoopHandoff(loop, consumed.append)
    threads = [threading.Thread(target=handoff.hand, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
        thread.join()

    loop.run_until_complete(asyncio.sleep(0))

    assert consumed == [0, 1, 2, 3]
    assert loop.wakeups == 1


def test_an_item_handed_after_a_drain_wakes_the_loop_again(loop: CountingLoop) -> None:
    consumed: list[int] = []
    handoff = LoopHandoff(loop, consumed.append)

    handoff.hand(1)
    loop.run_until_complete(asyncio.sleep(0))
    handoff.hand(2)
    loop.run_until_complete(asyncio.sleep(0))

    assert consumed == [1, 2]
    assert loop.wakeups == 2


def test_an_item_handed_to_a_closed_loop_raises_and_is_not_kept() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    handoff: LoopHandoff[int] = LoopHandoff(loop, print)

    with pytest.raises(RuntimeError):
        handoff.hand(1)

    assert not handoff._queued


def test_a_future_not_done_within_the_timeout_fails_with_expired(loop: CountingLoop) -> None:
    expiry = Expiry(loop, 0.01)
    future = loop.create_future()

    expiry.add(future)
    loop.run_until_complete(asyncio.wait([future], timeout=5))

    with pytest.raises(Expired):
        future.result()


def test_a_future_done_in_time_keeps_its_result(loop: CountingLoop) -> None:
    expiry = Expiry(loop, 0.01)
    answered, late = loop.create_future(), loop.create_future()
    expiry.add(answered)
    expiry.add(late)

    answered.set_result("reply")
    loop.run_until_complete(asyncio.wait([late], timeout=5))

    assert answered.result() == "reply"
    assert isinstance(late.exception(), Expired)


def test_futures_added_while_a_timer_is_armed_share_it(loop: CountingLoop) -> None:
    expiry = Expiry(loop, 60.0)

    for _ in range(5):
        expiry.add(loop.create_future())

    assert loop.timers == 1


def test_the_timer_is_armed_again_for_a_future_added_after_the_first_expired(
    loop: CountingLoop,
) -> None:
    expiry = Expiry(loop, 0.01)
    first = loop.create_future()
    expiry.add(first)
    loop.run_until_complete(asyncio.wait([first], timeout=5))
    second = loop.create_future()

    expiry.add(second)
    loop.run_until_complete(asyncio.wait([second], timeout=5))

    assert isinstance(second.exception(), Expired)
