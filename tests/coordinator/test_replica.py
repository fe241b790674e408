"""`CoordinatorReplica` in one process: replicas on one PostgreSQL database (the session's
throwaway server), a follower's answers, a hand-over on close or on a lost lease, and
clients that follow the leader. The multi-process tests (SIGKILL, SIGSTOP) are in
test_replica_processes.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import grpc
import psycopg
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pykka_delivery.coordinator import (
    SERVICE_NAME,
    CoordinatorClient,
    CoordinatorClientSettings,
    GroupId,
)
from pykka_delivery.coordinator.lease_postgres import PostgresLease
from pykka_delivery.coordinator.replica import CoordinatorReplica, ReplicaSettings
from pykka_delivery.coordinator.service import LEADER_METADATA_KEY
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.protocol import coordinator_pb2_grpc as pb_grpc
from tests.harness import wait_until

GROUP = GroupId("test", "orders", "billing")
WAIT = 20.0  # bound on every wait


def replica(url: str, ttl: float = 2.0) -> CoordinatorReplica:
    return CoordinatorReplica(url, replica_settings=ReplicaSettings(ttl=ttl, acquire_interval=0.1))


@pytest.fixture
def two(postgres_url: str) -> Iterator[tuple[CoordinatorReplica, CoordinatorReplica]]:
    """Two replicas on one database, the first started leading and the second following."""
    first = replica(postgres_url).start()
    try:
        assert first.wait_leading(WAIT)
        second = replica(postgres_url).start()
        try:
            wait_until(lambda: second.leader == first.address, "the follower to know the leader")
            yield first, second
        finally:
            second.close()
    finally:
        first.close()


def client_settings() -> CoordinatorClientSettings:
    return CoordinatorClientSettings(
        reconnect_backoff_min=0.05, reconnect_backoff_max=0.5, connect_timeout=2.0
    )


def health(address: str, service: str = SERVICE_NAME) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=service)
        return int(stub.Check(request, timeout=5).status)


def test_one_of_two_replicas_leads_and_the_other_knows_where(
    two: tuple[CoordinatorReplica, CoordinatorReplica],
) -> None:
    leader, follower = two

    assert leader.leading
    assert leader.epoch == 1
    assert not follower.leading
    assert follower.leader == leader.address


def leader_named_by(address: str) -> str:
    """Ask ``address`` for its groups; the leader its refusal names (the test fails if it
    does not refuse, or names none)."""
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as refused:
            stub.ListGroups(pb.ListGroupsRequest(), timeout=5)
    error: Any = refused.value
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    named = dict(error.trailing_metadata())[LEADER_METADATA_KEY]
    assert f"not the leader; the leader is at {named}" in error.details()
    return str(named)


def test_a_follower_answers_unavailable_naming_the_leader(
    two: tuple[CoordinatorReplica, CoordinatorReplica],
) -> None:
    leader, follower = two

    assert leader_named_by(follower.address) == leader.address


def test_the_health_service_says_not_serving_on_a_follower(
    two: tuple[CoordinatorReplica, CoordinatorReplica],
) -> None:
    leader, follower = two

    for service in ("", SERVICE_NAME):
        assert health(follower.address, service) == health_pb2.HealthCheckResponse.NOT_SERVING
        assert health(leader.address, service) == health_pb2.HealthCheckResponse.SERVING


def test_a_client_given_only_a_follower_is_redirected_to_the_leader(
    two: tuple[CoordinatorReplica, CoordinatorReplica],
) -> None:
    leader, follower = two

    with CoordinatorClient(follower.address, settings=client_settings()) as client:
        registered = client.register(GROUP, 1, lambda _: None, timeout=WAIT)
        listed = client.list_groups(timeout=WAIT)

    assert registered.active
    assert [c.connection for c in listed[0].consumers] == [client.connection_id]
    assert follower.server.statistics().not_leader >= 1
    assert leader.server.statistics().streams_attached == 1
    assert follower.server.statistics().streams_attached == 0


def test_a_client_takes_a_comma_separated_list_of_addresses(
    two: tuple[CoordinatorReplica, CoordinatorReplica],
) -> None:
    leader, follower = two

    with CoordinatorClient(f"{follower.address},{leader.address}") as client:
        assert client.addresses == (follower.address, leader.address)
        assert client.address == f"{follower.address},{leader.address}"
        assert client.wait_connected(WAIT)


def test_an_empty_address_in_the_list_is_refused() -> None:
    with pytest.raises(ValueError, match="none empty"):
        CoordinatorClient("127.0.0.1:1,,127.0.0.1:2")


def test_closing_the_leader_hands_over_at_once_and_keeps_the_registrations(
    postgres_url: str,
) -> None:
    # A ttl far above the waits: only the released lease explains a prompt take-over.
    first = replica(postgres_url, ttl=60.0).start()
    second: CoordinatorReplica | None = None
    try:
        assert first.wait_leading(WAIT)
        second = replica(postgres_url, ttl=60.0).start()
        activations: list[bool] = []
        addresses = [first.address, second.address]
        with CoordinatorClient(addresses, settings=client_settings()) as client:
            client.register(GROUP, 1, lambda update: activations.append(update.active))
            first.close()

            assert second.wait_leading(WAIT)
            assert second.epoch == 2
            wait_until(lambda: client.connected, "the client to reach the new leader")
            listed = client.list_groups(timeout=WAIT)

        assert [c.connection for c in listed[0].consumers] == [client.connection_id]
        assert activations[0] is True and False not in activations
    finally:
        first.close()
        if second is not None:
            second.close()


def test_a_leader_whose_lease_was_taken_over_stops_serving_and_follows(postgres_url: str) -> None:
    leader = replica(postgres_url, ttl=3.0).start()  # renewing every second
    try:
        assert leader.wait_leading(WAIT)
        stepped_down = threading.Event()

        def watch() -> None:
            with leader.role_changed:
                if leader.role_changed.wait_for(lambda: not leader.leading, WAIT):
                    stepped_down.set()

        watcher = threading.Thread(target=watch)
        watcher.start()
        usurper = PostgresLease(postgres_url, holder="usurper", address="127.0.0.1:9", ttl=60.0)
        try:
            # The lease runs out by the database's clock (as if the leader had paused),
            # and another coordinator takes it (again if a renewal came in between).
            epochs: list[int | None] = []
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                while not epochs or epochs[-1] is None:
                    conn.execute("UPDATE coordinator_lease SET expires_at = clock_timestamp()")
                    epochs.append(usurper.try_acquire())
            watcher.join(WAIT)

            assert epochs[-1] == 2

            assert stepped_down.is_set()
            wait_until(lambda: leader.leader == "127.0.0.1:9", "the follower to name the usurper")
            assert leader_named_by(leader.address) == "127.0.0.1:9"
        finally:
            usurper.close()
    finally:
        leader.close()


def test_replica_settings_refuse_an_advertised_address_without_a_port() -> None:
    with pytest.raises(ValueError, match="advertise must be host:port"):
        ReplicaSettings(advertise="coordinator-a")
