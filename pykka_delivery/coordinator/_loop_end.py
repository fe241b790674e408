"""The last step before a coordinator client or server stops and closes its own event
loop: its other tasks finish, then gRPC delivers what it still owes the loop (see
``transport/_grpc_owed.py``: a completion handed to a closed loop is an error on
whichever loop reads it)."""

from __future__ import annotations

import asyncio

from pykka_delivery.transport._grpc_owed import settle_owed_completions

__all__ = ["finish_loop"]


async def finish_loop(timeout: float) -> None:
    """Let every other task of the running loop finish, for up to ``timeout`` seconds
    (then cancel what is left and wait for that), then wait, for up to ``timeout``
    seconds more, until gRPC owes the loop no completion.

    gRPC's own tasks of a call that ended (a cancelled client call, a server handler cut
    by the server's stop) finish a loop turn or more after it: a loop stopped before
    leaves them pending, and closing it destroys them (asyncio logs "Task was destroyed
    but it is pending!", gRPC a ``GeneratorExit`` traceback per call). Exceptions of the
    tasks are retrieved here: they ended with their calls.
    """
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    if others:
        _, late = await asyncio.wait(others, timeout=timeout)
        for task in late:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
    await settle_owed_completions(timeout)
