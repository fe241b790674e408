"""What the asyncio handles share: they belong to one event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NoReturn

__all__ = ["call_in_loop", "wake", "wrong_thread"]


def wrong_thread(handle: str) -> NoReturn:
    msg = (
        f"{handle} belongs to the event loop it was created in: call it on that loop's "
        "thread (from another thread use asyncio.run_coroutine_threadsafe or "
        "loop.call_soon_threadsafe)"
    )
    raise RuntimeError(msg)


def call_in_loop(loop: asyncio.AbstractEventLoop, callback: Callable[..., Any], *args: Any) -> bool:
    """Hand ``callback`` to ``loop`` from another thread; False if the loop is closed."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # the loop is closed: nobody is left to run it
        return False
    return True


def wake(future: asyncio.Future[None]) -> None:
    if not future.done():  # it may have timed out (cancelled) meanwhile
        future.set_result(None)
