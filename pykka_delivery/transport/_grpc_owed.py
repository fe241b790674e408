"""What gRPC still owes an asyncio loop, and the wait for it before the loop is closed.

Every asyncio loop of a process that uses grpc.aio reads the completions of one shared
queue: whichever loop reads a completion runs it if it is its own, and hands it to the
loop that started the operation otherwise (``call_soon_threadsafe``). A completion handed
to a loop that is already closed raises ``RuntimeError: Event loop is closed`` on the
loop that read it (logged by asyncio with its traceback), so a loop is closed only once
gRPC owes it nothing.

gRPC owes a loop a completion after its tasks have ended: a task cancelled while it
awaited a gRPC operation (a read, a write, a half-close, a state watch) gives up the
operation's future, but the operation stays in gRPC's core until it completes, a moment
later (the call's cancellation is processed on gRPC's own threads) or, for a state
watch, at the channel's next state change. Its completion then comes to the loop that
started it, whatever that loop is doing by then.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging

__all__ = ["owed_completions", "settle_owed_completions"]

logger = logging.getLogger("pykka_delivery.transport")

# gRPC's keep-alive of an operation in flight (see `owed_completions`); None if this gRPC
# has none: nothing to look for then.
_CALLBACK_WRAPPER: type | None = getattr(
    importlib.import_module("grpc._cython.cygrpc"), "CallbackWrapper", None
)

# How soon `settle_owed_completions` looks again while something is owed: soon at first
# (a cancelled call's completions come within milliseconds), then doubling up to the
# longest, since each look walks every object (seconds).
_RECHECK_FIRST = 0.001
_RECHECK_LONGEST = 0.1


def owed_completions(loop: asyncio.AbstractEventLoop) -> int:
    """How many completions gRPC still owes ``loop`` for operations whose waiter gave up.

    grpc.aio keeps the wrapper of each operation in flight alive (one reference it drops
    when the completion runs), holding the future its waiter awaits, made on the loop
    that started the operation. A wrapper whose future is cancelled is a completion still
    to come for a waiter that no longer waits. Counted by a walk of the objects the
    garbage collector tracks: when a loop ends only, never per message.
    """
    wrapper = _CALLBACK_WRAPPER
    if wrapper is None:
        return 0
    owed = 0
    for found in gc.get_objects():
        if type(found) is wrapper:
            for held in gc.get_referents(found):
                if (
                    isinstance(held, asyncio.Future)
                    and held.cancelled()
                    and held.get_loop() is loop
                ):
                    owed += 1
    return owed


async def settle_owed_completions(timeout: float) -> None:
    """Run the loop until gRPC owes it no completion (`owed_completions`), for up to
    ``timeout`` seconds; past that, log a WARNING with how many are still owed.

    Call it last on a loop that is about to be closed, once nothing starts gRPC work on
    it any more (its channels closed, its server stopped, its tasks finished).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    recheck = _RECHECK_FIRST
    while owed := owed_completions(loop):
        if loop.time() >= deadline:
            logger.warning(
                "Closing an event loop while gRPC still owes it %d completion(s) after "
                "%s s; a loop that reads one later logs 'Event loop is closed'",
                owed,
                timeout,
            )
            return
        await asyncio.sleep(recheck)
        recheck = min(2 * recheck, _RECHECK_LONGEST)
