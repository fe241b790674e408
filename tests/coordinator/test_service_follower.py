"""`CoordinatorServer`'s follower mode, without a database: a server with no actor, or
whose ``serving`` check fails, refuses every call with UNAVAILABLE naming the leader;
`follow` ends the open streams and the clients reconnect to the leader it names."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    GroupId,
)
from pykka_delivery.coordinator.service import LEADER_METADATA_KEY
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.protocol import coordinator_pb2_grpc as pb_grpc
from tests.coordinator.procs import free_port
from tests.harness import wait_until

GROUP = GroupId("test", "orders", "billing")
WAIT = 10.0


@pytest.fixture
def follower() -> Iterator[CoordinatorServer]:
    server = CoordinatorServer(None).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def actors() -> Iterator[Callable[[], Any]]:
    started: list[Any] = []

    def start() -> Any:
        started.append(CoordinatorActor.start())
        return started[-1]

    yield start
    for actor in started:
        actor.stop()


def refusal(address: str, call: Callable[[Any], Any]) -> Any:
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as refused:
            call(stub)
    return refused.value


@pytest.mark.parametrize(
    "call",
    [
        lambda stub: stub.ListGroups(pb.ListGroupsRequest(), timeout=5),
        lambda stub: stub.ListStreams(pb.ListStreamsRequest(), timeout=5),
        lambda stub: stub.Lag(pb.LagRequest(), timeout=5),
        lambda stub: list(stub.Connect(iter([]), timeout=5)),
    ],
    ids=["ListGroups", "ListStreams", "Lag", "Connect"],
)
def test_a_server_without_an_actor_refuses_every_call_naming_the_leader(
    follower: CoordinatorServer, call: Callable[[Any], Any]
) -> None:
    follower.set_leader("leader.example:7070")

    error = refusal(follower.address, call)

    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert "not the leader; the leader is at leader.example:7070" in error.details()
    assert (LEADER_METADATA_KEY, "leader.example:7070") in error.trailing_metadata()
    assert follower.statistics().not_leader == 1


def test_a_follower_that_knows_no_leader_says_so_without_metadata(
    follower: CoordinatorServer,
) -> None:
    error = refusal(follower.address, lambda stub: stub.ListGroups(pb.ListGroupsRequest()))

    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert "no leader is known now" in error.details()
    assert LEADER_METADATA_KEY not in dict(error.trailing_metadata() or ())


def test_a_leader_whose_serving_check_fails_answers_nobody_before_it_is_told_to_follow(
    follower: CoordinatorServer, actors: Callable[[], Any]
) -> None:
    serving = threading.Event()
    serving.set()
    follower.lead(actors(), serving.is_set)
    with CoordinatorClient(follower.address) as client:
        assert client.register(GROUP, 1, lambda _: None, timeout=WAIT).active

        serving.clear()  # the lease ran out, as after a pause; nobody called follow()
        error = refusal(follower.address, lambda stub: stub.ListGroups(pb.ListGroupsRequest()))

        assert error.code() is grpc.StatusCode.UNAVAILABLE
        assert "not the leader" in error.details()
        assert not follower.leading
        assert follower.statistics().coordinator is None


def test_follow_ends_the_streams_and_clients_reconnect_to_the_named_leader(
    actors: Callable[[], Any],
) -> None:
    first = CoordinatorServer(actors()).start()
    second = CoordinatorServer(None).start()
    try:
        settings = CoordinatorClientSettings(reconnect_backoff_min=0.05, reconnect_backoff_max=0.5)
        with CoordinatorClient([first.address, second.address], settings=settings) as client:
            assert client.wait_connected(WAIT)
            attaches = second.statistics().streams_attached

            second.lead(actors(), lambda: True)
            first.follow(second.address)

            wait_until(lambda: second.statistics().streams_attached > attaches, "the reconnection")
            assert client.register(GROUP, 1, lambda _: None, timeout=WAIT).active
            assert [g.group for g in client.list_groups(timeout=WAIT)] == [GROUP]
        assert first.statistics().streams_attached == 1
    finally:
        first.stop()
        second.stop()


def test_a_client_comes_back_from_a_named_leader_that_is_gone(
    follower: CoordinatorServer, actors: Callable[[], Any]
) -> None:
    follower.set_leader(f"127.0.0.1:{free_port()}")  # nothing listens there
    settings = CoordinatorClientSettings(reconnect_backoff_min=0.05, reconnect_backoff_max=0.2)
    with CoordinatorClient(follower.address, settings=settings) as client:
        wait_until(lambda: follower.statistics().not_leader >= 2, "the client to be redirected")

        follower.lead(actors(), lambda: True)

        assert client.wait_connected(WAIT)
