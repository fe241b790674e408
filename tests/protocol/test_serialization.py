"""Payload serializers: which serializer a value gets, what it writes, and the errors."""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pykka_delivery.protocol import (
    BYTES,
    JSON,
    PICKLE,
    PROTOBUF,
    STR,
    ProtobufSerializer,
    Serialization,
    SerializationError,
    default_serialization,
)
from pykka_delivery.protocol.delivery_pb2 import Request


@dataclass(frozen=True)
class Point:
    x: int
    y: int


class PointSerializer:
    """A user serializer writing `Point` as "x,y", with the class name as manifest."""

    def __init__(self, serializer_id: int = 100) -> None:
        self.serializer_id = serializer_id

    def manifest(self, obj: object) -> str:
        return type(obj).__name__

    def to_bytes(self, obj: object) -> bytes:
        assert isinstance(obj, Point)
        return f"{obj.x},{obj.y}".encode()

    def from_bytes(self, data: bytes, manifest: str) -> object:
        x, y = data.decode().split(",")
        return {"Point": Point, "Point3": Point3}[manifest](int(x), int(y))


@dataclass(frozen=True)
class Point3(Point):
    pass


class Tagged:
    """A user serializer that writes anything as its repr, to see which one was chosen."""

    def __init__(self, serializer_id: int) -> None:
        self.serializer_id = serializer_id

    def manifest(self, obj: object) -> str:
        return ""

    def to_bytes(self, obj: object) -> bytes:
        return repr(obj).encode()

    def from_bytes(self, data: bytes, manifest: str) -> object:
        return data.decode()


def round_trip(serialization: Serialization, value: object) -> object:
    return serialization.deserialize(*serialization.serialize(value))


# ---------------------------------------------------------------------------- built-ins


def test_builtin_serializer_ids_are_fixed_wire_constants() -> None:
    assert (BYTES, STR, JSON, PROTOBUF, PICKLE) == (1, 2, 3, 4, 5)


def test_bytes_are_written_as_they_are() -> None:
    assert default_serialization.serialize(b"\x00\xffabc") == (BYTES, "", b"\x00\xffabc")


def test_bytearray_and_memoryview_are_read_back_as_bytes() -> None:
    for value in (bytearray(b"abc"), memoryview(b"abc")):
        serializer_id, manifest, data = default_serialization.serialize(value)
        assert (serializer_id, manifest, data) == (BYTES, "", b"abc")
        restored = default_serialization.deserialize(serializer_id, manifest, data)
        assert type(restored) is bytes


def test_str_round_trips_as_utf8() -> None:
    assert default_serialization.serialize("héllo ✓") == (STR, "", "héllo ✓".encode())
    assert default_serialization.deserialize(STR, "", "héllo ✓".encode()) == "héllo ✓"


def test_str_subclass_goes_to_str() -> None:
    class Name(str):
        pass

    assert default_serialization.serialize(Name("ann"))[:1] == (STR,)


def test_json_is_compact_and_keeps_insertion_order() -> None:
    value = {"b": 1, "a": [1, 2.5, None, True], "c": {"z": 0, "y": "x"}}
    assert default_serialization.serialize(value) == (
        JSON,
        "",
        b'{"b":1,"a":[1,2.5,null,true],"c":{"z":0,"y":"x"}}',
    )


def test_json_does_not_escape_non_ascii() -> None:
    assert default_serialization.serialize(["é"])[2] == '["é"]'.encode()


def test_json_values_round_trip() -> None:
    value = {"n": 1, "f": 0.5, "s": "x", "l": [None, False], "d": {"k": []}}
    assert round_trip(default_serialization, value) == value


def test_tuples_are_sent_as_json_lists() -> None:
    assert default_serialization.serialize((1, "a")) == (JSON, "", b'[1,"a"]')
    assert round_trip(default_serialization, (1, "a")) == [1, "a"]


def test_none_goes_to_json() -> None:
    assert default_serialization.serialize(None) == (JSON, "", b"null")
    assert round_trip(default_serialization, None) is None


def test_bool_goes_to_json_not_int() -> None:
    assert default_serialization.serialize(True) == (JSON, "", b"true")
    assert round_trip(default_serialization, False) is False


def test_bool_stays_json_when_a_serializer_is_registered_for_int() -> None:
    serialization = Serialization()
    serialization.register(Tagged(100), for_types=(int,))
    assert serialization.serialize(7)[0] == 100
    assert serialization.serialize(True) == (JSON, "", b"true")


def test_value_that_is_not_json_able_inside_a_dict_is_a_clear_error() -> None:
    with pytest.raises(SerializationError, match="not JSON-able"):
        default_serialization.serialize({"a": {1, 2}})


def test_malformed_json_is_a_serialization_error() -> None:
    with pytest.raises(SerializationError, match="JSON payload is malformed"):
        default_serialization.deserialize(JSON, "", b'{"a":')


def test_invalid_utf8_str_payload_is_a_serialization_error() -> None:
    with pytest.raises(SerializationError, match="not valid UTF-8"):
        default_serialization.deserialize(STR, "", b"\xff\xfe")


def test_protobuf_message_round_trips_by_full_name() -> None:
    request = Request(confirmed_seq_nr=3, request_up_to_seq_nr=23, support_resend=True)
    serializer_id, manifest, data = default_serialization.serialize(request)
    assert (serializer_id, manifest) == (PROTOBUF, "pykka_delivery.delivery.v1.Request")
    assert data == request.SerializeToString()
    restored = default_serialization.deserialize(serializer_id, manifest, data)
    assert type(restored) is Request
    assert restored == request


@given(
    st.builds(
        Request,
        confirmed_seq_nr=st.integers(0, 2**40),
        request_up_to_seq_nr=st.integers(0, 2**40),
        support_resend=st.booleans(),
        via_timeout=st.booleans(),
    )
)
def test_a_protobuf_message_is_written_as_the_protobuf_serializer_writes_it(
    request: Request,
) -> None:
    # The registry binds each message type once (its manifest, its SerializeToString):
    # a short cut that must write what the serializer's own methods write.
    serializer = ProtobufSerializer()

    written = Serialization().serialize(request)

    assert written == (PROTOBUF, serializer.manifest(request), serializer.to_bytes(request))


def test_protobuf_message_of_a_module_not_imported_is_a_clear_error() -> None:
    with pytest.raises(SerializationError, match=r"'acme\.v1\.Order' is unknown.*import.*_pb2"):
        default_serialization.deserialize(PROTOBUF, "acme.v1.Order", b"")


def test_malformed_protobuf_payload_is_a_serialization_error() -> None:
    with pytest.raises(SerializationError, match=r"Request.*malformed"):
        default_serialization.deserialize(PROTOBUF, "pykka_delivery.delivery.v1.Request", b"\xff")


# ---------------------------------------------------------------------------- pickle


class _Boom:
    """Unpickling this runs code: it appends to `_EXECUTED`."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_EXECUTED.append, ("unpickled",))


_EXECUTED: list[str] = []


def test_pickle_is_refused_unless_enabled() -> None:
    _EXECUTED.clear()
    with pytest.raises(SerializationError, match=r"pickle is disabled.*allow_pickle=True"):
        default_serialization.deserialize(PICKLE, "", pickle.dumps(_Boom()))
    assert _EXECUTED == []


def test_type_without_serializer_is_refused_when_pickle_is_disabled() -> None:
    with pytest.raises(SerializationError) as raised:
        default_serialization.serialize(Point(1, 2))
    message = str(raised.value)
    assert "no serializer for" in message
    assert "Point" in message
    assert "register" in message
    assert "allow_pickle=True" in message


def test_pickle_takes_types_without_serializer_when_enabled() -> None:
    serialization = Serialization(allow_pickle=True)
    serializer_id, manifest, data = serialization.serialize(Point(1, 2))
    assert (serializer_id, manifest) == (PICKLE, "")
    assert serialization.deserialize(serializer_id, manifest, data) == Point(1, 2)


def test_pickle_does_not_take_types_that_have_a_serializer() -> None:
    serialization = Serialization(allow_pickle=True)
    assert serialization.serialize("x")[0] == STR
    assert serialization.serialize({"a": 1})[0] == JSON


def test_default_serialization_has_pickle_disabled() -> None:
    assert default_serialization.allow_pickle is False


# ---------------------------------------------------------------------------- user serializers


def test_user_serializer_round_trips_its_types() -> None:
    serialization = Serialization()
    serialization.register(PointSerializer(), for_types=(Point,))
    assert serialization.serialize(Point(1, 2)) == (100, "Point", b"1,2")
    assert serialization.deserialize(100, "Point", b"1,2") == Point(1, 2)


def test_user_serializer_applies_to_subclasses_of_its_types() -> None:
    serialization = Serialization()
    serialization.register(PointSerializer(), for_types=(Point,))
    assert serialization.serialize(Point3(1, 2)) == (100, "Point3", b"1,2")


def test_exact_type_binding_beats_a_base_class_binding() -> None:
    serialization = Serialization()
    serialization.register(Tagged(100), for_types=(Point,))
    serialization.register(Tagged(101), for_types=(Point3,))
    assert serialization.serialize(Point3(0, 0))[0] == 101


def test_base_class_bindings_are_tried_in_registration_order() -> None:
    class A:
        pass

    class B:
        pass

    class AB(B, A):
        pass

    serialization = Serialization()
    serialization.register(Tagged(100), for_types=(A,))
    serialization.register(Tagged(101), for_types=(B,))
    assert serialization.serialize(AB())[0] == 100


def test_registration_after_first_use_changes_the_choice_for_types_already_used() -> None:
    serialization = Serialization()
    serialization.register(Tagged(100), for_types=(Point,))
    assert serialization.serialize(Point3(0, 0))[0] == 100  # now cached for Point3
    serialization.register(Tagged(101), for_types=(Point3,))
    assert serialization.serialize(Point3(0, 0))[0] == 101


def test_user_serializer_ids_below_100_are_refused() -> None:
    serialization = Serialization()
    with pytest.raises(SerializationError, match=r"id 99 .*reserved.*100 or more"):
        serialization.register(PointSerializer(99), for_types=(Point,))
    with pytest.raises(SerializationError):
        serialization.serialize(Point(1, 2))


def test_duplicate_serializer_id_is_refused() -> None:
    serialization = Serialization()
    serialization.register(Tagged(100))
    with pytest.raises(SerializationError, match="id 100 is already taken"):
        serialization.register(PointSerializer(100), for_types=(Point,))
    with pytest.raises(SerializationError):
        serialization.serialize(Point(1, 2))


def test_for_types_must_be_classes() -> None:
    with pytest.raises(TypeError, match="classes"):
        Serialization().register(Tagged(100), for_types=("Point",))  # type: ignore[arg-type]


def test_unknown_serializer_id_is_a_clear_error() -> None:
    with pytest.raises(SerializationError, match=r"no serializer with id 4242 .*register"):
        default_serialization.deserialize(4242, "", b"")


def test_failure_inside_a_user_serializer_becomes_a_serialization_error() -> None:
    class Failing(Tagged):
        def to_bytes(self, obj: object) -> bytes:
            raise RuntimeError("disk on fire")

    serialization = Serialization()
    serialization.register(Failing(100), for_types=(Point,))
    with pytest.raises(SerializationError, match="disk on fire") as raised:
        serialization.serialize(Point(1, 2))
    assert isinstance(raised.value.__cause__, RuntimeError)


def test_serialization_error_is_a_value_error() -> None:
    assert issubclass(SerializationError, ValueError)


# ---------------------------------------------------------------------------- properties

_json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
_json_values = st.recursive(
    _json_scalars,
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(_json_values)
def test_any_json_able_value_round_trips_unchanged(value: object) -> None:
    # Compared through json.dumps so that True and 1, or 1.0 and 1, are told apart.
    restored = round_trip(default_serialization, value)
    assert json.dumps(restored) == json.dumps(value)


@given(st.text())
def test_any_str_round_trips(value: str) -> None:
    assert round_trip(default_serialization, value) == value


@given(st.binary())
def test_any_bytes_round_trip(value: bytes) -> None:
    assert round_trip(default_serialization, value) == value


def test_float_precision_survives_json() -> None:
    assert round_trip(default_serialization, math.pi) == math.pi
