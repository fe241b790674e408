"""Wire schema and payload serialization.

``delivery.proto`` (generated into :mod:`pykka_delivery.protocol.delivery_pb2`) defines
the messages exchanged between producer and consumer controllers; :mod:`.serialization`
turns application payloads into ``(serializer_id, manifest, data)`` and back.

This package imports nothing else of ``pykka_delivery``: every other layer may depend on
it, and it on none of them.
"""

from pykka_delivery.protocol.serialization import (
    BYTES,
    JSON,
    PICKLE,
    PROTOBUF,
    STR,
    USER_SERIALIZER_ID_MIN,
    BytesSerializer,
    JsonSerializer,
    PickleSerializer,
    ProtobufSerializer,
    Serialization,
    SerializationError,
    Serializer,
    StrSerializer,
    default_serialization,
)

__all__ = [
    "BYTES",
    "JSON",
    "PICKLE",
    "PROTOBUF",
    "STR",
    "USER_SERIALIZER_ID_MIN",
    "BytesSerializer",
    "JsonSerializer",
    "PickleSerializer",
    "ProtobufSerializer",
    "Serialization",
    "SerializationError",
    "Serializer",
    "StrSerializer",
    "default_serialization",
]
