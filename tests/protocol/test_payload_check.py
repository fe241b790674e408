"""Checking a payload before a producer accepts it (protocol/payload_check.py) and the
registry's `Serialization.check`, whose short cuts must agree with `serialize`."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pykka_delivery.protocol import Serialization, SerializationError
from pykka_delivery.protocol.delivery_pb2 import Request
from pykka_delivery.protocol.payload_check import EncodesPayloads, payload_check


class InProcess:
    def tell(self, message: Any) -> None:
        pass


class Encoding(InProcess):
    def __init__(self, serialization: Serialization | None) -> None:
        self.serialization = serialization

    def payload_serialization(self) -> Serialization | None:
        return self.serialization


class Refusing:
    """A user serializer bound to a type, failing on every value."""

    serializer_id = 100

    def manifest(self, obj: object) -> str:
        return ""

    def to_bytes(self, obj: object) -> bytes:
        msg = "refused"
        raise ValueError(msg)

    def from_bytes(self, data: bytes, manifest: str) -> object:
        return data


# --- Serialization.check ---------------------------------------------------------------


def test_check_raises_the_error_serialize_raises() -> None:
    serialization = Serialization()
    value = {"when": datetime.datetime(2024, 1, 1, tzinfo=datetime.UTC)}

    with pytest.raises(SerializationError) as checked:
        serialization.check(value)
    with pytest.raises(SerializationError) as serialized:
        serialization.serialize(value)

    assert str(checked.value) == str(serialized.value)


def test_check_refuses_a_type_without_serializer_naming_how_to_register_one() -> None:
    with pytest.raises(SerializationError, match=r"Serialization.register"):
        Serialization().check(object())


def test_check_refuses_a_str_that_has_no_utf8_form() -> None:
    with pytest.raises(SerializationError, match="not valid Unicode"):
        Serialization().check("lone \udc80 surrogate")


def test_check_refuses_what_a_user_serializer_bound_to_bytes_refuses() -> None:
    serialization = Serialization()
    serialization.register(Refusing(), for_types=(bytes,))

    with pytest.raises(SerializationError, match="refused"):
        serialization.check(b"raw")


def test_bytes_are_always_written_unless_a_user_serializer_takes_them() -> None:
    taken = Serialization()
    taken.register(Refusing(), for_types=(bytes,))

    assert Serialization().always_writes(bytes)
    assert not taken.always_writes(bytes)
    assert not Serialization().always_writes(str)
    assert not Serialization().always_writes(object)


payloads = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(),
        st.binary(),
        st.datetimes(),
        st.builds(set),
        st.builds(Request, confirmed_seq_nr=st.integers(0, 10)),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(max_size=3), children, max_size=3),
    ),
    max_leaves=6,
)


@given(payloads)
def test_check_refuses_exactly_what_serialize_refuses(payload: object) -> None:
    serialization = Serialization()
    try:
        serialization.serialize(payload)
    except SerializationError:
        serializable = False
    else:
        serializable = True

    try:
        serialization.check(payload)
    except SerializationError:
        passed = False
    else:
        passed = True

    assert passed == serializable


# --- payload_check -----------------------------------------------------------------------


def test_in_process_refs_get_no_check() -> None:
    assert payload_check() is None
    assert payload_check(InProcess(), None) is None
    assert payload_check(Encoding(None)) is None  # a remote ref to its own node


def test_a_ref_declaring_its_serializers_is_an_encoder() -> None:
    assert isinstance(Encoding(Serialization()), EncodesPayloads)
    assert not isinstance(InProcess(), EncodesPayloads)


def test_encoders_sharing_a_serialization_are_checked_once() -> None:
    shared = Serialization()

    check = payload_check(Encoding(shared), InProcess(), Encoding(shared))

    assert check is not None
    assert check.serializations == (shared,)


def test_a_payload_is_checked_with_every_distinct_serialization() -> None:
    lenient, strict = Serialization(), Serialization()
    strict.register(Refusing(), for_types=(bytes,))
    check = payload_check(Encoding(lenient), Encoding(strict))
    assert check is not None

    with pytest.raises(SerializationError, match="refused"):
        check.check(b"raw")


def test_bytes_are_left_unchecked_only_when_every_serialization_writes_them_as_they_are() -> None:
    strict = Serialization()
    strict.register(Refusing(), for_types=(bytes,))

    plain = payload_check(Encoding(Serialization()))
    mixed = payload_check(Encoding(Serialization()), Encoding(strict))

    assert plain is not None and plain.unchecked is bytes
    assert mixed is not None and mixed.unchecked is not bytes
