"""The coordinator's wire form: protobuf messages (protocol/coordinator.proto) to and
from the coordinator's commands, replies, updates and listings.

Shared by the service (`service.py`) and the client (`client.py`), so each mapping is
written once. Building a command checks its values (the command's own ``__post_init__``);
a bad request is a `ValueError` naming the field, which the service returns as a refusal
(``REFUSAL_INVALID_REQUEST``).
"""

from __future__ import annotations

from typing import Any

from pykka_delivery.coordinator import catalog_wire
from pykka_delivery.coordinator.activations import ConsumerId, Handover, HandoverReason
from pykka_delivery.coordinator.actor import (
    DeregisterService,
    RegisterService,
    UnwatchService,
    WatchService,
)
from pykka_delivery.coordinator.commands import (
    OK,
    ActivateConsumer,
    CreateStream,
    Ok,
    Refusal,
    Refused,
    RegisterConsumer,
    Registered,
    Reply,
    UnregisterConsumer,
)
from pykka_delivery.coordinator.directory import ServiceEntry, ServiceKey
from pykka_delivery.coordinator.effects import SendConsumerUpdate
from pykka_delivery.coordinator.queries import GroupInfo, StreamInfo
from pykka_delivery.coordinator.state import (
    SIMPLE,
    Activity,
    Connectivity,
    Consumer,
    GroupId,
    StreamId,
)
from pykka_delivery.protocol import coordinator_pb2 as pb

__all__ = [
    "DIRECTORY_REQUESTS",
    "INVALID_REQUEST",
    "activate_message",
    "command_of",
    "create_stream_message",
    "deregister_service_message",
    "directory_request_of",
    "goodbye_message",
    "group_id",
    "group_key",
    "groups_from_message",
    "groups_message",
    "hello_message",
    "invalid_request_message",
    "listing_message",
    "listing_of",
    "refusal_reason",
    "register_message",
    "register_service_message",
    "reply_message",
    "reply_of",
    "streams_from_message",
    "streams_message",
    "unregister_message",
    "unwatch_service_message",
    "update_message",
    "watch_service_message",
]

INVALID_REQUEST = "invalid_request"
"""Reason of a refusal for a request whose fields are invalid (not a `Refusal`: the
coordinator's machine never sees such a request)."""

_REFUSAL_TO_WIRE = {r: getattr(pb, f"REFUSAL_{r.name}") for r in Refusal}
_REFUSAL_FROM_WIRE = {v: r.value for r, v in _REFUSAL_TO_WIRE.items()}
_CONNECTIVITY_TO_WIRE = {c: getattr(pb, f"CONNECTIVITY_{c.name}") for c in Connectivity}
_CONNECTIVITY_FROM_WIRE = {v: c for c, v in _CONNECTIVITY_TO_WIRE.items()}
_ACTIVITY_TO_WIRE = {a: getattr(pb, f"ACTIVITY_{a.name}") for a in Activity}
_ACTIVITY_FROM_WIRE = {v: a for a, v in _ACTIVITY_TO_WIRE.items()}
_REASON_TO_WIRE: dict[HandoverReason, Any] = {
    r: getattr(pb, f"HANDOVER_REASON_{r.name}")
    for r in HandoverReason
    if r is not HandoverReason.UNKNOWN
}
_REASON_FROM_WIRE = {v: r for r, v in _REASON_TO_WIRE.items()}


def group_key(group: GroupId) -> pb.GroupKey:
    return pb.GroupKey(namespace=group.namespace, stream=group.stream, name=group.name)


def group_id(key: pb.GroupKey) -> GroupId:
    return GroupId(key.namespace, key.stream, key.name)


# --- client side: requests ------------------------------------------------------------


def hello_message(
    request_id: int, connection_id: str, node: str, owner: str, probe_address: str = ""
) -> pb.ClientMessage:
    hello = pb.Hello(
        connection_id=connection_id, node=node, owner=owner, probe_address=probe_address
    )
    return pb.ClientMessage(request_id=request_id, hello=hello)


def register_message(
    request_id: int, group: GroupId, subscription_id: int, partition_index: int
) -> pb.ClientMessage:
    register = pb.Register(group=group_key(group), subscription_id=subscription_id)
    if partition_index != SIMPLE:
        register.partition_index = partition_index
    return pb.ClientMessage(request_id=request_id, register=register)


def unregister_message(request_id: int, group: GroupId, subscription_id: int) -> pb.ClientMessage:
    unregister = pb.Unregister(group=group_key(group), subscription_id=subscription_id)
    return pb.ClientMessage(request_id=request_id, unregister=unregister)


def activate_message(
    request_id: int, group: GroupId, subscription_id: int | None, epoch: int = 0
) -> pb.ClientMessage:
    activate = pb.Activate(group=group_key(group), epoch=epoch)
    if subscription_id is not None:
        activate.subscription_id = subscription_id
    return pb.ClientMessage(request_id=request_id, activate=activate)


def create_stream_message(request_id: int, command: CreateStream) -> pb.ClientMessage:
    body = pb.CreateStream(
        namespace=command.namespace, name=command.name, partitions=command.partitions
    )
    return pb.ClientMessage(request_id=request_id, create_stream=body)


def goodbye_message() -> pb.ClientMessage:
    return pb.ClientMessage(goodbye=pb.Goodbye())


# --- server side: requests to commands, replies and updates to the wire ----------------


def command_of(
    message: pb.ClientMessage, connection: str, node: str, owner: str
) -> RegisterConsumer | UnregisterConsumer | ActivateConsumer | CreateStream:
    """The command a register, unregister, activate or create_stream message asks for,
    on behalf of ``connection`` (the stream's hello).

    Raises:
        ValueError: a field is invalid (the message names it), or the message is not one
            of those four.
    """
    kind = message.WhichOneof("body")
    if kind == "register":
        r = message.register
        index = r.partition_index if r.HasField("partition_index") else SIMPLE
        g = r.group
        return RegisterConsumer(
            g.namespace, g.stream, g.name, connection, r.subscription_id, node, index, owner
        )
    if kind == "unregister":
        u = message.unregister
        g = u.group
        return UnregisterConsumer(g.namespace, g.stream, g.name, connection, u.subscription_id)
    if kind == "activate":
        a = message.activate
        g = a.group
        if a.HasField("subscription_id"):
            return ActivateConsumer(
                g.namespace, g.stream, g.name, connection, a.subscription_id, a.epoch
            )
        return ActivateConsumer(g.namespace, g.stream, g.name, epoch=a.epoch)
    if kind == "create_stream":
        c = message.create_stream
        return CreateStream(c.namespace, c.name, c.partitions)
    msg = (
        f"expected register, unregister, activate or create_stream, "
        f"got {kind or 'an empty message'}"
    )
    raise ValueError(msg)


# --- the service directory -------------------------------------------------------------

DIRECTORY_REQUESTS = (
    frozenset({"register_service", "deregister_service", "watch_service", "unwatch_service"})
    | catalog_wire.CATALOG_REQUESTS
)
"""The ``ClientMessage`` bodies that are requests to the service directory or about the
catalog's producers (asked of the actor, not commands of its machine)."""

DirectoryRequest = (
    RegisterService
    | DeregisterService
    | WatchService
    | UnwatchService
    | catalog_wire.CatalogRequest
)


def directory_request_of(message: pb.ClientMessage, connection: str, node: str) -> DirectoryRequest:
    """The directory or catalog request a client message asks for, on behalf of
    ``connection``.

    Raises:
        ValueError: a field is invalid (the message names it), or the message is not a
            directory request.
    """
    kind = message.WhichOneof("body")
    if kind == "register_service":
        r = message.register_service
        entry = ServiceEntry(r.address, connection, r.registration_id, node)
        return RegisterService(ServiceKey(r.namespace, r.key), entry)
    if kind == "deregister_service":
        d = message.deregister_service
        return DeregisterService(ServiceKey(d.namespace, d.key), connection, d.registration_id)
    if kind == "watch_service":
        w = message.watch_service
        return WatchService(ServiceKey(w.namespace, w.key), connection)
    if kind == "unwatch_service":
        u = message.unwatch_service
        return UnwatchService(ServiceKey(u.namespace, u.key), connection)
    if kind in catalog_wire.CATALOG_REQUESTS:
        return catalog_wire.catalog_request_of(message, connection, node)
    msg = f"expected a service directory request, got {kind or 'an empty message'}"
    raise ValueError(msg)


def register_service_message(
    request_id: int, key: ServiceKey, address: str, registration_id: int
) -> pb.ClientMessage:
    body = pb.RegisterService(
        namespace=key.namespace, key=key.key, address=address, registration_id=registration_id
    )
    return pb.ClientMessage(request_id=request_id, register_service=body)


def deregister_service_message(
    request_id: int, key: ServiceKey, registration_id: int
) -> pb.ClientMessage:
    body = pb.DeregisterService(
        namespace=key.namespace, key=key.key, registration_id=registration_id
    )
    return pb.ClientMessage(request_id=request_id, deregister_service=body)


def watch_service_message(request_id: int, key: ServiceKey) -> pb.ClientMessage:
    body = pb.WatchService(namespace=key.namespace, key=key.key)
    return pb.ClientMessage(request_id=request_id, watch_service=body)


def unwatch_service_message(request_id: int, key: ServiceKey) -> pb.ClientMessage:
    body = pb.UnwatchService(namespace=key.namespace, key=key.key)
    return pb.ClientMessage(request_id=request_id, unwatch_service=body)


def listing_message(key: ServiceKey, entries: tuple[ServiceEntry, ...]) -> pb.ServerMessage:
    listing = pb.ServiceListing(namespace=key.namespace, key=key.key)
    for e in entries:
        listing.entries.add(
            address=e.address,
            connection=e.connection,
            registration_id=e.registration_id,
            node=e.node,
        )
    return pb.ServerMessage(listing=listing)


def listing_of(listing: pb.ServiceListing) -> tuple[ServiceKey, tuple[ServiceEntry, ...]]:
    entries = tuple(
        ServiceEntry(e.address, e.connection, e.registration_id, e.node) for e in listing.entries
    )
    return ServiceKey(listing.namespace, listing.key), entries


def reply_message(request_id: int, reply: Reply) -> pb.ServerMessage:
    out = pb.Reply(request_id=request_id)
    if isinstance(reply, Registered):
        out.registered.active = reply.active
        out.registered.epoch = reply.epoch
    elif isinstance(reply, Refused):
        out.refused.reason = _REFUSAL_TO_WIRE[reply.reason]
        out.refused.message = reply.message
    else:
        out.ok.SetInParent()
    return pb.ServerMessage(reply=out)


def invalid_request_message(request_id: int, message: str) -> pb.ServerMessage:
    refused = pb.Refused(reason=pb.REFUSAL_INVALID_REQUEST, message=message)
    return pb.ServerMessage(reply=pb.Reply(request_id=request_id, refused=refused))


def update_message(update: SendConsumerUpdate) -> pb.ServerMessage:
    wire = pb.ConsumerUpdate(
        group=group_key(update.group),
        subscription_id=update.subscription_id,
        active=update.active,
        epoch=update.epoch,
    )
    return pb.ServerMessage(update=wire)


# --- client side: replies ----------------------------------------------------------------


def refusal_reason(refused: pb.Refused) -> str:
    """A wire refusal's reason: a `Refusal` value, `INVALID_REQUEST`, or ``"unknown"``
    (a newer server's reason)."""
    if refused.reason == pb.REFUSAL_INVALID_REQUEST:
        return INVALID_REQUEST
    return _REFUSAL_FROM_WIRE.get(refused.reason, "unknown")


def reply_of(reply: pb.Reply) -> Ok | Registered | pb.Refused:
    """The reply as the machine gave it, except a refusal, left in its wire form (its
    reason may be `INVALID_REQUEST`, which no `Refusal` stands for)."""
    kind = reply.WhichOneof("result")
    if kind == "registered":
        return Registered(reply.registered.active, reply.registered.epoch)
    if kind == "refused":
        return reply.refused
    return OK


# --- listings ------------------------------------------------------------------------------


def groups_message(groups: tuple[GroupInfo, ...]) -> pb.ListGroupsReply:
    out = pb.ListGroupsReply()
    for info in groups:
        wire = out.groups.add(
            group=group_key(info.group),
            partition_index=info.partition_index,
            disconnected_timeout=info.disconnected_timeout,
            listed_at=info.listed_at,
        )
        for c in info.consumers:
            wire.consumers.add(
                connection=c.connection,
                subscription_id=c.subscription_id,
                node=c.node,
                owner=c.owner,
                connectivity=_CONNECTIVITY_TO_WIRE[c.connectivity],
                activity=_ACTIVITY_TO_WIRE[c.activity],
                disconnected_at=c.disconnected_at,
                epoch=c.epoch,
            )
        if info.last_handover is not None:
            _handover_to_wire(info.last_handover, wire.last_handover)
    return out


def _handover_to_wire(handover: Handover, out: pb.Handover) -> None:
    out.at = handover.at
    if handover.from_consumer is not None:
        _consumer_id_to_wire(handover.from_consumer, out.from_consumer)
    _consumer_id_to_wire(handover.to_consumer, out.to_consumer)
    out.reason = _REASON_TO_WIRE.get(handover.reason, pb.HANDOVER_REASON_UNSPECIFIED)
    out.duration = handover.duration


def _consumer_id_to_wire(consumer: ConsumerId, out: pb.ConsumerId) -> None:
    out.connection = consumer.connection
    out.subscription_id = consumer.subscription_id
    out.owner = consumer.owner


def _consumer_id_of(wire: pb.ConsumerId) -> ConsumerId:
    return ConsumerId(wire.connection, wire.subscription_id, wire.owner)


def _handover_of(g: pb.GroupStatus) -> Handover | None:
    if not g.HasField("last_handover"):
        return None  # an older server, or no hand-over yet
    h = g.last_handover
    return Handover(
        h.at,
        _consumer_id_of(h.from_consumer) if h.HasField("from_consumer") else None,
        _consumer_id_of(h.to_consumer),
        _REASON_FROM_WIRE.get(h.reason, HandoverReason.UNKNOWN),
        h.duration,
    )


def groups_from_message(reply: pb.ListGroupsReply) -> tuple[GroupInfo, ...]:
    """The listing as `GroupInfo` records. From an older server, which sends neither
    hand-overs nor times nor epochs, ``disconnected_at``, ``disconnected_timeout``,
    ``listed_at`` and each consumer's ``epoch`` read 0."""
    return tuple(
        GroupInfo(
            group_id(g.group),
            g.partition_index,
            tuple(
                Consumer(
                    c.connection,
                    c.subscription_id,
                    c.node,
                    c.owner,
                    _CONNECTIVITY_FROM_WIRE.get(c.connectivity, Connectivity.CONNECTED),
                    _ACTIVITY_FROM_WIRE.get(c.activity, Activity.WAITING),
                    c.disconnected_at,
                    c.epoch,
                )
                for c in g.consumers
            ),
            _handover_of(g),
            g.disconnected_timeout,
            g.listed_at,
        )
        for g in reply.groups
    )


def streams_message(streams: tuple[StreamInfo, ...]) -> pb.ListStreamsReply:
    out = pb.ListStreamsReply()
    for info in streams:
        status = out.streams.add(
            namespace=info.stream.namespace, name=info.stream.name, partitions=info.partitions
        )
        catalog_wire.add_producers(status, info.producers)
    return out


def streams_from_message(reply: pb.ListStreamsReply) -> tuple[StreamInfo, ...]:
    return tuple(
        StreamInfo(StreamId(s.namespace, s.name), s.partitions, catalog_wire.producers_of(s))
        for s in reply.streams
    )
