from pykka_delivery.protocol import delivery_pb2 as _delivery_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Envelope(_message.Message):
    __slots__ = ("target", "sequenced", "request", "resend", "ack", "register_consumer", "user", "sequenced_run", "fenced")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    SEQUENCED_FIELD_NUMBER: _ClassVar[int]
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESEND_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    REGISTER_CONSUMER_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    SEQUENCED_RUN_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    target: str
    sequenced: _delivery_pb2.SequencedMessage
    request: _delivery_pb2.Request
    resend: _delivery_pb2.Resend
    ack: _delivery_pb2.Ack
    register_consumer: _delivery_pb2.RegisterConsumer
    user: _delivery_pb2.Payload
    sequenced_run: _delivery_pb2.SequencedRun
    fenced: _delivery_pb2.Fenced
    def __init__(self, target: _Optional[str] = ..., sequenced: _Optional[_Union[_delivery_pb2.SequencedMessage, _Mapping]] = ..., request: _Optional[_Union[_delivery_pb2.Request, _Mapping]] = ..., resend: _Optional[_Union[_delivery_pb2.Resend, _Mapping]] = ..., ack: _Optional[_Union[_delivery_pb2.Ack, _Mapping]] = ..., register_consumer: _Optional[_Union[_delivery_pb2.RegisterConsumer, _Mapping]] = ..., user: _Optional[_Union[_delivery_pb2.Payload, _Mapping]] = ..., sequenced_run: _Optional[_Union[_delivery_pb2.SequencedRun, _Mapping]] = ..., fenced: _Optional[_Union[_delivery_pb2.Fenced, _Mapping]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node",)
    NODE_FIELD_NUMBER: _ClassVar[int]
    node: str
    def __init__(self, node: _Optional[str] = ...) -> None: ...

class TargetNotice(_message.Message):
    __slots__ = ("unknown", "exposed")
    UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    EXPOSED_FIELD_NUMBER: _ClassVar[int]
    unknown: _containers.RepeatedScalarFieldContainer[str]
    exposed: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, unknown: _Optional[_Iterable[str]] = ..., exposed: _Optional[_Iterable[str]] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("hello", "envelopes", "targets")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    ENVELOPES_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    envelopes: _containers.RepeatedCompositeFieldContainer[Envelope]
    targets: TargetNotice
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., envelopes: _Optional[_Iterable[_Union[Envelope, _Mapping]]] = ..., targets: _Optional[_Union[TargetNotice, _Mapping]] = ...) -> None: ...

class ProbeRequest(_message.Message):
    __slots__ = ("connection_id",)
    CONNECTION_ID_FIELD_NUMBER: _ClassVar[int]
    connection_id: str
    def __init__(self, connection_id: _Optional[str] = ...) -> None: ...

class ProbeReply(_message.Message):
    __slots__ = ("known",)
    KNOWN_FIELD_NUMBER: _ClassVar[int]
    known: bool
    def __init__(self, known: _Optional[bool] = ...) -> None: ...
