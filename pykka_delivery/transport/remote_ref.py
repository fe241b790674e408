"""`RemoteRef`: a ref to something exposed on a node, told from any thread."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pykka_delivery.protocol.serialization import Serialization
    from pykka_delivery.transport._peer import Peer
    from pykka_delivery.transport.node import Node

__all__ = ["RemoteRef"]


class RemoteRef:
    """A ref to something exposed on a node: ``host:port/name``. ``tell`` from any thread.

    On its own node it tells the local target directly; elsewhere it queues the message
    for the peer's link, and declares so (`EncodesPayloads`). Equal refs have equal paths.
    """

    __slots__ = ("_node", "_peer", "name", "node_address", "path")

    def __init__(self, node: Node, path: str) -> None:
        node_address, sep, name = path.partition("/")
        if not sep or not node_address or not name:
            msg = f"not a remote address: {path!r} (expected 'host:port/name')"
            raise ValueError(msg)
        problem = _address_problem(node_address)
        if problem:
            msg = (
                f"not a remote address: {path!r}: {problem} (expected 'host:port/name', "
                "e.g. 'localhost:7001/orders')"
            )
            raise ValueError(msg)
        self._node = node
        self.path = path
        self.node_address = node_address
        self.name = name
        self._peer: Peer | None = None

    def __repr__(self) -> str:
        return f"RemoteRef({self.path})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemoteRef) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def link_problem(self) -> str | None:
        """Why messages to this address are not getting through, as far as this node
        knows (`ReportsLinkProblem`): the link is down, or the node at the other end said
        nothing is exposed under this name there; None while both work or were never
        tried."""
        node = self._node
        if self.node_address != node.address:
            problem = node.link_problem(self.node_address)
            if problem is not None:
                return f"the link to {self.node_address} is down: {problem}"
        return node._missing_target(self.node_address, self.name)

    def payload_serialization(self) -> Serialization | None:
        """The serializers the node encodes what is told here with (`EncodesPayloads`:
        a producer checks its payloads with them before it accepts them); None for a ref to
        this node's own address, which is told in-process."""
        if self.node_address == self._node.address:
            return None
        return self._node._serialization

    def tell(self, message: Any) -> None:
        peer = self._peer
        if peer is None:
            if self.node_address == self._node.address:
                self._node._deliver_local(self.name, message)
                return
            peer = self._peer = self._node._peer(self.node_address)
        peer.enqueue(self.name, message)


def _address_problem(node_address: str) -> str:
    """What is wrong with a node's ``host:port`` (``[v6]:port`` too), or "" if nothing."""
    host, sep, port = node_address.rpartition(":")
    if not sep or not host:
        return f"{node_address!r} has no port"
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        return f"port {port!r} of {node_address!r} is not a number from 1 to 65535"
    if host.startswith("[") != host.endswith("]"):
        return f"host {host!r} of {node_address!r} is not a name, IPv4 or [IPv6] address"
    return ""
