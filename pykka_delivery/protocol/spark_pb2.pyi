from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SparkRows(_message.Message):
    __slots__ = ("producer_id", "first_row", "count", "format", "data")
    PRODUCER_ID_FIELD_NUMBER: _ClassVar[int]
    FIRST_ROW_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    producer_id: str
    first_row: int
    count: int
    format: str
    data: bytes
    def __init__(self, producer_id: _Optional[str] = ..., first_row: _Optional[int] = ..., count: _Optional[int] = ..., format: _Optional[str] = ..., data: _Optional[bytes] = ...) -> None: ...
