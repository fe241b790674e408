"""The fencing epochs on the wire (issue 21): `RegisterConsumer`, `Request` and `Ack` keep
their epoch through a frame, `Fenced` travels in its own envelope body, and a message of a
peer that predates epochs (no epoch field written) decodes as epoch 0."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from pykka_delivery.protocol import delivery_pb2
from pykka_delivery.protocol.codec import PROMPT, Codec
from pykka_delivery.protocol.messages import Ack, Fenced, RegisterConsumer, Request
from pykka_delivery.protocol.serialization import Serialization
from pykka_delivery.protocol.transport_pb2 import Envelope, Frame
from pykka_delivery.transport.frames import FrameBuilder


@dataclass(frozen=True)
class Endpoint:
    """A ref known by its address (as a node's remote refs are)."""

    address: str

    def tell(self, message: object) -> None:
        pass


CC = Endpoint("127.0.0.1:7002/consumer-controller")


def address_of(ref: Any) -> str:
    return str(ref.address)


@pytest.fixture
def codec() -> Codec:
    return Codec(Serialization(), address_of, Endpoint)


def round_trip(codec: Codec, message: object) -> Any:
    """``message`` through a frame another process reads, as a node's writer builds it."""
    builder = FrameBuilder(codec)
    builder.add("target", message)
    [envelope] = Frame.FromString(builder.frame.SerializeToString()).envelopes
    return codec.decode(envelope)


@pytest.mark.parametrize(
    "message",
    [
        RegisterConsumer(CC, 5),
        Request(3, 53, True, False, 7),
        Request(3, 53, True, True, 2**62),
        Ack(42, 9),
        Ack(0, 1),
    ],
    ids=repr,
)
def test_a_consumer_sides_message_keeps_its_epoch_over_the_wire(
    codec: Codec, message: object
) -> None:
    assert round_trip(codec, message) == message


@pytest.mark.parametrize("fenced", [Fenced(3, "producer-1"), Fenced(0, "")], ids=repr)
def test_fenced_round_trips_even_with_zero_fields(codec: Codec, fenced: Fenced) -> None:
    assert round_trip(codec, fenced) == fenced


def test_fenced_travels_in_its_own_envelope_body(codec: Codec) -> None:
    frame = Frame()
    codec.add(frame, "target", Fenced(3, "producer-1"))

    assert frame.envelopes[0].WhichOneof("body") == "fenced"


def test_fenced_is_handed_to_the_writer_at_once(codec: Codec) -> None:
    assert Fenced in PROMPT


def test_epoch_zero_is_not_written_so_older_peers_read_the_same_bytes(codec: Codec) -> None:
    frame = Frame()
    codec.add(frame, "target", Request(3, 53, True, False, 0))
    codec.add(frame, "target", Ack(3, 0))

    assert frame.envelopes[0].request == delivery_pb2.Request(
        confirmed_seq_nr=3, request_up_to_seq_nr=53, support_resend=True
    )
    assert frame.envelopes[1].ack == delivery_pb2.Ack(confirmed_seq_nr=3)


@pytest.mark.parametrize(
    ("envelope", "expected"),
    [
        (
            Envelope(
                target="t",
                register_consumer=delivery_pb2.RegisterConsumer(consumer_controller=CC.address),
            ),
            RegisterConsumer(CC, 0),
        ),
        (
            Envelope(target="t", request=delivery_pb2.Request(request_up_to_seq_nr=4)),
            Request(0, 4, False, False, 0),
        ),
        (Envelope(target="t", ack=delivery_pb2.Ack(confirmed_seq_nr=2)), Ack(2, 0)),
    ],
    ids=["register_consumer", "request", "ack"],
)
def test_a_message_without_an_epoch_decodes_as_epoch_zero(
    codec: Codec, envelope: Envelope, expected: object
) -> None:
    assert codec.decode(envelope) == expected
