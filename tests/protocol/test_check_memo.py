"""A payload is encoded once: what `Serialization.check` encodes when a producer accepts
it is what `serialize` writes when it is sent (serialization.py, "Encoded once").

Before, `check` encoded the payload to see whether it could, threw the bytes away, and the
transport encoded it again: twice the serializer's work per message, and a payload mutated
after ``send`` went out mutated, or not, depending on when the frame was built.
"""

from __future__ import annotations

import gc
import json
import queue
import threading
import weakref
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pykka_delivery.protocol import Serialization
from pykka_delivery.protocol.delivery_pb2 import Request


class Box:
    """A mutable user type, weakly referable, written by `BoxSerializer`."""

    def __init__(self, value: int) -> None:
        self.value = value


class BoxSerializer:
    """Writes a `Box` as its value in decimal; counts the writes."""

    serializer_id = 100

    def __init__(self) -> None:
        self.writes = 0

    def manifest(self, obj: object) -> str:
        return ""

    def to_bytes(self, obj: object) -> bytes:
        assert isinstance(obj, Box)
        self.writes += 1
        return str(obj.value).encode()

    def from_bytes(self, data: bytes, manifest: str) -> object:
        return Box(int(data))


def with_boxes(**options: Any) -> tuple[Serialization, BoxSerializer]:
    serialization = Serialization(**options)
    serializer = BoxSerializer()
    serialization.register(serializer, for_types=(Box,))
    return serialization, serializer


def json_of(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# --- encoded once ------------------------------------------------------------------------


def test_serialize_takes_what_check_encoded_without_writing_the_payload_again() -> None:
    serialization, serializer = with_boxes()
    box = Box(7)

    serialization.check(box)
    encoded = serialization.serialize(box)

    assert encoded == (100, "", b"7")
    assert serializer.writes == 1


def test_a_payload_mutated_after_check_is_written_as_it_was_checked() -> None:
    serialization = Serialization()
    order = {"item": "apple", "qty": 1}

    serialization.check(order)
    order["qty"] = 2
    encoded = serialization.serialize(order)

    assert encoded[2] == json_of({"item": "apple", "qty": 1})


def test_a_protobuf_message_mutated_after_check_is_written_as_it_was_checked() -> None:
    serialization = Serialization()
    request = Request(confirmed_seq_nr=1, request_up_to_seq_nr=10)

    serialization.check(request)
    request.request_up_to_seq_nr = 20
    encoded = serialization.serialize(request)

    assert Request.FromString(encoded[2]).request_up_to_seq_nr == 10


def test_a_bytearray_mutated_after_check_is_written_as_it_was_checked() -> None:
    serialization = Serialization()
    data = bytearray(b"abc")

    serialization.check(data)
    data[0] = ord("x")
    encoded = serialization.serialize(data)

    assert encoded[2] == b"abc"


def test_an_encoding_is_taken_once_so_a_resend_encodes_the_payload_again() -> None:
    serialization, serializer = with_boxes()
    box = Box(1)
    serialization.check(box)
    serialization.serialize(box)

    box.value = 2
    resent = serialization.serialize(box)

    assert resent[2] == b"2"
    assert serializer.writes == 2
    assert serialization.check_memo_count == 0


def test_a_payload_checked_again_before_it_is_written_keeps_the_latest_encoding() -> None:
    serialization, _ = with_boxes()
    box = Box(1)
    serialization.check(box)

    box.value = 2
    serialization.check(box)

    assert serialization.check_memo_count == 1
    assert serialization.serialize(box)[2] == b"2"


def test_serialize_of_a_payload_never_checked_writes_it() -> None:
    serialization, _ = with_boxes()
    serialization.check(Box(1))

    encoded = serialization.serialize(Box(2))

    assert encoded[2] == b"2"
    assert serialization.check_memo_count == 1


json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text()),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.dictionaries(st.text(max_size=3), children, max_size=3),
    ),
    max_leaves=6,
)
payloads = st.one_of(
    json_values,
    st.binary(),
    st.binary().map(bytearray),
    st.builds(Request, confirmed_seq_nr=st.integers(0, 10)),
)


@given(payloads)
def test_what_serialize_takes_from_the_memo_equals_what_it_writes_alone(payload: object) -> None:
    serialization = Serialization()

    serialization.check(payload)
    taken = serialization.serialize(payload)

    assert taken == Serialization().serialize(payload)


# --- what is never kept ------------------------------------------------------------------


def test_bytes_and_ascii_str_are_never_encoded_by_check_so_never_kept() -> None:
    serialization = Serialization()

    serialization.check(b"raw")
    serialization.check("plain ascii")

    assert serialization.check_memo_count == 0


def test_an_encoding_longer_than_check_memo_max_bytes_is_not_kept() -> None:
    serialization, serializer = with_boxes(check_memo_max_bytes=3)
    small, large = Box(123), Box(1234)

    serialization.check(small)
    serialization.check(large)

    assert serialization.check_memo_count == 1
    assert serialization.serialize(large)[2] == b"1234"
    assert serializer.writes == 3  # the large box twice, the small one once


def test_a_check_memo_size_of_zero_keeps_nothing() -> None:
    serialization, _ = with_boxes(check_memo_size=0)

    serialization.check(Box(1))

    assert serialization.check_memo_count == 0


# --- bounded -----------------------------------------------------------------------------


def test_the_memo_keeps_at_most_check_memo_size_encodings_dropping_the_oldest() -> None:
    serialization, serializer = with_boxes(check_memo_size=3)
    boxes = [Box(i) for i in range(10)]

    for box in boxes:
        serialization.check(box)
    taken = []
    for box in boxes:
        writes = serializer.writes
        serialization.serialize(box)
        if serializer.writes == writes:
            taken.append(box.value)

    assert taken == [7, 8, 9]
    assert serialization.check_memo_count == 0


def test_payloads_checked_and_never_sent_are_not_kept_alive_past_check_memo_size() -> None:
    serialization, _ = with_boxes(check_memo_size=4)
    refs = []

    for i in range(50):
        box = Box(i)
        refs.append(weakref.ref(box))
        serialization.check(box)
    del box
    gc.collect()

    assert sum(ref() is not None for ref in refs) == 4
    assert serialization.check_memo_count == 4


# --- threads -----------------------------------------------------------------------------


def test_check_on_one_thread_and_serialize_on_another_give_each_payload_its_own_bytes() -> None:
    serialization, _ = with_boxes(check_memo_size=8)
    checked: queue.Queue[Box | None] = queue.Queue(maxsize=64)
    wrong: list[tuple[int, bytes]] = []

    def transport() -> None:
        while (box := checked.get(timeout=10)) is not None:
            data = serialization.serialize(box)[2]
            if data != str(box.value).encode():
                wrong.append((box.value, data))

    thread = threading.Thread(target=transport)
    thread.start()
    try:
        for i in range(20_000):
            box = Box(i)
            serialization.check(box)
            checked.put(box, timeout=10)
    finally:
        checked.put(None, timeout=10)
        thread.join(10)

    assert not thread.is_alive()
    assert wrong == []
    assert serialization.check_memo_count <= 8


# --- settings ----------------------------------------------------------------------------


def test_a_negative_check_memo_size_is_refused_naming_the_fix() -> None:
    with pytest.raises(ValueError, match=r"check_memo_size=-1\) is negative: give 0 or more"):
        Serialization(check_memo_size=-1)


def test_a_check_memo_max_bytes_that_is_not_an_int_is_refused() -> None:
    with pytest.raises(TypeError, match=r"check_memo_max_bytes=1.5\): give an int"):
        Serialization(check_memo_max_bytes=1.5)  # type: ignore[arg-type]
