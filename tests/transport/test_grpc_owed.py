"""What gRPC still owes an asyncio loop (`owed_completions`), and the wait for it before
the loop is closed (`settle_owed_completions`): a completion handed to a closed loop makes
the loop that read it log ``RuntimeError: Event loop is closed`` (the end of the pipeline
demo, when the lag client's half-close completed after its loop had closed and the
coordinator server's loop read it)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from pykka_delivery.transport import Node, NodeSettings
from pykka_delivery.transport._grpc_owed import owed_completions, settle_owed_completions

WAIT = 30.0
# How long after it is given up gRPC completes the state watch the tests give up.
OWED_FOR = 3.0


async def give_up_a_state_watch() -> grpc.aio.Channel:
    """An idle channel (it never tries to connect) with a state watch started and
    cancelled: gRPC owes the running loop the watch's completion until its deadline,
    OWED_FOR seconds later. (grpc.aio's public watch has no deadline: its Cython
    channel's has.)"""
    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    idle = grpc.ChannelConnectivity.IDLE
    assert channel.get_state(try_to_connect=False) is idle
    watch = asyncio.get_running_loop().create_task(
        channel._channel.watch_connectivity_state(idle.value[0], time.time() + OWED_FOR)
    )
    await asyncio.sleep(0)  # the watch starts
    watch.cancel()
    await asyncio.gather(watch, return_exceptions=True)
    return channel


@pytest.fixture
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """A loop on a thread of its own; closed once gRPC owes it nothing."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    on(loop, settle_owed_completions(WAIT))
    loop.call_soon_threadsafe(loop.stop)
    thread.join(WAIT)
    loop.close()


def on(loop: asyncio.AbstractEventLoop, coroutine: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coroutine, loop).result(2 * WAIT)


def close_when_settled(loop: asyncio.AbstractEventLoop, channel: grpc.aio.Channel) -> None:
    # Not before: a watch still pending when its channel closes is never completed.
    on(loop, settle_owed_completions(WAIT))
    on(loop, channel.close())


def test_a_state_watch_given_up_is_owed_to_its_loop_only(
    loop: asyncio.AbstractEventLoop,
) -> None:
    other = asyncio.new_event_loop()
    channel = on(loop, give_up_a_state_watch())
    try:
        assert owed_completions(loop) == 1
        assert owed_completions(other) == 0
    finally:
        other.close()
        close_when_settled(loop, channel)


def test_settle_returns_only_once_grpc_owes_the_loop_nothing(
    loop: asyncio.AbstractEventLoop,
) -> None:
    channel = on(loop, give_up_a_state_watch())
    try:
        on(loop, settle_owed_completions(WAIT))

        assert owed_completions(loop) == 0
    finally:
        close_when_settled(loop, channel)


def test_settle_gives_up_at_its_timeout_with_a_warning(
    loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    channel = on(loop, give_up_a_state_watch())
    try:
        on(loop, settle_owed_completions(0.0))

        assert owed_completions(loop) == 1
        assert "gRPC still owes it 1 completion(s)" in caplog.text
    finally:
        close_when_settled(loop, channel)


def test_a_node_stopped_on_the_callers_loop_leaves_grpc_owing_that_loop_nothing() -> None:
    async def run() -> int:
        node = await Node(NodeSettings(shutdown_grace=WAIT)).start_async()
        channel = await give_up_a_state_watch()
        try:
            await node.stop_async()
            return owed_completions(asyncio.get_running_loop())
        finally:
            await settle_owed_completions(WAIT)
            await channel.close()

    assert asyncio.run(run()) == 0
