"""The liveness probe through the service, in one process: clients built with ``node=``
a transport `Node`, a coordinator with the DEFAULT ``disconnected_timeout``. A client
cut off from the coordinator while its process lives keeps its group; a client that
leaves without a goodbye (its process no longer vouching for the connection) is handed
over at once. Every wait is bounded; nothing waits for the timeout itself.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from pykka_delivery.coordinator import (
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorServer,
    CoordinatorServerSettings,
    GroupId,
    SendConsumerUpdate,
)
from pykka_delivery.testing import TcpProxy
from pykka_delivery.transport import Node
from tests.coordinator.servers import FAST

GROUP = GroupId("ns", "orders", "app")
WAIT = 10.0  # far below the default disconnected_timeout


def wait_until(check: Callable[[], object], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


class Updates:
    """The updates one subscription was sent."""

    def __init__(self) -> None:
        self.got: list[SendConsumerUpdate] = []
        self._lock = threading.Lock()

    def __call__(self, update: SendConsumerUpdate) -> None:
        with self._lock:
            self.got.append(update)

    def activated(self) -> bool:
        with self._lock:
            return any(u.active for u in self.got)


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    actor = CoordinatorActor.start()  # the default settings: disconnected_timeout included
    try:
        with CoordinatorServer(actor, CoordinatorServerSettings(probe_timeout=2.0)) as served:
            yield served
    finally:
        actor.stop()


@pytest.fixture
def nodes() -> Iterator[tuple[Node, Node]]:
    with Node() as a, Node() as b:
        yield a, b


def labels(server: CoordinatorServer) -> dict[str, str]:
    with CoordinatorClient(server.address, settings=FAST) as client:
        return {c.owner: c.label for info in client.list_groups() for c in info.consumers}


def test_a_client_cut_off_while_its_process_lives_keeps_its_group(
    server: CoordinatorServer, nodes: tuple[Node, Node]
) -> None:
    host, port = server.address.rsplit(":", 1)
    with TcpProxy((host, int(port))) as proxy:
        a = CoordinatorClient(
            f"127.0.0.1:{proxy.address[1]}", node=nodes[0], owner="a", settings=FAST
        )
        b = CoordinatorClient(server.address, node=nodes[1], owner="b", settings=FAST)
        try:
            updates_b = Updates()
            assert a.register(GROUP, 1, Updates()).active
            assert not b.register(GROUP, 1, updates_b).active

            proxy.refuse(True)
            proxy.cut()
            wait_until(lambda: server.statistics().probes_alive >= 1, "the probe's answer")
            assert labels(server) == {"a": "active (disconnected)", "b": "waiting (connected)"}
            proxy.refuse(False)
            wait_until(lambda: a.connected, "a to reconnect")

            assert labels(server) == {"a": "active (connected)", "b": "waiting (connected)"}
            assert not updates_b.activated()
            assert server.statistics().probes_gone == 0
        finally:
            b.close()
            a.close()


def test_a_client_that_leaves_without_goodbye_is_handed_over_at_once(
    server: CoordinatorServer, nodes: tuple[Node, Node]
) -> None:
    a = CoordinatorClient(server.address, node=nodes[0], owner="a", settings=FAST)
    b = CoordinatorClient(server.address, node=nodes[1], owner="b", settings=FAST)
    try:
        updates_b = Updates()
        assert a.register(GROUP, 1, Updates()).active
        assert not b.register(GROUP, 1, updates_b).active

        a.close(goodbye=False)  # the node no longer vouches for a's connection

        wait_until(updates_b.activated, "b to be activated")
        assert labels(server) == {"b": "active (connected)"}
        assert server.statistics().probes_gone == 1
    finally:
        b.close()
        a.close()


def test_a_client_named_by_a_string_is_not_probed(server: CoordinatorServer) -> None:
    a = CoordinatorClient(server.address, node="somewhere:1", owner="a", settings=FAST)
    b = CoordinatorClient(server.address, owner="b", settings=FAST)
    try:
        assert a.register(GROUP, 1, Updates()).active
        assert not b.register(GROUP, 1, Updates()).active

        a.close(goodbye=False)

        wait_until(lambda: labels(server)["a"] == "active (disconnected)", "a to be lost")
        stats = server.statistics()
        assert (stats.probes_gone, stats.probes_alive, stats.probes_no_answer) == (0, 0, 0)
    finally:
        b.close()


def test_a_client_given_a_node_names_itself_by_the_nodes_address(
    server: CoordinatorServer, nodes: tuple[Node, Node]
) -> None:
    with CoordinatorClient(server.address, node=nodes[0], settings=FAST) as client:
        assert client.node == nodes[0].address


def test_a_client_given_a_node_not_started_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match="start the Node first"):
        CoordinatorClient("127.0.0.1:1", node=Node())
