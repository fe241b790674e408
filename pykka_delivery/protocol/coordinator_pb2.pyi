from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Refusal(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REFUSAL_UNSPECIFIED: _ClassVar[Refusal]
    REFUSAL_PARTITION_INDEX_CONFLICT: _ClassVar[Refusal]
    REFUSAL_GROUP_NOT_FOUND: _ClassVar[Refusal]
    REFUSAL_CONSUMER_NOT_FOUND: _ClassVar[Refusal]
    REFUSAL_UNKNOWN_COMMAND: _ClassVar[Refusal]
    REFUSAL_INVALID_REQUEST: _ClassVar[Refusal]
    REFUSAL_PARTITIONS_SHRINK: _ClassVar[Refusal]
    REFUSAL_PARTITIONS_OVER_LIMIT: _ClassVar[Refusal]
    REFUSAL_STREAM_NOT_FOUND: _ClassVar[Refusal]
    REFUSAL_PRODUCER_CONFLICT: _ClassVar[Refusal]

class Connectivity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CONNECTIVITY_UNSPECIFIED: _ClassVar[Connectivity]
    CONNECTIVITY_CONNECTED: _ClassVar[Connectivity]
    CONNECTIVITY_DISCONNECTED: _ClassVar[Connectivity]
    CONNECTIVITY_PRESUMED_DOWN: _ClassVar[Connectivity]

class Activity(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ACTIVITY_UNSPECIFIED: _ClassVar[Activity]
    ACTIVITY_ACTIVE: _ClassVar[Activity]
    ACTIVITY_WAITING: _ClassVar[Activity]
    ACTIVITY_DEACTIVATING: _ClassVar[Activity]

class HandoverReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HANDOVER_REASON_UNSPECIFIED: _ClassVar[HandoverReason]
    HANDOVER_REASON_REGISTERED: _ClassVar[HandoverReason]
    HANDOVER_REASON_REBALANCED: _ClassVar[HandoverReason]
    HANDOVER_REASON_STEPPED_DOWN: _ClassVar[HandoverReason]
    HANDOVER_REASON_UNREGISTERED: _ClassVar[HandoverReason]
    HANDOVER_REASON_CONNECTION_CLOSED: _ClassVar[HandoverReason]
    HANDOVER_REASON_CONNECTION_LOST: _ClassVar[HandoverReason]
    HANDOVER_REASON_PRESUMED_DOWN: _ClassVar[HandoverReason]
    HANDOVER_REASON_RECONNECTED: _ClassVar[HandoverReason]
    HANDOVER_REASON_PURGED: _ClassVar[HandoverReason]
    HANDOVER_REASON_EVALUATED: _ClassVar[HandoverReason]
REFUSAL_UNSPECIFIED: Refusal
REFUSAL_PARTITION_INDEX_CONFLICT: Refusal
REFUSAL_GROUP_NOT_FOUND: Refusal
REFUSAL_CONSUMER_NOT_FOUND: Refusal
REFUSAL_UNKNOWN_COMMAND: Refusal
REFUSAL_INVALID_REQUEST: Refusal
REFUSAL_PARTITIONS_SHRINK: Refusal
REFUSAL_PARTITIONS_OVER_LIMIT: Refusal
REFUSAL_STREAM_NOT_FOUND: Refusal
REFUSAL_PRODUCER_CONFLICT: Refusal
CONNECTIVITY_UNSPECIFIED: Connectivity
CONNECTIVITY_CONNECTED: Connectivity
CONNECTIVITY_DISCONNECTED: Connectivity
CONNECTIVITY_PRESUMED_DOWN: Connectivity
ACTIVITY_UNSPECIFIED: Activity
ACTIVITY_ACTIVE: Activity
ACTIVITY_WAITING: Activity
ACTIVITY_DEACTIVATING: Activity
HANDOVER_REASON_UNSPECIFIED: HandoverReason
HANDOVER_REASON_REGISTERED: HandoverReason
HANDOVER_REASON_REBALANCED: HandoverReason
HANDOVER_REASON_STEPPED_DOWN: HandoverReason
HANDOVER_REASON_UNREGISTERED: HandoverReason
HANDOVER_REASON_CONNECTION_CLOSED: HandoverReason
HANDOVER_REASON_CONNECTION_LOST: HandoverReason
HANDOVER_REASON_PRESUMED_DOWN: HandoverReason
HANDOVER_REASON_RECONNECTED: HandoverReason
HANDOVER_REASON_PURGED: HandoverReason
HANDOVER_REASON_EVALUATED: HandoverReason

class GroupKey(_message.Message):
    __slots__ = ("namespace", "stream", "name")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    stream: str
    name: str
    def __init__(self, namespace: _Optional[str] = ..., stream: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("connection_id", "node", "owner", "probe_address")
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PROBE_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    connection_id: str
    node: str
    owner: str
    probe_address: str
    def __init__(self, connection_id: _Optional[str] = ..., node: _Optional[str] = ..., owner: _Optional[str] = ..., probe_address: _Optional[str] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("group", "subscription_id", "partition_index")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    group: GroupKey
    subscription_id: int
    partition_index: int
    def __init__(self, group: _Optional[_Union[GroupKey, _Mapping]] = ..., subscription_id: _Optional[int] = ..., partition_index: _Optional[int] = ...) -> None: ...

class Unregister(_message.Message):
    __slots__ = ("group", "subscription_id")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    group: GroupKey
    subscription_id: int
    def __init__(self, group: _Optional[_Union[GroupKey, _Mapping]] = ..., subscription_id: _Optional[int] = ...) -> None: ...

class Activate(_message.Message):
    __slots__ = ("group", "subscription_id", "epoch")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    group: GroupKey
    subscription_id: int
    epoch: int
    def __init__(self, group: _Optional[_Union[GroupKey, _Mapping]] = ..., subscription_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class Goodbye(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RegisterService(_message.Message):
    __slots__ = ("namespace", "key", "address", "registration_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    address: str
    registration_id: int
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ..., address: _Optional[str] = ..., registration_id: _Optional[int] = ...) -> None: ...

class DeregisterService(_message.Message):
    __slots__ = ("namespace", "key", "registration_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    registration_id: int
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ..., registration_id: _Optional[int] = ...) -> None: ...

class WatchService(_message.Message):
    __slots__ = ("namespace", "key")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class UnwatchService(_message.Message):
    __slots__ = ("namespace", "key")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ...) -> None: ...

class CreateStream(_message.Message):
    __slots__ = ("namespace", "name", "partitions")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    partitions: int
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., partitions: _Optional[int] = ...) -> None: ...

class RegisterProducer(_message.Message):
    __slots__ = ("namespace", "stream", "name", "address", "partitions", "registration_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    stream: str
    name: str
    address: str
    partitions: int
    registration_id: int
    def __init__(self, namespace: _Optional[str] = ..., stream: _Optional[str] = ..., name: _Optional[str] = ..., address: _Optional[str] = ..., partitions: _Optional[int] = ..., registration_id: _Optional[int] = ...) -> None: ...

class DeregisterProducer(_message.Message):
    __slots__ = ("namespace", "stream", "registration_id")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    stream: str
    registration_id: int
    def __init__(self, namespace: _Optional[str] = ..., stream: _Optional[str] = ..., registration_id: _Optional[int] = ...) -> None: ...

class WatchStreams(_message.Message):
    __slots__ = ("namespace", "pattern")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    pattern: str
    def __init__(self, namespace: _Optional[str] = ..., pattern: _Optional[str] = ...) -> None: ...

class UnwatchStreams(_message.Message):
    __slots__ = ("namespace", "pattern")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    pattern: str
    def __init__(self, namespace: _Optional[str] = ..., pattern: _Optional[str] = ...) -> None: ...

class ProducerPosition(_message.Message):
    __slots__ = ("namespace", "stream", "partition_index", "producer_id", "sent", "confirmed", "oldest_unconfirmed_age", "group")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNCONFIRMED_AGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    stream: str
    partition_index: int
    producer_id: str
    sent: int
    confirmed: int
    oldest_unconfirmed_age: float
    group: str
    def __init__(self, namespace: _Optional[str] = ..., stream: _Optional[str] = ..., partition_index: _Optional[int] = ..., producer_id: _Optional[str] = ..., sent: _Optional[int] = ..., confirmed: _Optional[int] = ..., oldest_unconfirmed_age: _Optional[float] = ..., group: _Optional[str] = ...) -> None: ...

class ConsumerPosition(_message.Message):
    __slots__ = ("namespace", "stream", "group", "partition_index", "producer_id", "received", "confirmed")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    RECEIVED_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    stream: str
    group: str
    partition_index: int
    producer_id: str
    received: int
    confirmed: int
    def __init__(self, namespace: _Optional[str] = ..., stream: _Optional[str] = ..., group: _Optional[str] = ..., partition_index: _Optional[int] = ..., producer_id: _Optional[str] = ..., received: _Optional[int] = ..., confirmed: _Optional[int] = ...) -> None: ...

class Positions(_message.Message):
    __slots__ = ("producers", "consumers")
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    producers: _containers.RepeatedCompositeFieldContainer[ProducerPosition]
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerPosition]
    def __init__(self, producers: _Optional[_Iterable[_Union[ProducerPosition, _Mapping]]] = ..., consumers: _Optional[_Iterable[_Union[ConsumerPosition, _Mapping]]] = ...) -> None: ...

class ClientMessage(_message.Message):
    __slots__ = ("request_id", "hello", "register", "unregister", "activate", "goodbye", "register_service", "deregister_service", "watch_service", "unwatch_service", "create_stream", "positions", "register_producer", "deregister_producer", "watch_streams", "unwatch_streams")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HELLO_FIELD_NUMBER: _ClassVar[int]
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    UNREGISTER_FIELD_NUMBER: _ClassVar[int]
    ACTIVATE_FIELD_NUMBER: _ClassVar[int]
    GOODBYE_FIELD_NUMBER: _ClassVar[int]
    REGISTER_SERVICE_FIELD_NUMBER: _ClassVar[int]
    DEREGISTER_SERVICE_FIELD_NUMBER: _ClassVar[int]
    WATCH_SERVICE_FIELD_NUMBER: _ClassVar[int]
    UNWATCH_SERVICE_FIELD_NUMBER: _ClassVar[int]
    CREATE_STREAM_FIELD_NUMBER: _ClassVar[int]
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    REGISTER_PRODUCER_FIELD_NUMBER: _ClassVar[int]
    DEREGISTER_PRODUCER_FIELD_NUMBER: _ClassVar[int]
    WATCH_STREAMS_FIELD_NUMBER: _ClassVar[int]
    UNWATCH_STREAMS_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    hello: Hello
    register: Register
    unregister: Unregister
    activate: Activate
    goodbye: Goodbye
    register_service: RegisterService
    deregister_service: DeregisterService
    watch_service: WatchService
    unwatch_service: UnwatchService
    create_stream: CreateStream
    positions: Positions
    register_producer: RegisterProducer
    deregister_producer: DeregisterProducer
    watch_streams: WatchStreams
    unwatch_streams: UnwatchStreams
    def __init__(self, request_id: _Optional[int] = ..., hello: _Optional[_Union[Hello, _Mapping]] = ..., register: _Optional[_Union[Register, _Mapping]] = ..., unregister: _Optional[_Union[Unregister, _Mapping]] = ..., activate: _Optional[_Union[Activate, _Mapping]] = ..., goodbye: _Optional[_Union[Goodbye, _Mapping]] = ..., register_service: _Optional[_Union[RegisterService, _Mapping]] = ..., deregister_service: _Optional[_Union[DeregisterService, _Mapping]] = ..., watch_service: _Optional[_Union[WatchService, _Mapping]] = ..., unwatch_service: _Optional[_Union[UnwatchService, _Mapping]] = ..., create_stream: _Optional[_Union[CreateStream, _Mapping]] = ..., positions: _Optional[_Union[Positions, _Mapping]] = ..., register_producer: _Optional[_Union[RegisterProducer, _Mapping]] = ..., deregister_producer: _Optional[_Union[DeregisterProducer, _Mapping]] = ..., watch_streams: _Optional[_Union[WatchStreams, _Mapping]] = ..., unwatch_streams: _Optional[_Union[UnwatchStreams, _Mapping]] = ...) -> None: ...

class Ok(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Registered(_message.Message):
    __slots__ = ("active", "epoch")
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    active: bool
    epoch: int
    def __init__(self, active: _Optional[bool] = ..., epoch: _Optional[int] = ...) -> None: ...

class Refused(_message.Message):
    __slots__ = ("reason", "message")
    REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    reason: Refusal
    message: str
    def __init__(self, reason: _Optional[_Union[Refusal, str]] = ..., message: _Optional[str] = ...) -> None: ...

class Reply(_message.Message):
    __slots__ = ("request_id", "ok", "registered", "refused")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OK_FIELD_NUMBER: _ClassVar[int]
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    ok: Ok
    registered: Registered
    refused: Refused
    def __init__(self, request_id: _Optional[int] = ..., ok: _Optional[_Union[Ok, _Mapping]] = ..., registered: _Optional[_Union[Registered, _Mapping]] = ..., refused: _Optional[_Union[Refused, _Mapping]] = ...) -> None: ...

class ConsumerUpdate(_message.Message):
    __slots__ = ("group", "subscription_id", "active", "epoch")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    group: GroupKey
    subscription_id: int
    active: bool
    epoch: int
    def __init__(self, group: _Optional[_Union[GroupKey, _Mapping]] = ..., subscription_id: _Optional[int] = ..., active: _Optional[bool] = ..., epoch: _Optional[int] = ...) -> None: ...

class ServiceEntry(_message.Message):
    __slots__ = ("address", "connection", "registration_id", "node")
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    address: str
    connection: str
    registration_id: int
    node: str
    def __init__(self, address: _Optional[str] = ..., connection: _Optional[str] = ..., registration_id: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class ServiceListing(_message.Message):
    __slots__ = ("namespace", "key", "entries")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    key: str
    entries: _containers.RepeatedCompositeFieldContainer[ServiceEntry]
    def __init__(self, namespace: _Optional[str] = ..., key: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[ServiceEntry, _Mapping]]] = ...) -> None: ...

class StreamProducer(_message.Message):
    __slots__ = ("name", "address", "partitions", "connection", "registration_id", "node")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    REGISTRATION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    name: str
    address: str
    partitions: int
    connection: str
    registration_id: int
    node: str
    def __init__(self, name: _Optional[str] = ..., address: _Optional[str] = ..., partitions: _Optional[int] = ..., connection: _Optional[str] = ..., registration_id: _Optional[int] = ..., node: _Optional[str] = ...) -> None: ...

class StreamCatalog(_message.Message):
    __slots__ = ("namespace", "pattern", "streams")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    PATTERN_FIELD_NUMBER: _ClassVar[int]
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    pattern: str
    streams: _containers.RepeatedCompositeFieldContainer[StreamStatus]
    def __init__(self, namespace: _Optional[str] = ..., pattern: _Optional[str] = ..., streams: _Optional[_Iterable[_Union[StreamStatus, _Mapping]]] = ...) -> None: ...

class ServerMessage(_message.Message):
    __slots__ = ("reply", "update", "listing", "catalog")
    REPLY_FIELD_NUMBER: _ClassVar[int]
    UPDATE_FIELD_NUMBER: _ClassVar[int]
    LISTING_FIELD_NUMBER: _ClassVar[int]
    CATALOG_FIELD_NUMBER: _ClassVar[int]
    reply: Reply
    update: ConsumerUpdate
    listing: ServiceListing
    catalog: StreamCatalog
    def __init__(self, reply: _Optional[_Union[Reply, _Mapping]] = ..., update: _Optional[_Union[ConsumerUpdate, _Mapping]] = ..., listing: _Optional[_Union[ServiceListing, _Mapping]] = ..., catalog: _Optional[_Union[StreamCatalog, _Mapping]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class ConsumerStatus(_message.Message):
    __slots__ = ("connection", "subscription_id", "node", "owner", "connectivity", "activity", "disconnected_at", "epoch")
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    CONNECTIVITY_FIELD_NUMBER: _ClassVar[int]
    ACTIVITY_FIELD_NUMBER: _ClassVar[int]
    DISCONNECTED_AT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    connection: str
    subscription_id: int
    node: str
    owner: str
    connectivity: Connectivity
    activity: Activity
    disconnected_at: float
    epoch: int
    def __init__(self, connection: _Optional[str] = ..., subscription_id: _Optional[int] = ..., node: _Optional[str] = ..., owner: _Optional[str] = ..., connectivity: _Optional[_Union[Connectivity, str]] = ..., activity: _Optional[_Union[Activity, str]] = ..., disconnected_at: _Optional[float] = ..., epoch: _Optional[int] = ...) -> None: ...

class ConsumerId(_message.Message):
    __slots__ = ("connection", "subscription_id", "owner")
    CONNECTION_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    connection: str
    subscription_id: int
    owner: str
    def __init__(self, connection: _Optional[str] = ..., subscription_id: _Optional[int] = ..., owner: _Optional[str] = ...) -> None: ...

class Handover(_message.Message):
    __slots__ = ("at", "from_consumer", "to_consumer", "reason", "duration")
    AT_FIELD_NUMBER: _ClassVar[int]
    FROM_CONSUMER_FIELD_NUMBER: _ClassVar[int]
    TO_CONSUMER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DURATION_FIELD_NUMBER: _ClassVar[int]
    at: float
    from_consumer: ConsumerId
    to_consumer: ConsumerId
    reason: HandoverReason
    duration: float
    def __init__(self, at: _Optional[float] = ..., from_consumer: _Optional[_Union[ConsumerId, _Mapping]] = ..., to_consumer: _Optional[_Union[ConsumerId, _Mapping]] = ..., reason: _Optional[_Union[HandoverReason, str]] = ..., duration: _Optional[float] = ...) -> None: ...

class GroupStatus(_message.Message):
    __slots__ = ("group", "partition_index", "consumers", "last_handover", "disconnected_timeout", "listed_at")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    LAST_HANDOVER_FIELD_NUMBER: _ClassVar[int]
    DISCONNECTED_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    LISTED_AT_FIELD_NUMBER: _ClassVar[int]
    group: GroupKey
    partition_index: int
    consumers: _containers.RepeatedCompositeFieldContainer[ConsumerStatus]
    last_handover: Handover
    disconnected_timeout: float
    listed_at: float
    def __init__(self, group: _Optional[_Union[GroupKey, _Mapping]] = ..., partition_index: _Optional[int] = ..., consumers: _Optional[_Iterable[_Union[ConsumerStatus, _Mapping]]] = ..., last_handover: _Optional[_Union[Handover, _Mapping]] = ..., disconnected_timeout: _Optional[float] = ..., listed_at: _Optional[float] = ...) -> None: ...

class ListGroupsReply(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[GroupStatus]
    def __init__(self, groups: _Optional[_Iterable[_Union[GroupStatus, _Mapping]]] = ...) -> None: ...

class ListStreamsRequest(_message.Message):
    __slots__ = ("namespace",)
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    def __init__(self, namespace: _Optional[str] = ...) -> None: ...

class StreamStatus(_message.Message):
    __slots__ = ("namespace", "name", "partitions", "producers")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    PRODUCERS_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    name: str
    partitions: int
    producers: _containers.RepeatedCompositeFieldContainer[StreamProducer]
    def __init__(self, namespace: _Optional[str] = ..., name: _Optional[str] = ..., partitions: _Optional[int] = ..., producers: _Optional[_Iterable[_Union[StreamProducer, _Mapping]]] = ...) -> None: ...

class ListStreamsReply(_message.Message):
    __slots__ = ("streams",)
    STREAMS_FIELD_NUMBER: _ClassVar[int]
    streams: _containers.RepeatedCompositeFieldContainer[StreamStatus]
    def __init__(self, streams: _Optional[_Iterable[_Union[StreamStatus, _Mapping]]] = ...) -> None: ...

class LagRequest(_message.Message):
    __slots__ = ("namespace", "stream", "group")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    stream: str
    group: str
    def __init__(self, namespace: _Optional[str] = ..., stream: _Optional[str] = ..., group: _Optional[str] = ...) -> None: ...

class LagRow(_message.Message):
    __slots__ = ("namespace", "stream", "group", "partition_index", "producer_id", "sent", "confirmed", "in_flight", "oldest_unconfirmed_age", "reported_at")
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    PARTITION_INDEX_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SENT_FIELD_NUMBER: _ClassVar[int]
    CONFIRMED_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    OLDEST_UNCONFIRMED_AGE_FIELD_NUMBER: _ClassVar[int]
    REPORTED_AT_FIELD_NUMBER: _ClassVar[int]
    namespace: str
    stream: str
    group: str
    partition_index: int
    producer_id: str
    sent: int
    confirmed: int
    in_flight: int
    oldest_unconfirmed_age: float
    reported_at: float
    def __init__(self, namespace: _Optional[str] = ..., stream: _Optional[str] = ..., group: _Optional[str] = ..., partition_index: _Optional[int] = ..., producer_id: _Optional[str] = ..., sent: _Optional[int] = ..., confirmed: _Optional[int] = ..., in_flight: _Optional[int] = ..., oldest_unconfirmed_age: _Optional[float] = ..., reported_at: _Optional[float] = ...) -> None: ...

class LagReply(_message.Message):
    __slots__ = ("rows",)
    ROWS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[LagRow]
    def __init__(self, rows: _Optional[_Iterable[_Union[LagRow, _Mapping]]] = ...) -> None: ...
