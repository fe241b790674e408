"""Payload serializers: application values to ``(serializer_id, manifest, data)`` and back.

A message crossing a process boundary carries its payload as a ``Payload`` (see
``delivery.proto``): the id of the serializer that wrote it, a manifest telling that
serializer what to rebuild, and the bytes. This module is the registry that picks the
serializer on the way out and finds it again by id on the way in.

Built-in serializers. Their ids are part of the wire format: never renumber or reuse them.

====  ==========  =======================================================  ================
 id   name        values                                                   manifest
====  ==========  =======================================================  ================
  1   BYTES       ``bytes``, ``bytearray``, ``memoryview`` (read as bytes)  ``""``
  2   STR         ``str``, encoded as UTF-8                                 ``""``
  3   JSON        ``dict``, ``list``, ``tuple`` (read as a list), ``int``,  ``""``
                  ``float``, ``bool``, ``None``; compact, ``ensure_ascii``
                  off, keys in insertion order (not sorted)
  4   PROTOBUF    any ``google.protobuf.message.Message``                   the message's
                                                                            full name
  5   PICKLE      anything else, only with ``allow_pickle=True``            ``""``
====  ==========  =======================================================  ================

Ids 6 to 99 are reserved for future built-ins; user serializers take ids from 100 up.

Which serializer a value gets: a serializer bound to the value's exact type first, then
the first serializer (in registration order, built-ins first) bound to a base class of
it, then pickle if enabled. So ``True`` goes to JSON (``bool`` is bound exactly) even if
a user serializer is bound to ``int``, and a ``str`` subclass goes to STR. The resolution
is cached per type, so serializing is one dict lookup plus the serializer's own work.

Encoded once. A producer checks each payload it accepts for another process or a store
that writes bytes (`Serialization.check`, see ``payload_check.py``); the check encodes the
payload, and keeps the result in a small memo until `serialize` is asked for the same
object, which takes it instead of encoding the payload a second time. So the bytes sent
are the payload's value when it was sent: a payload mutated after ``send`` goes out as it
was. The memo is keyed by ``id(payload)`` and holds the payload itself (so that its id
cannot be reused while the entry lives); an entry is taken once, so a resend encodes
again. It holds at most ``check_memo_size`` entries, oldest dropped first, and no encoding
larger than ``check_memo_max_bytes``: what a stalled stream never sends cannot pile up, and
a payload whose entry was dropped is simply encoded again when it is sent. Taking,
replacing and dropping are single dict operations, safe between the producer's thread
(check) and the transport's (serialize). A payload object sent again before its first
send was written keeps only the latest entry: each of its messages then carries a value
it had between its own ``send`` and its writing, as before the memo. ``bytes`` and ASCII
``str`` (immutable, and cheap to write) are never encoded by the check, so never kept.

Pickle is off by default because unpickling executes code chosen by whoever wrote the
bytes: enable it only when every sender is trusted.

JSON caveats, as with :mod:`json`: dict keys that are not strings come back as strings,
and tuples come back as lists. Use a protobuf message or a registered serializer when the
exact type matters.
"""

from __future__ import annotations

import json
import pickle
import threading
from collections.abc import Callable
from typing import Any, Final, Protocol, runtime_checkable

from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

__all__ = [
    "BYTES",
    "DEFAULT_CHECK_MEMO_MAX_BYTES",
    "DEFAULT_CHECK_MEMO_SIZE",
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

BYTES: Final = 1
STR: Final = 2
JSON: Final = 3
PROTOBUF: Final = 4
PICKLE: Final = 5
USER_SERIALIZER_ID_MIN: Final = 100


class SerializationError(ValueError):
    """A payload could not be serialized or deserialized; the message says how to fix it."""


@runtime_checkable
class Serializer(Protocol):
    """Turns values into bytes and back. Implementations must be thread-safe.

    ``serializer_id`` identifies the serializer on the wire: it must be the same in every
    process that exchanges these payloads, and at least ``USER_SERIALIZER_ID_MIN`` for a
    user serializer.
    """

    @property
    def serializer_id(self) -> int: ...

    def manifest(self, obj: object) -> str:
        """What :meth:`from_bytes` needs, besides the bytes, to rebuild ``obj``."""
        ...

    def to_bytes(self, obj: object) -> bytes: ...

    def from_bytes(self, data: bytes, manifest: str) -> object: ...


def _type_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# ---------------------------------------------------------------------------- built-ins


class BytesSerializer:
    """Id 1: binary data as it is."""

    serializer_id: Final = BYTES

    def manifest(self, obj: object) -> str:
        return ""

    def to_bytes(self, obj: object) -> bytes:
        if isinstance(obj, bytes):
            return obj
        if isinstance(obj, bytearray | memoryview):
            return bytes(obj)
        raise SerializationError(f"BytesSerializer cannot write {_type_name(type(obj))}")

    def from_bytes(self, data: bytes, manifest: str) -> object:
        return bytes(data)


class StrSerializer:
    """Id 2: text as UTF-8."""

    serializer_id: Final = STR

    def manifest(self, obj: object) -> str:
        return ""

    def to_bytes(self, obj: object) -> bytes:
        if not isinstance(obj, str):
            raise SerializationError(f"StrSerializer cannot write {_type_name(type(obj))}")
        try:
            return obj.encode("utf-8")
        except UnicodeEncodeError as e:
            # Lone surrogates (e.g. from os.fsdecode) have no UTF-8 form.
            raise SerializationError(
                f"str payload is not valid Unicode ({e}); send it as bytes instead"
            ) from e

    def from_bytes(self, data: bytes, manifest: str) -> object:
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise SerializationError(f"STR payload is not valid UTF-8: {e}") from e


class JsonSerializer:
    """Id 3: JSON-able values, compact and deterministic (insertion order is kept)."""

    serializer_id: Final = JSON

    def manifest(self, obj: object) -> str:
        return ""

    def to_bytes(self, obj: object) -> bytes:
        try:
            text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
        except (TypeError, ValueError) as e:
            raise SerializationError(
                f"{_type_name(type(obj))} payload is not JSON-able ({e}): use only "
                "dict/list/tuple/str/int/float/bool/None inside it, or register a "
                "serializer for the offending type"
            ) from e
        return text.encode("utf-8")

    def from_bytes(self, data: bytes, manifest: str) -> object:
        try:
            return json.loads(data)
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            raise SerializationError(f"JSON payload is malformed: {e}") from e


class ProtobufSerializer:
    """Id 4: protobuf messages, identified by their full name.

    The receiving side looks the name up in protobuf's default descriptor pool, which
    knows a message type once its generated ``_pb2`` module has been imported.
    """

    serializer_id: Final = PROTOBUF

    def __init__(self) -> None:
        self._classes: dict[str, type[Message]] = {}

    def manifest(self, obj: object) -> str:
        if not isinstance(obj, Message):
            raise SerializationError(f"ProtobufSerializer cannot write {_type_name(type(obj))}")
        return str(obj.DESCRIPTOR.full_name)

    def to_bytes(self, obj: object) -> bytes:
        if not isinstance(obj, Message):
            raise SerializationError(f"ProtobufSerializer cannot write {_type_name(type(obj))}")
        return obj.SerializeToString()

    def from_bytes(self, data: bytes, manifest: str) -> object:
        cls = self._classes.get(manifest) or self._message_class(manifest)
        try:
            return cls.FromString(bytes(data))
        except DecodeError as e:
            raise SerializationError(f"protobuf payload {manifest!r} is malformed: {e}") from e

    def _message_class(self, full_name: str) -> type[Message]:
        try:
            descriptor = descriptor_pool.Default().FindMessageTypeByName(full_name)
        except KeyError:
            raise SerializationError(
                f"protobuf message type {full_name!r} is unknown in this process: import "
                "the generated _pb2 module that defines it before receiving it"
            ) from None
        cls = message_factory.GetMessageClass(descriptor)
        self._classes[full_name] = cls
        return cls


class PickleSerializer:
    """Id 5: any picklable value. Only registered by ``Serialization(allow_pickle=True)``."""

    serializer_id: Final = PICKLE

    def manifest(self, obj: object) -> str:
        return ""

    def to_bytes(self, obj: object) -> bytes:
        try:
            return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            raise SerializationError(f"cannot pickle {_type_name(type(obj))}: {e}") from e

    def from_bytes(self, data: bytes, manifest: str) -> object:
        # Executes code from the payload: only reachable with allow_pickle=True.
        return pickle.loads(data)


_JSON_TYPES: Final = (dict, list, tuple, int, float, bool, type(None))

_PICKLE_DISABLED: Final = (
    "pickle is disabled because loading pickle executes code chosen by the sender; "
    "if every sender is trusted, use Serialization(allow_pickle=True)"
)


# ---------------------------------------------------------------------------- registry

DEFAULT_CHECK_MEMO_SIZE: Final = 1024
"""`Serialization`'s ``check_memo_size`` by default."""

DEFAULT_CHECK_MEMO_MAX_BYTES: Final = 64 * 1024
"""`Serialization`'s ``check_memo_max_bytes`` by default."""


def _check_memo_setting(name: str, value: object) -> None:
    if type(value) is not int:
        msg = f"Serialization({name}={value!r}): give an int (a count of payloads or bytes)"
        raise TypeError(msg)
    if value < 0:
        msg = f"Serialization({name}={value!r}) is negative: give 0 or more"
        raise ValueError(msg)


def _write_failed(serializer_id: int, cls: type, error: Exception) -> SerializationError:
    return SerializationError(
        f"serializer {serializer_id} failed to write {_type_name(cls)}: {error!r}"
    )


# What `serialize` needs for one type, bound once: id, manifest(obj), to_bytes(obj).
_Binding = tuple[int, Callable[[object], str], Callable[[object], bytes]]


def _bind(serializer: Serializer, cls: type) -> _Binding:
    if type(serializer) is ProtobufSerializer and issubclass(cls, Message):
        # Known once per message type: its manifest, and that its values are messages.
        name = str(cls.DESCRIPTOR.full_name)
        to_bytes: Callable[[Any], bytes] = cls.SerializeToString
        return (PROTOBUF, lambda obj: name, to_bytes)
    return (serializer.serializer_id, serializer.manifest, serializer.to_bytes)


class Serialization:
    """The serializer registry.

    Register user serializers before the first message is sent: registration is
    thread-safe, but a payload already sent was written by whichever serializer was
    chosen at the time.

    Args:
        allow_pickle: fall back to pickle (id 5) for values no other serializer takes,
            and accept pickled payloads. Off by default: unpickling executes code.
        check_memo_size: how many payloads encoded by `check` are kept for `serialize`
            to take (the module docstring, "Encoded once"), the oldest dropped first; 0
            turns the memo off (every checked payload is encoded again when sent).
        check_memo_max_bytes: an encoding longer than this is not kept (the payload is
            encoded again when sent), so that the memo's memory stays small.

    Raises:
        TypeError: ``check_memo_size`` or ``check_memo_max_bytes`` is not an int.
        ValueError: one of them is negative.
    """

    def __init__(
        self,
        *,
        allow_pickle: bool = False,
        check_memo_size: int = DEFAULT_CHECK_MEMO_SIZE,
        check_memo_max_bytes: int = DEFAULT_CHECK_MEMO_MAX_BYTES,
    ) -> None:
        _check_memo_setting("check_memo_size", check_memo_size)
        _check_memo_setting("check_memo_max_bytes", check_memo_max_bytes)
        self._allow_pickle = allow_pickle
        # id(payload) -> (payload, what check encoded): see "Encoded once" above.
        self._memo: dict[int, tuple[object, tuple[int, str, bytes]]] = {}
        self._memo_size = check_memo_size
        # -1 with the memo off: one comparison in check says "keep it" or not.
        self._memo_max_bytes = check_memo_max_bytes if check_memo_size else -1
        self._lock = threading.Lock()
        self._by_id: dict[int, Serializer] = {}
        # Types bound by register(), in registration order, and their exact-type index.
        self._bindings: list[tuple[type, Serializer]] = []
        self._exact: dict[type, Serializer] = {}
        # type(obj) -> binding, filled on first use of each type.
        self._resolved: dict[type, _Binding] = {}

        self._add(BytesSerializer(), (bytes, bytearray, memoryview))
        self._add(StrSerializer(), (str,))
        self._add(JsonSerializer(), _JSON_TYPES)
        self._add(ProtobufSerializer(), (Message,))
        if allow_pickle:
            self._add(PickleSerializer(), ())

    @property
    def allow_pickle(self) -> bool:
        return self._allow_pickle

    @property
    def check_memo_count(self) -> int:
        """How many payloads encoded by `check` wait in the memo for `serialize` (at most
        ``check_memo_size``)."""
        return len(self._memo)

    def register(self, serializer: Serializer, *, for_types: tuple[type, ...] = ()) -> None:
        """Add a user serializer, and bind it to ``for_types`` and their subclasses.

        A binding to an exact type takes precedence over every other rule, built-ins
        included; a binding matched through a base class comes after the built-ins.

        Args:
            serializer: the serializer; its ``serializer_id`` must be at least 100 and
                not already registered.
            for_types: the types whose values it writes. With none, it only reads
                payloads carrying its id.

        Raises:
            SerializationError: the id is below 100 or already taken.
            TypeError: an element of ``for_types`` is not a class.
        """
        serializer_id = serializer.serializer_id
        if not isinstance(serializer_id, int) or serializer_id < USER_SERIALIZER_ID_MIN:
            raise SerializationError(
                f"serializer id {serializer_id!r} of {_type_name(type(serializer))} is "
                f"reserved: ids below {USER_SERIALIZER_ID_MIN} belong to the built-in "
                f"serializers; give it an id of {USER_SERIALIZER_ID_MIN} or more"
            )
        for cls in for_types:
            if not isinstance(cls, type):
                raise TypeError(f"for_types must hold classes, got {cls!r}")
        self._add(serializer, for_types)

    def serialize(self, obj: object) -> tuple[int, str, bytes]:
        """Write ``obj`` with the serializer chosen for its type; when `check` encoded
        this very object and the memo still holds it, that encoding, taken out of the memo
        (the module docstring, "Encoded once").

        Returns:
            ``(serializer_id, manifest, data)``.

        Raises:
            SerializationError: no serializer takes this type, or the serializer failed.
        """
        memo = self._memo
        if memo:
            entry = memo.pop(id(obj), None)
            if entry is not None and entry[0] is obj:
                return entry[1]
        cls = type(obj)
        binding = self._resolved.get(cls)
        if binding is None:
            binding = self._resolve(cls)
        serializer_id, manifest, to_bytes = binding
        try:
            return serializer_id, manifest(obj), to_bytes(obj)
        except SerializationError:
            raise
        except Exception as e:
            raise _write_failed(serializer_id, cls, e) from e

    def check(self, obj: object) -> None:
        """Raise the `SerializationError` that `serialize` would raise for ``obj``; else
        keep its encoding for `serialize` to take when ``obj`` is sent (the module
        docstring, "Encoded once"). A value of exactly ``bytes`` written by the built-in
        bytes serializer (it cannot fail) and an ASCII ``str`` are not encoded: finding
        their serializer is all it takes. What a producer calls on each payload before it
        accepts it for a transport or a store that will serialize it
        (`pykka_delivery.protocol.payload_check`).

        Raises:
            SerializationError: as `serialize`.
        """
        cls = type(obj)
        binding = self._resolved.get(cls)
        if binding is None:
            binding = self._resolve(cls)
        serializer_id, manifest, to_bytes = binding
        # Ids below 100 are the built-ins': these two cannot fail on what is tested here.
        if serializer_id == BYTES and cls is bytes:
            return
        if serializer_id == STR and isinstance(obj, str) and obj.isascii():
            return
        try:
            encoded = serializer_id, manifest(obj), to_bytes(obj)
        except SerializationError:
            raise
        except Exception as e:
            raise _write_failed(serializer_id, cls, e) from e
        if len(encoded[2]) <= self._memo_max_bytes:
            memo = self._memo
            memo[id(obj)] = (obj, encoded)  # replaces an older entry of the same object
            if len(memo) > self._memo_size:
                self._drop_oldest(memo)

    def _drop_oldest(self, memo: dict[int, tuple[object, tuple[int, str, bytes]]]) -> None:
        """Drop the oldest entries past ``check_memo_size`` (their payloads are encoded
        again when sent)."""
        while len(memo) > self._memo_size:
            try:
                del memo[next(iter(memo))]
            except (RuntimeError, KeyError, StopIteration):
                return  # another thread changed the memo meanwhile: the next check goes on

    def always_writes(self, cls: type) -> bool:
        """True when every value of exactly ``cls`` is written without fail: ``cls`` goes
        to the built-in bytes serializer. A caller may skip `check` for such values."""
        binding = self._resolved.get(cls)
        if binding is None:
            try:
                binding = self._resolve(cls)
            except SerializationError:
                return False
        return binding[0] == BYTES

    def deserialize(self, serializer_id: int, manifest: str, data: bytes) -> object:
        """Rebuild a value written by :meth:`serialize` (here or in another process).

        Raises:
            SerializationError: the id is not registered here, pickle is disabled, or
                the data is malformed.
        """
        serializer = self._by_id.get(serializer_id)
        if serializer is None:
            raise self._unknown_id(serializer_id)
        try:
            return serializer.from_bytes(data, manifest)
        except SerializationError:
            raise
        except Exception as e:
            raise SerializationError(
                f"serializer {serializer_id} failed to read a payload with manifest "
                f"{manifest!r}: {e!r}"
            ) from e

    def _add(self, serializer: Serializer, for_types: tuple[type, ...]) -> None:
        serializer_id = serializer.serializer_id
        with self._lock:
            if serializer_id in self._by_id:
                existing = self._by_id[serializer_id]
                raise SerializationError(
                    f"serializer id {serializer_id} is already taken by "
                    f"{_type_name(type(existing))}; give {_type_name(type(serializer))} "
                    "another id"
                )
            self._by_id[serializer_id] = serializer
            for cls in for_types:
                self._bindings.append((cls, serializer))
                self._exact[cls] = serializer
            self._resolved = {}

    def _resolve(self, cls: type) -> _Binding:
        with self._lock:
            serializer = self._exact.get(cls)
            if serializer is None:
                serializer = next((s for base, s in self._bindings if issubclass(cls, base)), None)
            if serializer is None:
                serializer = self._by_id.get(PICKLE) if self._allow_pickle else None
            if serializer is None:
                raise SerializationError(
                    f"no serializer for {_type_name(cls)}: send bytes, str, a JSON-able "
                    "value or a protobuf message, or register a serializer for it with "
                    f"Serialization.register(serializer, for_types=({cls.__qualname__},)); "
                    + _PICKLE_DISABLED
                )
            binding = _bind(serializer, cls)
            self._resolved[cls] = binding
            return binding

    def _unknown_id(self, serializer_id: int) -> SerializationError:
        if serializer_id == PICKLE:
            return SerializationError(
                f"received a pickled payload (serializer id {PICKLE}) but " + _PICKLE_DISABLED
            )
        known = ", ".join(str(i) for i in sorted(self._by_id))
        return SerializationError(
            f"no serializer with id {serializer_id} is registered here (known: {known}); "
            "register the sender's serializer with Serialization.register() in this process"
        )


default_serialization: Final = Serialization()
"""The process-wide registry, pickle disabled."""
