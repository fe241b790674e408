"""`GrpcProber` against real endpoints on 127.0.0.1: a transport `Node` hosting the
connection or not, a closed port, a gRPC server without the ``Probe`` rpc, a listener
that never answers, a node that wants a token."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from collections.abc import Iterator
from concurrent import futures as thread_pools

import grpc
import pytest

from pykka_delivery.coordinator import CoordinatorServerSettings
from pykka_delivery.coordinator.probe import GrpcProber, Verdict
from pykka_delivery.transport import Node, NodeSettings

FAST = CoordinatorServerSettings(probe_timeout=0.5)


def verdict_of(
    address: str, connection: str, settings: CoordinatorServerSettings = FAST
) -> tuple[Verdict, list[Verdict]]:
    """The prober's verdict on ``connection`` at ``address``, and what it counted."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    counted: list[Verdict] = []
    got: concurrent.futures.Future[Verdict] = concurrent.futures.Future()
    try:
        prober = GrpcProber(loop, settings, counted.append)
        prober.probe(connection, address, lambda verdict, _why: got.set_result(verdict))
        return got.result(timeout=10), counted
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.fixture
def node() -> Iterator[Node]:
    with Node() as started:
        yield started


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_node_hosting_the_connection_is_alive(node: Node) -> None:
    node.host_connection("conn-1")

    assert verdict_of(node.address, "conn-1") == (Verdict.ALIVE, [Verdict.ALIVE])


def test_a_node_that_does_not_know_the_connection_means_the_process_is_gone(node: Node) -> None:
    node.host_connection("another")

    assert verdict_of(node.address, "conn-1")[0] is Verdict.GONE


def test_a_refused_port_means_the_process_is_gone() -> None:
    assert verdict_of(f"127.0.0.1:{closed_port()}", "conn-1") == (Verdict.GONE, [Verdict.GONE])


def test_a_server_without_the_probe_rpc_gives_no_answer() -> None:
    server = grpc.server(thread_pools.ThreadPoolExecutor(1))  # no service: UNIMPLEMENTED
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert verdict_of(f"127.0.0.1:{port}", "conn-1")[0] is Verdict.NO_ANSWER
    finally:
        server.stop(None)


def test_a_listener_that_never_answers_gives_no_answer() -> None:
    with socket.socket() as listener:  # the kernel completes the handshake; nobody speaks
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]

        assert verdict_of(f"127.0.0.1:{port}", "conn-1")[0] is Verdict.NO_ANSWER


def test_a_node_that_wants_a_token_answers_a_prober_that_has_it() -> None:
    with Node(NodeSettings(token="s3cret")) as node:
        node.host_connection("conn-1")
        with_token = CoordinatorServerSettings(probe_timeout=0.5, probe_token="s3cret")

        assert verdict_of(node.address, "conn-1")[0] is Verdict.NO_ANSWER
        assert verdict_of(node.address, "conn-1", with_token)[0] is Verdict.ALIVE


def test_a_prober_whose_loop_is_closed_gives_no_answer() -> None:
    loop = asyncio.new_event_loop()
    loop.close()
    got: list[Verdict] = []

    GrpcProber(loop, FAST, lambda _verdict: None).probe(
        "conn-1", "127.0.0.1:1", lambda verdict, _why: got.append(verdict)
    )

    assert got == [Verdict.NO_ANSWER]
