from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Payload(_message.Message):
    __slots__ = ("serializer_id", "manifest", "data")
    SERIALIZER_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    serializer_id: int
    manifest: str
    data: bytes
    def __init__(self, serializer_id: _Optional[int] = ..., manifest: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...

class SequencedMessage(_message.Message):
    __slots__ = ("producer_id", "seq_nr", "first", "ack", "producer_controller", "payload", "first_chunk", "last_chunk")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_NR_FIELD_NUMBER: _ClassVar[int]
    FIRST_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    FIRST_CHUNK_FIELD_NUMBER: _ClassVar[int]
    LAST_CHUNK_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    seq_nr: int
    first: bool
    ack: bool
    producer_controller: str
    payload: Payload
    first_chunk: bool
    last_chunk: bool
    def __init__(self, producer_id: _Optional[str] = ..., seq_nr: _Optional[int] = ..., first: _Optional[bool] = ..., ack: _Optional[bool] = ..., producer_controller: _Optional[str] = ..., payload: _Optional[_Union[Payload, _Mapping]] = ..., first_chunk: _Optional[bool] = ..., last_chunk: _Optional[bool] = ...) -> None: ...

class SequencedRun(_message.Message):
    __slots__ = ("producer_id", "first_seq_nr", "producer_controller", "serializer_id", "manifest", "data")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_SEQ_NR_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    SERIALIZER_ID_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    first_seq_nr: int
    producer_controller: str
    serializer_id: int
    manifest: str
    data: _containers.RepeatedScalarFieldContainer[bytes]
    def __init__(self, producer_id: _Optional[str] = ..., first_seq_nr: _Optional[int] = ..., producer_controller: _Optional[str] = ..., serializer_id: _Optional[int] = ..., manifest: _Optional[str] = ..., data: _Optional[_Iterable[bytes]] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("confirmed_seq_nr", "request_up_to_seq_nr", "support_resend", "via_timeout", "epoch")
    CONFIRMED_SEQ_NR_FIELD_NUMBER: _ClassVar[int]
    REQUEST_UP_TO_SEQ_NR_FIELD_NUMBER: _ClassVar[int]
    SUPPORT_RESEND_FIELD_NUMBER: _ClassVar[int]
    VIA_TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    confirmed_seq_nr: int
    request_up_to_seq_nr: int
    support_resend: bool
    via_timeout: bool
    epoch: int
    def __init__(self, confirmed_seq_nr: _Optional[int] = ..., request_up_to_seq_nr: _Optional[int] = ..., support_resend: _Optional[bool] = ..., via_timeout: _Optional[bool] = ..., epoch: _Optional[int] = ...) -> None: ...

class Resend(_message.Message):
    __slots__ = ("from_seq_nr",)
    FROM_SEQ_NR_FIELD_NUMBER: _ClassVar[int]
    from_seq_nr: int
    def __init__(self, from_seq_nr: _Optional[int] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("confirmed_seq_nr", "epoch")
    CONFIRMED_SEQ_NR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    confirmed_seq_nr: int
    epoch: int
    def __init__(self, confirmed_seq_nr: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class RegisterConsumer(_message.Message):
    __slots__ = ("consumer_controller", "epoch")
    CONSUMER_CONTROLLER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    consumer_controller: str
    epoch: int
    def __init__(self, consumer_controller: _Optional[str] = ..., epoch: _Optional[int] = ...) -> None: ...

class Fenced(_message.Message):
    __slots__ = ("epoch", "producer_id")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    producer_id: str
    def __init__(self, epoch: _Optional[int] = ..., producer_id: _Optional[str] = ...) -> None: ...

class DeadLetter(_message.Message):
    __slots__ = ("producer_id", "seq_nr", "payload", "reason", "attempts", "timestamp_millis")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_NR_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TIMESTAMP_MILLIS_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    seq_nr: int
    payload: Payload
    reason: str
    attempts: int
    timestamp_millis: int
    def __init__(self, producer_id: _Optional[str] = ..., seq_nr: _Optional[int] = ..., payload: _Optional[_Union[Payload, _Mapping]] = ..., reason: _Optional[str] = ..., attempts: _Optional[int] = ..., timestamp_millis: _Optional[int] = ...) -> None: ...
