"""`KeyedMessage`: how a partitioned stream's message carries its key to the consumers.

A `PartitionedProducer` wraps each message with its key before it enters a partition's
stream, so that the consumer of that partition sees the key next to the message
(`GroupDelivery.key`). The wrapper is a protobuf message, ``KeyedMessage`` in package
``pykka_delivery.partitions.v1``::

    message KeyedMessage {
      int32 key_kind = 1;       // 0: no key, 1: bytes, 2: str (its UTF-8 bytes in `key`)
      bytes key = 2;
      int32 serializer_id = 3;  // the application message, as the Serialization wrote it
      string manifest = 4;
      bytes data = 5;
    }

Why protobuf: the built-in protobuf serializer (id 4) writes and reads any message type
whose descriptor is in protobuf's default pool, so the wrapper crosses a transport node or
goes into a durable producer queue with no serializer to register in any process. The
descriptor is built here, at import (there is no ``.proto`` file to compile): every process
that imports `pykka_delivery.partitions` can read it. The application message inside is
written by the `Serialization` the producer is given (the default one unless said
otherwise), so the consumers must use one that reads it.

Cost: one serialization of the message when it is wrapped and one deserialization when it
is unwrapped, in every process, even when producer and consumer share one.
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import Message

from pykka_delivery.protocol.serialization import Serialization, default_serialization

__all__ = ["KEYED_MESSAGE_NAME", "Key", "KeyedMessage", "unwrap", "wrap"]

Key = bytes | str | None
"""A message's partition key: bytes, text (hashed as its UTF-8 bytes), or None."""

KEYED_MESSAGE_NAME: Final = "pykka_delivery.partitions.v1.KeyedMessage"

_NO_KEY, _BYTES_KEY, _STR_KEY = 0, 1, 2
_FILE_NAME = "pykka_delivery/partitions/keyed.proto"


def _message_class() -> type[Message]:
    pool = descriptor_pool.Default()
    try:  # imported once per process; a reload finds the descriptor there already
        descriptor = pool.FindMessageTypeByName(KEYED_MESSAGE_NAME)
    except KeyError:
        proto = descriptor_pb2.FileDescriptorProto(
            name=_FILE_NAME, package="pykka_delivery.partitions.v1", syntax="proto3"
        )
        message = proto.message_type.add(name="KeyedMessage")
        fields = (
            ("key_kind", descriptor_pb2.FieldDescriptorProto.TYPE_INT32),
            ("key", descriptor_pb2.FieldDescriptorProto.TYPE_BYTES),
            ("serializer_id", descriptor_pb2.FieldDescriptorProto.TYPE_INT32),
            ("manifest", descriptor_pb2.FieldDescriptorProto.TYPE_STRING),
            ("data", descriptor_pb2.FieldDescriptorProto.TYPE_BYTES),
        )
        for number, (name, kind) in enumerate(fields, start=1):
            message.field.add(
                name=name,
                number=number,
                type=kind,
                label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
            )
        pool.Add(proto)
        descriptor = pool.FindMessageTypeByName(KEYED_MESSAGE_NAME)
    return message_factory.GetMessageClass(descriptor)


KeyedMessage: Final = _message_class()
"""The wrapper's protobuf class (see the module docstring for its fields)."""


def wrap(message: object, key: Key, serialization: Serialization | None = None) -> Message:
    """``message`` and its key as one `KeyedMessage`.

    Raises:
        SerializationError: ``serialization`` cannot write the message.
        TypeError: the key is neither bytes, str nor None.
    """
    serializer_id, manifest, data = (serialization or default_serialization).serialize(message)
    if key is None:
        kind, key_bytes = _NO_KEY, b""
    elif isinstance(key, str):
        kind, key_bytes = _STR_KEY, key.encode()
    elif isinstance(key, bytes | bytearray | memoryview):
        kind, key_bytes = _BYTES_KEY, bytes(key)
    else:
        msg = (
            f"a partition key must be bytes, str or None, got {type(key).__name__} {key!r}; "
            f"turn it into one first, for example str(key)"
        )
        raise TypeError(msg)
    wrapped: Message = KeyedMessage(
        key_kind=kind, key=key_bytes, serializer_id=serializer_id, manifest=manifest, data=data
    )
    return wrapped


def unwrap(wrapped: object, serialization: Serialization | None = None) -> tuple[Key, object]:
    """The key and the message inside a `KeyedMessage`; anything else (a message that a
    plain `Producer` sent into the partition's stream, say) is ``(None, wrapped)``.

    Raises:
        SerializationError: ``serialization`` cannot read the message inside.
    """
    if not isinstance(wrapped, Message) or wrapped.DESCRIPTOR.full_name != KEYED_MESSAGE_NAME:
        return None, wrapped
    fields: Any = wrapped
    message = (serialization or default_serialization).deserialize(
        fields.serializer_id, fields.manifest, fields.data
    )
    kind = fields.key_kind
    key: Key = None if kind == _NO_KEY else fields.key.decode() if kind == _STR_KEY else fields.key
    return key, message
