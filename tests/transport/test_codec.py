"""The wire codec: every message kind through a real frame and back, caching, and errors.

Run this file directly for a micro-benchmark of encoding and decoding.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import pytest

from pykka_delivery.actors.chunking import assemble_chunks, make_chunks
from pykka_delivery.actors.messages import (
    CONFIRMED,
    Ack,
    ChunkedMessage,
    ConsumerStart,
    DeliverThenStop,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    Ref,
    RegisterConsumer,
    RegisterToProducerController,
    Request,
    RequestNext,
    Resend,
    SendNext,
    SequencedMessage,
)
from pykka_delivery.protocol import (
    JSON,
    PICKLE,
    STR,
    Serialization,
    SerializationError,
    delivery_pb2,
)
from pykka_delivery.protocol.transport_pb2 import Envelope, Frame, Hello
from pykka_delivery.transport import codec as codec_module
from pykka_delivery.transport.codec import Codec, CodecError


@dataclass(frozen=True)
class Endpoint:
    """A ref known by its address, equal to any other for the same address (as the
    node's remote refs are)."""

    address: str

    def tell(self, message: object) -> None:
        pass


class LocalOnly:
    """A ref that no other process can reach."""

    def tell(self, message: object) -> None:
        pass

    def __repr__(self) -> str:
        return "LocalOnly()"


class Resolver:
    """The node's side of the codec: ``address_of`` and ``ref_at``, recording calls."""

    def __init__(self) -> None:
        self.addressed: list[Ref] = []
        self.resolved: list[str] = []

    def address_of(self, ref: Ref) -> str:
        self.addressed.append(ref)
        if not isinstance(ref, Endpoint):
            msg = f"{ref!r} is not reachable from other processes"
            raise ValueError(msg)
        return ref.address

    def ref_at(self, address: str) -> Ref:
        self.resolved.append(address)
        if "/" not in address:
            msg = f"{address!r} is not host:port/name"
            raise ValueError(msg)
        return Endpoint(address)


PC = Endpoint("127.0.0.1:7001/producer-controller")
CC = Endpoint("127.0.0.1:7002/consumer-controller")
PAYLOADS = {
    "bytes": b"\x00\xffpayload",
    "str": "héllo ✓",
    "json": {"b": 1, "a": [1, 2.5, None, True], "c": {"z": "y"}},
    "protobuf": Hello(node="127.0.0.1:7001"),
}


@pytest.fixture
def resolver() -> Resolver:
    return Resolver()


@pytest.fixture
def codec(resolver: Resolver) -> Codec:
    return Codec(Serialization(), resolver.address_of, resolver.ref_at)


def sequenced(message: object, seq_nr: int = 1, *, first: bool = False, ack: bool = False) -> Any:
    return SequencedMessage("producer-1", seq_nr, message, first, ack, PC)


def over_the_wire(codec: Codec, *messages: tuple[str, object]) -> list[Envelope]:
    """Encode ``(target, message)`` pairs into one frame; the envelopes another process
    reads from it."""
    frame = Frame()
    for target, message in messages:
        codec.add(frame, target, message)
    return list(Frame.FromString(frame.SerializeToString()).envelopes)


def decode(codec: Codec, envelope: Envelope) -> Any:
    """What ``codec`` decodes from ``envelope``, loosely typed for the assertions."""
    return codec.decode(envelope)


def round_trip(codec: Codec, message: object) -> Any:
    [envelope] = over_the_wire(codec, ("consumer-controller", message))
    assert envelope.target == "consumer-controller"
    return decode(codec, envelope)


def envelope_with(**body: Any) -> Envelope:
    return Envelope(target="consumer-controller", **body)


# ---------------------------------------------------------------------- SequencedMessage


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_sequenced_message_round_trips_with_its_payload(codec: Codec, payload: object) -> None:
    message = sequenced(payload, seq_nr=17)

    decoded = round_trip(codec, message)

    assert decoded == message
    assert type(decoded.message) is type(payload)


@pytest.mark.parametrize(
    ("first", "ack"), [(False, False), (True, False), (False, True), (True, True)]
)
def test_sequenced_message_keeps_its_first_and_ack_flags(
    codec: Codec, first: bool, ack: bool
) -> None:
    decoded = round_trip(codec, sequenced(b"x", first=first, ack=ack))

    assert (decoded.first, decoded.ack) == (first, ack)


def test_decoded_sequenced_message_names_the_producer_controller_at_its_address(
    codec: Codec, resolver: Resolver
) -> None:
    decoded = round_trip(codec, sequenced(b"x"))

    assert decoded.producer_controller == PC
    assert resolver.addressed == [PC]
    assert resolver.resolved == [PC.address]


def test_sequenced_message_not_chunked_leaves_the_chunk_flags_unset(codec: Codec) -> None:
    [envelope] = over_the_wire(codec, ("consumer-controller", sequenced(b"x")))

    assert not envelope.sequenced.HasField("first_chunk")
    assert not envelope.sequenced.HasField("last_chunk")


@pytest.mark.parametrize(
    ("first_chunk", "last_chunk"),
    [(True, False), (False, False), (False, True), (True, True)],
    ids=["first", "middle", "last", "first-and-last"],
)
def test_chunk_round_trips_with_its_chunk_flags(
    codec: Codec, first_chunk: bool, last_chunk: bool
) -> None:
    chunk = ChunkedMessage(b"piece", first_chunk, last_chunk, JSON, "")
    message = sequenced(chunk, ack=last_chunk)

    [envelope] = over_the_wire(codec, ("consumer-controller", message))
    decoded = decode(codec, envelope)

    assert envelope.sequenced.HasField("first_chunk")
    assert envelope.sequenced.HasField("last_chunk")
    assert decoded == message
    assert decoded.message == chunk


def test_chunk_data_is_kept_as_bytes_not_deserialized(codec: Codec) -> None:
    half_a_character = "é".encode()[:1]  # not UTF-8 on its own
    chunk = ChunkedMessage(half_a_character, True, False, STR, "")

    decoded = round_trip(codec, sequenced(chunk))

    assert decoded.message == chunk


def test_chunks_of_a_large_message_reassemble_after_the_wire(codec: Codec) -> None:
    serialization = Serialization()
    value = {"rows": list(range(100)), "name": "large"}
    chunks = make_chunks(value, 16, serialization)
    messages = [sequenced(chunk, seq_nr) for seq_nr, chunk in enumerate(chunks, start=1)]

    envelopes = over_the_wire(codec, *(("consumer-controller", m) for m in messages))
    decoded = [decode(codec, envelope) for envelope in envelopes]

    assert len(chunks) > 2
    assert decoded == messages
    assert assemble_chunks([m.message for m in decoded], serialization) == value


# ---------------------------------------------------------------- consumer side to producer


@pytest.mark.parametrize(
    "request_",
    [Request(0, 0, False, False), Request(3, 53), Request(3, 53, True, True), Request(9, 9, False)],
)
def test_request_round_trips(codec: Codec, request_: Request) -> None:
    assert round_trip(codec, request_) == request_


@pytest.mark.parametrize("from_seq_nr", [0, 7, 2**63 - 1])
def test_resend_round_trips_even_from_zero(codec: Codec, from_seq_nr: int) -> None:
    assert round_trip(codec, Resend(from_seq_nr)) == Resend(from_seq_nr)


@pytest.mark.parametrize("confirmed_seq_nr", [0, 42])
def test_ack_round_trips_even_at_zero(codec: Codec, confirmed_seq_nr: int) -> None:
    assert round_trip(codec, Ack(confirmed_seq_nr)) == Ack(confirmed_seq_nr)


def test_register_consumer_round_trips_with_the_consumer_controller_address(
    codec: Codec, resolver: Resolver
) -> None:
    [envelope] = over_the_wire(codec, ("producer-controller", RegisterConsumer(CC)))

    decoded = codec.decode(envelope)

    assert envelope.register_consumer.consumer_controller == CC.address
    assert decoded == RegisterConsumer(CC)
    assert resolver.resolved == [CC.address]


# ------------------------------------------------------------------------- user messages


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_user_message_round_trips_as_a_payload(codec: Codec, payload: object) -> None:
    [envelope] = over_the_wire(codec, ("service", payload))

    decoded = codec.decode(envelope)

    assert envelope.WhichOneof("body") == "user"
    assert decoded == payload
    assert type(decoded) is type(payload)


# ---------------------------------------------------------------------------------- add


def test_add_appends_envelopes_in_order_with_their_targets(codec: Codec) -> None:
    sent: list[tuple[str, object]] = [
        ("consumer-controller", sequenced("one", 1, first=True)),
        ("producer-controller", Request(0, 20)),
        ("consumer-controller", sequenced("two", 2)),
        ("service", {"hello": "world"}),
        ("producer-controller", Ack(2)),
    ]

    envelopes = over_the_wire(codec, *sent)

    assert [(e.target, codec.decode(e)) for e in envelopes] == sent


def test_failed_add_leaves_the_frame_as_it_was(codec: Codec) -> None:
    frame = Frame()
    codec.add(frame, "consumer-controller", sequenced(b"x"))
    before = frame.SerializeToString()

    with pytest.raises(SerializationError):
        codec.add(frame, "consumer-controller", sequenced(object(), 2))

    assert len(frame.envelopes) == 1
    assert frame.SerializeToString() == before


# ------------------------------------------------------------------------------ caching


def test_address_of_is_called_once_per_ref(codec: Codec, resolver: Resolver) -> None:
    messages = [
        ("consumer-controller", sequenced(b"a", 1)),
        ("consumer-controller", sequenced(b"b", 2)),
        ("producer-controller", RegisterConsumer(CC)),
        ("consumer-controller", sequenced(b"c", 3)),
        ("producer-controller", RegisterConsumer(CC)),
    ]

    over_the_wire(codec, *messages)

    assert resolver.addressed == [PC, CC]


def test_ref_at_is_called_once_per_address_and_its_ref_reused(
    codec: Codec, resolver: Resolver
) -> None:
    envelopes = over_the_wire(
        codec,
        ("consumer-controller", sequenced(b"a", 1)),
        ("producer-controller", RegisterConsumer(CC)),
        ("consumer-controller", sequenced(b"b", 2)),
    )

    first, register, second = (decode(codec, e) for e in envelopes)

    assert resolver.resolved == [PC.address, CC.address]
    assert first.producer_controller is second.producer_controller
    assert register.consumer_controller == CC


def test_a_full_cache_is_emptied_and_refilled(
    codec: Codec, resolver: Resolver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(codec_module, "_CACHE_LIMIT", 2)
    addresses = ["h:1/a", "h:1/b", "h:1/c", "h:1/a"]
    envelopes = over_the_wire(
        codec, *(("p", RegisterConsumer(Endpoint(address))) for address in addresses)
    )

    decoded = [decode(codec, e).consumer_controller for e in envelopes]

    assert decoded == [Endpoint(address) for address in addresses]
    assert resolver.resolved == addresses  # "h:1/a" again: the cache was emptied at "h:1/c"


# ------------------------------------------------------------------------ errors in add


@pytest.mark.parametrize(
    "message",
    [
        SequencedMessage("producer-1", 1, b"x", True, False, LocalOnly()),
        RegisterConsumer(LocalOnly()),
    ],
    ids=["SequencedMessage", "RegisterConsumer"],
)
def test_add_raises_the_value_error_of_a_ref_address_of_refuses(
    codec: Codec, message: object
) -> None:
    with pytest.raises(ValueError, match="not reachable from other processes") as raised:
        codec.add(Frame(), "target", message)

    assert type(raised.value) is ValueError


def test_add_raises_the_serialization_error_of_an_unserializable_user_message(
    codec: Codec,
) -> None:
    with pytest.raises(SerializationError, match=r"no serializer for builtins\.object"):
        codec.add(Frame(), "service", object())


def test_add_raises_the_serialization_error_of_an_unserializable_payload(codec: Codec) -> None:
    with pytest.raises(SerializationError, match=r"no serializer for builtins\.set"):
        codec.add(Frame(), "consumer-controller", sequenced({1, 2}))


def test_add_notes_the_message_and_its_target_on_the_error(codec: Codec) -> None:
    with pytest.raises(SerializationError) as raised:
        codec.add(Frame(), "consumer-controller", sequenced(object()))

    assert raised.value.__notes__ == [
        "while encoding SequencedMessage for target 'consumer-controller'"
    ]


@pytest.mark.parametrize(
    "message",
    [
        ConsumerStart(CC),
        ProducerStart(PC),
        RequestNext("producer-1", 1, 0, PC, PC),
        MessageWithConfirmation(b"x", PC),
        SendNext(b"x"),
        Delivery(b"x", CC, "producer-1", 1),
        CONFIRMED,
        DeliverThenStop(),
        RegisterToProducerController(PC),
        ChunkedMessage(b"x", True, True, STR, ""),
    ],
    ids=lambda message: type(message).__name__,
)
def test_application_facing_messages_are_refused_even_with_pickle(
    resolver: Resolver, message: object
) -> None:
    codec = Codec(Serialization(allow_pickle=True), resolver.address_of, resolver.ref_at)

    with pytest.raises(SerializationError, match="never crosses a process boundary"):
        codec.add(Frame(), "target", message)


# --------------------------------------------------------------------- errors in decode


def test_envelope_without_a_message_raises_codec_error_naming_its_target(codec: Codec) -> None:
    with pytest.raises(CodecError, match="envelope for 'consumer-controller' has no message"):
        codec.decode(envelope_with())


@pytest.mark.parametrize(
    ("payload", "problem"),
    [
        (delivery_pb2.Payload(serializer_id=JSON, data=b"{"), "JSON payload is malformed"),
        (delivery_pb2.Payload(serializer_id=999, data=b"x"), "no serializer with id 999"),
        (delivery_pb2.Payload(serializer_id=PICKLE, data=b"x"), "pickle is disabled"),
    ],
    ids=["malformed", "unknown-serializer", "pickle"],
)
def test_user_payload_that_does_not_deserialize_raises_codec_error(
    codec: Codec, payload: delivery_pb2.Payload, problem: str
) -> None:
    with pytest.raises(CodecError, match="the user payload does not deserialize") as raised:
        codec.decode(envelope_with(user=payload))

    assert problem in str(raised.value)
    assert isinstance(raised.value.__cause__, SerializationError)


def test_sequenced_payload_that_does_not_deserialize_raises_codec_error(codec: Codec) -> None:
    body = delivery_pb2.SequencedMessage(
        producer_id="producer-1",
        seq_nr=5,
        producer_controller=PC.address,
        payload=delivery_pb2.Payload(serializer_id=STR, data=b"\xff"),
    )

    with pytest.raises(
        CodecError, match="payload of SequencedMessage seq_nr 5 of producer 'producer-1'"
    ) as raised:
        codec.decode(envelope_with(sequenced=body))

    assert isinstance(raised.value.__cause__, SerializationError)


def test_request_confirming_beyond_its_window_raises_codec_error(codec: Codec) -> None:
    body = delivery_pb2.Request(confirmed_seq_nr=5, request_up_to_seq_nr=3)

    with pytest.raises(CodecError, match="invalid Request: Request confirmed_seq_nr 5 is above"):
        codec.decode(envelope_with(request=body))


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {
                "sequenced": delivery_pb2.SequencedMessage(
                    producer_id="producer-1",
                    seq_nr=1,
                    payload=delivery_pb2.Payload(serializer_id=STR, data=b"x"),
                )
            },
            "producer_controller",
        ),
        ({"register_consumer": delivery_pb2.RegisterConsumer()}, "consumer_controller"),
    ],
    ids=["SequencedMessage", "RegisterConsumer"],
)
def test_empty_address_raises_codec_error(
    codec: Codec, resolver: Resolver, body: dict[str, Any], field: str
) -> None:
    with pytest.raises(CodecError, match=f"has an empty {field} address"):
        codec.decode(envelope_with(**body))

    assert resolver.resolved == []


def test_address_ref_at_refuses_raises_codec_error(codec: Codec) -> None:
    body = delivery_pb2.RegisterConsumer(consumer_controller="nowhere")

    with pytest.raises(
        CodecError, match="names consumer_controller 'nowhere', which cannot be resolved"
    ) as raised:
        codec.decode(envelope_with(register_consumer=body))

    assert isinstance(raised.value.__cause__, ValueError)


def test_every_kind_of_envelope_body_has_a_decoder() -> None:
    kinds = {field.name for field in Envelope.DESCRIPTOR.oneofs_by_name["body"].fields}

    assert kinds == set(codec_module._DECODERS)


# ------------------------------------------------------------------------ micro-benchmark


def benchmark(batches: int = 2000, batch_size: int = 200) -> None:
    """Per-message cost of `Codec.add` and `Codec.decode` for a SequencedMessage with a
    100-byte payload, timed per batch of ``batch_size`` messages in one frame."""
    codec = Codec(Serialization(), lambda ref: PC.address, Endpoint)
    messages = [sequenced(bytes(100), seq_nr) for seq_nr in range(1, batch_size + 1)]
    encode: list[float] = []
    decode: list[float] = []
    for _ in range(batches):
        frame = Frame()
        start = time.perf_counter()
        for message in messages:
            codec.add(frame, "consumer-controller", message)
        encode.append((time.perf_counter() - start) / batch_size * 1e6)
        received = Frame.FromString(frame.SerializeToString())
        start = time.perf_counter()
        for envelope in received.envelopes:
            codec.decode(envelope)
        decode.append((time.perf_counter() - start) / batch_size * 1e6)
    for name, times in (("encode", encode), ("decode", decode)):
        print(
            f"{name}: {statistics.median(times):.2f} µs/msg median, {min(times):.2f} best "
            f"({batches} batches of {batch_size})"
        )


if __name__ == "__main__":
    benchmark()
