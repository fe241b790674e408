"""The server's bound on a told command: an actor that does not answer within
``request_timeout`` ends the stream with UNAVAILABLE, and a late answer changes nothing."""

from __future__ import annotations

import threading

import grpc
import pytest

from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorServer,
    CoordinatorServerSettings,
    MemoryCommandLog,
)
from pykka_delivery.coordinator.commands import Command
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.protocol import coordinator_pb2_grpc as pb_grpc

WAIT = 10.0  # the most any wait lasts


class _StuckLog(MemoryCommandLog):
    """A log whose appends wait until released, as a stalled disk would make them."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def append_all(self, commands: object, state: object = None) -> None:
        self.release.wait(WAIT)
        super().append_all(commands, state)  # type: ignore[arg-type]

    def append(self, command: Command) -> None:
        self.append_all((command,))


def _register(request_id: int) -> pb.ClientMessage:
    group = pb.GroupKey(namespace="a", stream="b", name="c")
    return pb.ClientMessage(
        request_id=request_id, register=pb.Register(group=group, subscription_id=1)
    )


def test_a_command_not_answered_within_request_timeout_ends_the_stream_with_unavailable() -> None:
    log = _StuckLog()
    actor = CoordinatorActor.start(log)
    server = CoordinatorServer(actor, CoordinatorServerSettings(request_timeout=0.2)).start()
    hello = pb.ClientMessage(request_id=1, hello=pb.Hello(connection_id="raw", node="test"))
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
            stream = stub.Connect(iter([hello, _register(2)]), timeout=WAIT)
            with pytest.raises(grpc.RpcError) as ended:
                list(stream)
    finally:
        log.release.set()
        server.stop()
        actor.stop()

    assert ended.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "did not answer RegisterConsumer within 0.2 s" in (ended.value.details() or "")
