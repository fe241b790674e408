"""Lag as data over gRPC, in one process on 127.0.0.1: clients report positions on their
Connect streams, the `CoordinatorServer` keeps them in memory, and `CoordinatorClient.lag`
(or `CoordinatorServer.lag`) answers the joined rows. Waits poll with a bound; the
report interval is short so that they end quickly."""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pykka
import pytest

from pykka_delivery.coordinator import (
    ConnectionRejected,
    ConsumerPosition,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    CoordinatorServerSettings,
    LagInfo,
    ProducerPosition,
)
from pykka_delivery.protocol import coordinator_pb2 as pb
from pykka_delivery.protocol import coordinator_pb2_grpc as pb_grpc
from tests.harness import wait_until

WAIT = 10.0
FAST = CoordinatorClientSettings(
    reconnect_backoff_min=0.01,
    reconnect_backoff_max=0.1,
    request_timeout=WAIT,
    report_interval=0.02,
)

Serve = Callable[..., CoordinatorServer]
Connect = Callable[..., CoordinatorClient]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """``serve(**server_settings)``: a coordinator behind a server, stopped at the end."""
    started: list[tuple[CoordinatorServer, pykka.ActorRef[Any]]] = []

    def start(**settings: Any) -> CoordinatorServer:
        actor = CoordinatorActor.start()
        server = CoordinatorServer(actor, CoordinatorServerSettings(**settings)).start()
        started.append((server, actor))
        return server

    yield start
    for server, actor in started:
        server.stop()
        actor.stop()


@pytest.fixture
def server(serve: Serve) -> CoordinatorServer:
    return serve()


@pytest.fixture
def connect() -> Iterator[Connect]:
    """``connect(address, attach=True, **client_kwargs)``: a client (attached, unless
    ``attach`` is False) closed at the end of the test."""
    opened: list[CoordinatorClient] = []

    def open_client(address: str, *, attach: bool = True, **kw: Any) -> CoordinatorClient:
        kw.setdefault("settings", FAST)
        client = CoordinatorClient(address, **kw)
        opened.append(client)
        # Attached before the test goes on: closing a client whose stream is still
        # attaching can stall in grpc for the whole close bound.
        assert not attach or client.wait_connected(WAIT)
        return client

    yield open_client
    for client in opened:
        client.close()


def figures(rows: tuple[LagInfo, ...]) -> list[tuple[str, str, int, int, int]]:
    """(stream, group, sent, confirmed, in_flight) of each row."""
    return [(r.stream, r.group, r.sent, r.confirmed, r.in_flight) for r in rows]


PRODUCED = ProducerPosition("ns", "orders-0", 0, "orders-0:billing", 10, 4, 1.5, "billing")
CONSUMED = ConsumerPosition("ns", "orders-0", "billing", 0, "orders-0:billing", 9, 7)


def test_reported_positions_come_back_from_lag_joined_per_group_and_producer(
    server: CoordinatorServer, connect: Connect
) -> None:
    producer_side = connect(server.address)
    consumer_side = connect(server.address)

    producer_side.report_positions([PRODUCED])
    consumer_side.report_positions([CONSUMED])

    wanted = [("orders-0", "billing", 10, 7, 3)]
    wait_until(lambda: figures(consumer_side.lag()) == wanted, "the joined row")
    (row,) = producer_side.lag()
    assert (row.namespace, row.partition_index, row.producer_id) == ("ns", 0, "orders-0:billing")
    assert row.oldest_unconfirmed_age == 1.5
    assert abs(row.reported_at - time.time()) < 60  # the coordinator's wall clock


def test_a_position_source_is_read_again_at_every_report(
    server: CoordinatorServer, connect: Connect
) -> None:
    client = connect(server.address)
    reads: list[int] = []

    def source() -> list[ProducerPosition]:
        reads.append(len(reads) + 1)
        return [ProducerPosition("ns", "s", -1, "p", len(reads), 0)]

    client.add_position_source(source)

    wait_until(lambda: [r.sent for r in client.lag()] >= [3], "a third read reported")
    client.remove_position_source(source)
    count = len(reads)
    client.report_positions([ProducerPosition("ns", "s", -1, "p", 1000, 0)])
    wait_until(lambda: [r.sent for r in client.lag()] == [1000], "the last report")
    assert len(reads) == count


def test_the_last_position_of_a_key_given_before_a_report_is_the_one_sent(
    server: CoordinatorServer, connect: Connect
) -> None:
    client = connect(server.address, settings=CoordinatorClientSettings(report_interval=1.0))

    client.report_positions([ProducerPosition("ns", "s", -1, "p", 1, 0)])
    client.report_positions([ProducerPosition("ns", "s", -1, "p", 2, 0)])

    wait_until(lambda: bool(server.lag()), "a report")
    assert [r.sent for r in server.lag()] == [2]


def test_lag_filters_by_namespace_stream_and_group_on_the_server(
    server: CoordinatorServer, connect: Connect
) -> None:
    client = connect(server.address)
    client.report_positions(
        [
            CONSUMED,
            ConsumerPosition("ns", "orders-1", "audit", 1, "orders-1:audit", 5, 5),
            ConsumerPosition("other", "payments", "billing", -1, "pay", 5, 5),
        ]
    )
    wait_until(lambda: len(client.lag()) == 3, "three rows")

    assert [r.group for r in client.lag("ns")] == ["billing", "audit"]
    assert [r.namespace for r in client.lag(group="billing")] == ["ns", "other"]
    assert [r.stream for r in client.lag(stream="orders")] == ["orders-0", "orders-1"]
    assert [r.stream for r in client.lag("ns", stream="orders", group="audit")] == ["orders-1"]
    assert client.lag(stream="nothing") == ()


def test_a_goodbye_forgets_the_positions_of_the_connection_at_once(
    server: CoordinatorServer, connect: Connect
) -> None:
    leaving = connect(server.address)
    staying = connect(server.address)
    leaving.report_positions([PRODUCED])
    staying.report_positions([ProducerPosition("ns", "s", -1, "kept", 1, 0)])
    wait_until(lambda: len(server.lag()) == 2, "both reports")

    leaving.close()

    assert [r.producer_id for r in server.lag()] == ["kept"]


def test_a_lost_connection_keeps_its_positions_until_lag_expiry(
    serve: Serve, connect: Connect
) -> None:
    server = serve(lag_expiry=3.0)
    client = connect(server.address)
    client.report_positions([PRODUCED])
    wait_until(lambda: bool(server.lag()), "the report")

    client.close(goodbye=False)
    wait_until(lambda: server.statistics().streams_lost == 1, "the lost stream")
    kept = server.lag()

    assert [r.producer_id for r in kept] == [PRODUCED.producer_id]
    wait_until(lambda: server.lag() == (), "the position expired")


def test_lag_without_the_token_is_refused(serve: Serve, connect: Connect) -> None:
    server = serve(token="s3cret")
    client = connect(server.address, attach=False, settings=CoordinatorClientSettings(token="nope"))

    with pytest.raises(ConnectionRejected) as rejected:
        client.lag(timeout=WAIT)

    assert rejected.value.code == "UNAUTHENTICATED"


def test_report_positions_takes_positions_only(server: CoordinatorServer, connect: Connect) -> None:
    client = connect(server.address)

    with pytest.raises(TypeError, match="ProducerPosition and ConsumerPosition"):
        client.report_positions([("ns", "s", 1)])  # type: ignore[list-item]


def test_an_invalid_position_on_the_wire_is_ignored_and_the_stream_goes_on(
    server: CoordinatorServer, caplog: pytest.LogCaptureFixture
) -> None:
    requests: queue.Queue[pb.ClientMessage | None] = queue.Queue()
    bad = pb.ProducerPosition(namespace="ns", stream="s", producer_id="", sent=1)
    good = pb.ProducerPosition(namespace="ns", stream="s", producer_id="ok", sent=2)
    with grpc.insecure_channel(server.address) as channel:
        stub = pb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
        replies = stub.Connect(iter(requests.get, None), timeout=WAIT)
        requests.put(pb.ClientMessage(request_id=1, hello=pb.Hello(connection_id="raw")))
        welcome = next(replies)
        requests.put(pb.ClientMessage(positions=pb.Positions(producers=[bad, good])))
        wait_until(lambda: bool(server.lag()), "the valid position")
        requests.put(pb.ClientMessage(goodbye=pb.Goodbye()))
        requests.put(None)
        rest = list(replies)

    assert welcome.reply.HasField("ok")
    assert rest == []  # positions get no reply
    assert "producer_id is empty" in caplog.text
    assert server.lag() == ()  # and the goodbye forgot the valid one


def test_settings_refuse_a_report_interval_or_lag_expiry_of_0() -> None:
    with pytest.raises(ValueError, match="report_interval"):
        CoordinatorClientSettings(report_interval=0)
    with pytest.raises(ValueError, match="lag_expiry"):
        CoordinatorServerSettings(lag_expiry=0)
