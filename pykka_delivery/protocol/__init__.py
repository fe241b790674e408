"""The vocabulary that crosses a process boundary, its wire schema and its codec.

:mod:`.messages` holds the messages a producer side and a consumer side exchange
(`SequencedMessage`, `Request`, `Resend`, `Ack`, `RegisterConsumer`, link events) and the
capabilities a recipient declares; ``delivery.proto`` and ``transport.proto`` (generated
into ``*_pb2``) are their wire schema; :mod:`.codec` turns one into the other; and
:mod:`.serialization` turns application payloads into ``(serializer_id, manifest,
data)`` and back; :mod:`.payload_check` is how a producer checks a payload with those
serializers before it accepts it for another process.

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
