"""Reading the observed objects' statistics at scrape time, from the scraping thread.

Blocking handles, nodes and coordinator servers are read from any thread (their
``statistics()`` take their own locks). An asyncio handle's state belongs to its loop's
thread: its readings run there, all the handles of one loop in one hop, with a bounded
wait (a blocked or stopped loop leaves them out of that scrape).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from pykka_delivery import _observed

__all__ = ["read_all"]

logger = logging.getLogger("pykka_delivery.metrics")

T = TypeVar("T")


def read_all(kind: str, read: Callable[[Any], T | None], timeout: float) -> list[T]:
    """``read(obj)`` for every live object of ``kind`` (see `_observed`), each on the
    thread its state belongs to; what reads as None or fails is left out (a scrape must not
    fail because of one object)."""
    results: list[T] = []
    by_loop: dict[asyncio.AbstractEventLoop, list[object]] = {}
    for obj, loop in _observed.observed(kind):
        if loop is None or _running_here(loop):
            _keep(results, read, obj)
        elif not loop.is_closed():
            by_loop.setdefault(loop, []).append(obj)
    for loop, objects in by_loop.items():
        results += _read_on(loop, objects, read, timeout)
    return results


def _running_here(loop: asyncio.AbstractEventLoop) -> bool:
    """``loop`` runs this thread (a scrape from a task or callback on it)."""
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _keep(results: list[T], read: Callable[[Any], T | None], obj: object) -> None:
    try:
        value = read(obj)
    except Exception as error:  # closed under us, say: it is left out of this scrape
        logger.debug("Metrics: cannot read %r: %s", obj, error)
        return
    if value is not None:
        results.append(value)


def _read_on(
    loop: asyncio.AbstractEventLoop,
    objects: list[object],
    read: Callable[[Any], T | None],
    timeout: float,
) -> list[T]:
    """``read`` of each of ``objects`` in one callback on ``loop``, waited for at most
    ``timeout`` seconds."""
    future: concurrent.futures.Future[list[T]] = concurrent.futures.Future()

    def run() -> None:
        if future.set_running_or_notify_cancel():
            results: list[T] = []
            for obj in objects:
                _keep(results, read, obj)
            future.set_result(results)

    try:
        loop.call_soon_threadsafe(run)
    except RuntimeError:  # the loop closed meanwhile
        return []
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        logger.warning(
            "Metrics: %d asyncio handle(s) left out of this scrape: their event loop did not "
            "run a callback within %s s (blocked, or stopped without closing): raise "
            "read_timeout if it is only busy",
            len(objects),
            timeout,
        )
        return []
