"""The server side of a node's link (``Node.Link``): who may open one, then reading it;
and the coordinator's liveness probe (``Node.Probe``).

A link is refused, counted in ``rejected_links``, when its call lacks the cluster's token
(``UNAUTHENTICATED``), when its first frame is not a ``Hello`` (``INVALID_ARGUMENT``), and,
with mutual TLS, when the node address the ``Hello`` claims is not one the peer's
certificate names (``PERMISSION_DENIED``, see ``identity.py``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import grpc

from pykka_delivery.protocol import transport_pb2
from pykka_delivery.transport._peer import Stream
from pykka_delivery.transport.grpc_setup import bearer_token_ok, read_or_refuse
from pykka_delivery.transport.identity import claim_problem

if TYPE_CHECKING:
    from pykka_delivery.transport.node import Node

__all__ = ["LINK_SERVICE", "NODE_METADATA", "LinkServicer"]

logger = logging.getLogger("pykka_delivery.transport")

LINK_SERVICE = "pykka_delivery.transport.v1.Node"
# The call metadata key in which a dialling node says who it is before it writes its Hello
# (nodes that predate it only send the Hello).
NODE_METADATA = "pykka-delivery-node"


class LinkServicer:
    """The server side of ``Node.Link``. Frames arrive as bytes and are parsed here
    (`read_or_refuse`): one that does not parse ends the link with ``INVALID_ARGUMENT`` and
    is counted (``malformed``)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        tls = node.settings.tls
        # Only a server that demands certificates knows who its peers are.
        self.verify_address = (
            tls is not None and tls.require_client_auth and tls.verify_peer_address
        )

    def handler(self) -> grpc.GenericRpcHandler:
        link = grpc.stream_stream_rpc_method_handler(
            self.Link,
            request_deserializer=bytes,  # parsed by _read
            response_serializer=transport_pb2.Frame.SerializeToString,
        )
        probe = grpc.unary_unary_rpc_method_handler(
            self.Probe,
            request_deserializer=transport_pb2.ProbeRequest.FromString,
            response_serializer=transport_pb2.ProbeReply.SerializeToString,
        )
        return grpc.method_handlers_generic_handler(LINK_SERVICE, {"Link": link, "Probe": probe})

    async def Probe(
        self, request: transport_pb2.ProbeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> transport_pb2.ProbeReply:
        """The coordinator's liveness probe: whether a client of this process holds
        ``connection_id`` (`Node.host_connection`). The same token rule as a link."""
        if not bearer_token_ok(context.invocation_metadata(), self.node.settings.token):
            await self._refuse(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong token: give the coordinator the cluster's node token "
                "(CoordinatorServerSettings.probe_token)",
            )
        return transport_pb2.ProbeReply(known=request.connection_id in self.node._hosted)

    async def Link(
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        node = self.node
        metadata = context.invocation_metadata() or ()
        if not bearer_token_ok(metadata, node.settings.token):
            await self._refuse(
                context,
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong token: give the node the cluster's NodeSettings.token",
            )
        announced = next((str(v) for k, v in metadata if k == NODE_METADATA), None)
        if announced is not None:
            await self._verify(context, announced)
        # Tells the dialler its link is accepted: it writes only then, since a write racing
        # a refusal would hide the refusal's status behind an INTERNAL one.
        await context.send_initial_metadata(())
        first = await self._read(context)
        if first is None or not first.HasField("hello") or not first.hello.node:
            await self._refuse(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                "the first frame of a link must be a Hello",
            )
        claimed = first.hello.node
        if claimed != announced:  # a node that predates NODE_METADATA, or an odd one
            await self._verify(context, claimed)
        peer = node._peer(claimed)
        stream = Stream(context.write, lambda: None)
        peer.attach(stream)
        node._deliver(first, peer)
        try:
            while stream.alive:
                frame = await self._read(context)
                if frame is None:
                    break
                node._deliver(frame, peer)
        finally:
            peer.detach(stream)

    async def _verify(self, context: grpc.aio.ServicerContext[Any, Any], claimed: str) -> None:
        """With mutual TLS, refuse the link unless the peer's certificate names the host
        of the node address it ``claimed``."""
        if not self.verify_address:
            return
        problem = claim_problem(claimed, context.auth_context())
        if problem is not None:
            logger.warning("Link from %s refused: %s", context.peer(), problem)
            await self._refuse(context, grpc.StatusCode.PERMISSION_DENIED, problem)

    async def _refuse(
        self, context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, details: str
    ) -> None:
        """Count a refused link and end its call with ``code`` (this raises)."""
        self.node._counters.rejected_links += 1
        await context.abort(code, details)

    def _read(self, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        """The next frame of the link (a coroutine), None at its end."""
        return read_or_refuse(
            context, transport_pb2.Frame.FromString, self._malformed, "a transport Frame"
        )

    def _malformed(self) -> None:
        self.node._counters.malformed += 1
