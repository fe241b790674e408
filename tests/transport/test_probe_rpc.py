"""``Node.Probe``: a node answers the coordinator's liveness probe for the coordinator
connections a client of its process holds (`Node.host_connection`), with the node's
token rule."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from pykka_delivery.protocol import transport_pb2, transport_pb2_grpc
from pykka_delivery.transport import Node, NodeSettings


@pytest.fixture
def node() -> Iterator[Node]:
    with Node() as started:
        yield started


def probe(node: Node, connection_id: str, token: str | None = None) -> bool:
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    with grpc.insecure_channel(node.address) as channel:
        stub = transport_pb2_grpc.NodeStub(channel)  # type: ignore[no-untyped-call]
        request = transport_pb2.ProbeRequest(connection_id=connection_id)
        reply = stub.Probe(request, timeout=10, metadata=metadata)
    return bool(reply.known)


def test_a_node_knows_a_connection_its_process_hosts(node: Node) -> None:
    node.host_connection("conn-1")

    assert probe(node, "conn-1") is True


def test_a_node_does_not_know_a_connection_nobody_hosts(node: Node) -> None:
    node.host_connection("conn-1")

    assert probe(node, "conn-2") is False


def test_a_node_no_longer_knows_a_connection_once_hosting_it_is_undone(node: Node) -> None:
    undo = node.host_connection("conn-1")

    undo()
    undo()  # idempotent

    assert probe(node, "conn-1") is False


def test_a_probe_without_the_nodes_token_is_refused() -> None:
    with Node(NodeSettings(token="s3cret")) as node:
        node.host_connection("conn-1")

        with pytest.raises(grpc.RpcError) as refused:
            probe(node, "conn-1")

        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        assert probe(node, "conn-1", token="s3cret") is True
