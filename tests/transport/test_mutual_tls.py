"""Mutual TLS: the node address a peer claims in its ``Hello`` must be one its certificate
names (issue 19, defect 4), else the link is refused with PERMISSION_DENIED, counted, and
the dialling side's timeouts say why. Real nodes over TLS on 127.0.0.1, certificates from
trustme (tests/certs.py); every wait is bounded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import pytest

from pykka_delivery import Consumer, ConsumerControllerSettings, DeliveryTimeout, Producer
from pykka_delivery.protocol import transport_pb2, transport_pb2_grpc
from pykka_delivery.transport import Node, NodeSettings
from tests.certs import TlsFiles, tls_files  # noqa: F401 - the fixture
from tests.harness import wait_until
from tests.transport.test_node import free_port, start

WAIT = 10.0
FAST = ConsumerControllerSettings(resend_interval_min=0.05, resend_interval_max=0.1)
QUICK = {"connect_timeout": 1.0, "reconnect_backoff_min": 0.05, "reconnect_backoff_max": 0.2}


def round_trip(producer_node: Node, consumer_node: Node) -> list[object]:
    """Three messages from a producer on one node to a consumer on the other; only the
    producer's node dials (the consumer's answers on that link)."""
    producer = Producer("orders", self_ref_factory=producer_node.expose("orders"))
    consumer = Consumer(FAST, self_ref_factory=consumer_node.expose("c"))
    producer.register_consumer(producer_node.ref(f"{consumer_node.address}/c"))
    received = []
    for n in range(3):
        producer.send(n, timeout=WAIT)
        delivery = consumer.receive(timeout=WAIT)
        received.append(delivery.message)
        delivery.confirm()
    producer.close()
    consumer.close()
    return received


def test_nodes_whose_certificates_name_their_ip_link(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    a = start(nodes, NodeSettings(tls=tls_files.node_tls("alpha", "127.0.0.1")))
    b = start(nodes, NodeSettings(tls=tls_files.node_tls("beta", "127.0.0.1")))

    assert round_trip(a, b) == [0, 1, 2]

    assert a.statistics().rejected_links == b.statistics().rejected_links == 0


def test_a_node_advertising_a_dns_name_its_certificate_names_links(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    port = free_port()
    a = start(nodes, NodeSettings(tls=tls_files.node_tls("alpha", "127.0.0.1")))
    b = start(
        nodes,
        NodeSettings(
            port=port,
            advertised_address=f"localhost:{port}",
            tls=tls_files.node_tls("beta", "localhost"),
        ),
    )

    assert round_trip(b, a) == [0, 1, 2]  # b dials a, claiming localhost:port

    assert a.statistics().rejected_links == 0


def test_a_peer_claiming_another_nodes_address_is_refused_and_counted(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    a = start(nodes, NodeSettings(tls=tls_files.node_tls("alpha", "127.0.0.1")))
    victim = start(nodes, NodeSettings(tls=tls_files.node_tls("victim", "127.0.0.1")))
    impostor = start(
        nodes,
        NodeSettings(
            tls=tls_files.node_tls("impostor", "impostor.test"),
            advertised_address=victim.address,  # poses as the victim
            **QUICK,
        ),
    )

    impostor.ref(f"{a.address}/anything").tell("hello")

    wait_until(lambda: impostor.link_problem(a.address) is not None)
    problem = impostor.link_problem(a.address)
    assert problem is not None
    assert problem.startswith("refused (PERMISSION_DENIED): ")
    assert f"claims to be node '{victim.address}'" in problem
    assert "impostor.test" in problem
    assert a.statistics().rejected_links >= 1
    assert not a.is_linked(victim.address)


def test_a_producer_refused_for_its_claimed_address_times_out_saying_so(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    consumer_node = start(nodes, NodeSettings(tls=tls_files.node_tls("alpha", "127.0.0.1")))
    producer_node = start(
        nodes, NodeSettings(tls=tls_files.node_tls("other", "other.test"), **QUICK)
    )
    consumer = Consumer(FAST, self_ref_factory=consumer_node.expose("c"))
    producer = Producer("orders", self_ref_factory=producer_node.expose("orders"))
    producer.register_consumer(producer_node.ref(f"{consumer_node.address}/c"))

    with pytest.raises(DeliveryTimeout) as timed_out:
        for n in range(3):  # the first goes unrequested; the next wait for demand
            producer.send(n, timeout=2.0)

    message = str(timed_out.value)
    assert "no demand to send within 2.0 s" in message
    assert f"the link to {consumer_node.address} is down: refused (PERMISSION_DENIED)" in message
    assert f"claims to be node '{producer_node.address}'" in message
    producer.close()
    consumer.close()


def test_with_verify_peer_address_off_any_claimed_address_links(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    a = start(
        nodes,
        NodeSettings(tls=tls_files.node_tls("alpha", "127.0.0.1", verify_peer_address=False)),
    )
    b = start(nodes, NodeSettings(tls=tls_files.node_tls("other", "other.test")))

    assert round_trip(b, a) == [0, 1, 2]  # b dials a (a could not verify b's server name)

    assert a.statistics().rejected_links == 0


def test_without_client_certificates_required_the_claim_is_not_checked(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    a = start(
        nodes,
        NodeSettings(tls=tls_files.node_tls("alpha", "127.0.0.1", require_client_auth=False)),
    )
    b = start(nodes, NodeSettings(tls=tls_files.node_tls("other", "other.test")))

    assert round_trip(b, a) == [0, 1, 2]

    assert a.statistics().rejected_links == 0


def open_link(node: Node, cert: tuple[Path, Path], tls_files: TlsFiles, **meta: str) -> Any:  # noqa: F811
    """A raw ``Node.Link`` call to ``node`` with ``cert``, writing one Hello claiming
    ``meta["hello"]`` (and announcing ``meta["announce"]`` in the metadata, if given): the
    call's final error."""
    credentials = grpc.ssl_channel_credentials(
        tls_files.ca_cert.read_bytes(), cert[1].read_bytes(), cert[0].read_bytes()
    )
    hello = transport_pb2.Frame()
    hello.hello.node = meta["hello"]
    metadata = [("pykka-delivery-node", meta["announce"])] if "announce" in meta else []
    with grpc.secure_channel(node.address, credentials) as channel:
        stub = transport_pb2_grpc.NodeStub(channel)
        with pytest.raises(grpc.RpcError) as ended:
            for _ in stub.Link(iter([hello]), metadata=metadata, timeout=WAIT):
                pass
    return ended.value


def test_a_dialler_that_predates_the_metadata_is_checked_on_its_hello(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    a = start(nodes, NodeSettings(tls=tls_files.node_tls("alpha", "127.0.0.1")))
    impostor_cert = tls_files.issue("old-impostor", "impostor.test")

    error = open_link(a, impostor_cert, tls_files, hello="127.0.0.1:1")

    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "claims to be node '127.0.0.1:1'" in error.details()
    assert a.statistics().rejected_links == 1


def test_a_hello_claiming_other_than_the_announced_address_is_checked_too(
    nodes: list[Node],
    tls_files: TlsFiles,  # noqa: F811 - fixture
) -> None:
    a = start(nodes, NodeSettings(tls=tls_files.node_tls("alpha", "127.0.0.1")))
    cert = tls_files.issue("two-faced", "two-faced.test")

    error = open_link(a, cert, tls_files, announce="two-faced.test:1", hello="127.0.0.1:1")

    assert error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "claims to be node '127.0.0.1:1'" in error.details()
