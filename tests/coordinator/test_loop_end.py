"""`finish_loop`, the last step of a coordinator client's or server's loop before it is
closed: the loop's other tasks finish, then gRPC delivers what it still owes the loop
(a completion handed to a closed loop makes the loop that read it log ``RuntimeError:
Event loop is closed``)."""

from __future__ import annotations

import asyncio

from pykka_delivery.coordinator._loop_end import finish_loop
from pykka_delivery.transport._grpc_owed import owed_completions, settle_owed_completions
from tests.transport.test_grpc_owed import WAIT, give_up_a_state_watch


def test_finish_loop_lets_the_other_tasks_finish_first() -> None:
    async def run() -> bool:
        finished = asyncio.Event()

        async def other() -> None:
            await asyncio.sleep(0)
            finished.set()

        asyncio.get_running_loop().create_task(other())
        await finish_loop(WAIT)
        return finished.is_set()

    assert asyncio.run(run())


def test_finish_loop_returns_only_once_grpc_owes_the_loop_nothing() -> None:
    async def run() -> int:
        channel = await give_up_a_state_watch()
        try:
            await finish_loop(WAIT)
            return owed_completions(asyncio.get_running_loop())
        finally:
            await settle_owed_completions(WAIT)  # a watch pending at close is never completed
            await channel.close()

    assert asyncio.run(run()) == 0
