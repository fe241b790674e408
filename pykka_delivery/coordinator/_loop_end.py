"""The last step before a coordinator client or server stops its own event loop."""

from __future__ import annotations

import asyncio

__all__ = ["finish_other_tasks"]


async def finish_other_tasks(timeout: float) -> None:
    """Let every other task of the running loop finish, for up to ``timeout`` seconds,
    then cancel what is left and wait for that.

    gRPC's own tasks of a call that ended (a cancelled client call, a server handler
    cut by the server's stop) finish a loop turn or more after it: a loop stopped before
    leaves them pending, and closing it destroys them (asyncio logs "Task was destroyed but
    it is pending!", gRPC a ``GeneratorExit`` traceback per call). Exceptions of the tasks
    are retrieved here: they ended with their calls.
    """
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if not others:
        return
    _, late = await asyncio.wait(others, timeout=timeout)
    for task in late:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
