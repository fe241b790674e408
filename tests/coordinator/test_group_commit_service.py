"""Group commit seen from the gRPC service: `ReplyHandoff` (the actor's answers handed to
the server's loop) and a fenced log ending the requests with UNAVAILABLE."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
import pytest

from pykka_delivery.coordinator import (
    OK,
    Command,
    CoordinatorActor,
    CoordinatorServer,
    MemoryCommandLog,
)
from pykka_delivery.coordinator._replies import ReplyHandoff
from pykka_delivery.coordinator.store import LogFencedError
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.protocol import coordinator_pb2_grpc as pb_grpc

WAIT = 10.0


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop counting the wake-ups asked of it from other threads."""

    wakeups = 0

    def call_soon_threadsafe(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: Any = None
    ) -> asyncio.Handle:
        self.wakeups += 1
        return super().call_soon_threadsafe(callback, *args, context=context)


@pytest.fixture
def loop() -> Iterator[CountingLoop]:
    loop = CountingLoop()
    yield loop
    loop.close()


def test_answers_handed_before_the_loop_runs_wake_it_once(loop: CountingLoop) -> None:
    handoff = ReplyHandoff(loop)
    futures = [loop.create_future() for _ in range(3)]

    for future in futures:
        handoff.reply_to(future)(OK)
    loop.run_until_complete(asyncio.sleep(0))

    assert [f.result() for f in futures] == [OK, OK, OK]
    assert loop.wakeups == 1


def test_an_answer_handed_after_a_drain_wakes_the_loop_again(loop: CountingLoop) -> None:
    handoff = ReplyHandoff(loop)
    first, second = loop.create_future(), loop.create_future()

    handoff.reply_to(first)(OK)
    loop.run_until_complete(asyncio.sleep(0))
    handoff.reply_to(second)(OK)
    loop.run_until_complete(asyncio.sleep(0))

    assert second.result() is OK
    assert loop.wakeups == 2


def test_an_error_is_raised_by_its_future_and_a_cancelled_future_is_skipped(
    loop: CountingLoop,
) -> None:
    handoff = ReplyHandoff(loop)
    cancelled, failed = loop.create_future(), loop.create_future()
    cancelled.cancel()  # its request timed out

    handoff.reply_to(cancelled)(OK)
    handoff.reply_to(failed)(OSError("No space left on device"))
    loop.run_until_complete(asyncio.sleep(0))

    with pytest.raises(OSError, match="No space left"):
        failed.result()


class _FencedLog(MemoryCommandLog):
    """A log another coordinator has taken over: every append is refused."""

    def append(self, command: Command) -> None:
        self.append_all([command])

    def append_all(self, commands: Sequence[Command], state: Any = None) -> None:
        raise LogFencedError("the lease has epoch 7 now")


def test_a_request_refused_by_a_fenced_log_ends_with_unavailable_and_stops_the_actor() -> None:
    actor = CoordinatorActor.start(_FencedLog())
    server = CoordinatorServer(actor).start()
    hello = pb.ClientMessage(request_id=1, hello=pb.Hello(connection_id="raw", node="test"))
    register = pb.ClientMessage(
        request_id=2,
        register=pb.Register(
            group=pb.GroupKey(namespace="a", stream="b", name="c"), subscription_id=1
        ),
    )
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.RpcError) as ended:
                list(stub.Connect(iter([hello, register]), timeout=WAIT))
        stopped = actor.actor_stopped.wait(WAIT)
    finally:
        server.stop()
        if actor.is_alive():
            actor.stop()

    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "epoch 7" in (ended.value.details() or "")
    assert stopped, "a coordinator whose log is fenced stops"


class _GatedLog(MemoryCommandLog):
    """A log whose first append waits for ``gate``; records each append's size."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.sizes: list[int] = []

    def append(self, command: Command) -> None:
        self.append_all([command])

    def append_all(self, commands: Sequence[Command], state: Any = None) -> None:
        if not self.sizes:
            self.gate.wait(WAIT)
        self.sizes.append(len(commands))
        super().append_all(commands, state)


def test_requests_of_one_stream_join_one_group_commit_and_are_answered_in_order() -> None:
    """The server reads on while a request waits for its commit (``stream_pipeline``):
    the four registrations sent behind the first are carried out together, and the
    replies still come in request order."""
    log = _GatedLog()
    actor = CoordinatorActor.start(log)
    server = CoordinatorServer(actor).start()
    registers = [
        pb.ClientMessage(
            request_id=n,
            register=pb.Register(
                group=pb.GroupKey(namespace="a", stream="b", name=f"g{n}"), subscription_id=n
            ),
        )
        for n in range(2, 7)
    ]
    hello = pb.ClientMessage(request_id=1, hello=pb.Hello(connection_id="raw", node="test"))
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
            replies = stub.Connect(iter([hello, *registers]), timeout=WAIT)
            assert next(replies).reply.request_id == 1
            deadline = time.monotonic() + WAIT
            while server._counters.requests < 5 and time.monotonic() < deadline:
                time.sleep(0.01)
            read_ahead = server._counters.requests
            log.gate.set()
            answered = [m.reply.request_id for m in replies if m.HasField("reply")]
    finally:
        log.gate.set()
        server.stop()
        actor.stop()

    assert read_ahead == 5, "the server waited for each commit before reading the next"
    assert answered == [2, 3, 4, 5, 6]
    # The first commit waited with what had arrived (one or two); all the rest, read
    # meanwhile, went into the second; then the stream's end (ConnectionLost).
    assert sum(log.sizes[:2]) == 5
