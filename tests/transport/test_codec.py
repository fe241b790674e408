"""The wire codec: every message kind through a real frame and back, runs of
SequencedMessages, caching, and errors.

Run this file directly for a micro-benchmark of encoding and decoding.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pykka_delivery.delivery.core.chunking import assemble_chunks, make_chunks
from pykka_delivery.delivery.messages import (
    CONFIRMED,
    ConsumerStart,
    DeliverThenStop,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    RegisterToProducerController,
    RequestNext,
    SendNext,
)
from pykka_delivery.protocol import (
    BYTES,
    JSON,
    PICKLE,
    STR,
    USER_SERIALIZER_ID_MIN,
    Serialization,
    SerializationError,
    delivery_pb2,
)
from pykka_delivery.protocol import codec as codec_module
from pykka_delivery.protocol.codec import Codec, CodecError
from pykka_delivery.protocol.messages import (
    Ack,
    ChunkedMessage,
    Ref,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
    SequencedRun,
)
from pykka_delivery.protocol.transport_pb2 import Envelope, Frame, Hello
from pykka_delivery.transport.frames import FrameBuilder, messages_in, split_frame


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


def sequenced(
    message: object,
    seq_nr: int = 1,
    *,
    first: bool = False,
    ack: bool = False,
    producer_id: str = "producer-1",
    producer_controller: Ref = PC,
) -> Any:
    return SequencedMessage(producer_id, seq_nr, message, first, ack, producer_controller)


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


def built(codec: Codec, *messages: tuple[str, object]) -> Frame:
    """Fill a `FrameBuilder` with ``(target, message)`` pairs; the frame another process
    reads from it."""
    builder = FrameBuilder(codec)
    for target, message in messages:
        builder.add(target, message)
    assert builder.messages == len(messages)
    return Frame.FromString(builder.frame.SerializeToString())


def decoded(codec: Codec, frame: Frame) -> list[tuple[str, Any]]:
    """The ``(target, message)`` pairs ``frame`` decodes to, in order, with no error."""
    groups, errors = codec.decode_frame(frame)
    assert errors == []
    return [(target, message) for target, messages in groups for message in messages]


def bodies(frame: Frame) -> list[str | None]:
    return [envelope.WhichOneof("body") for envelope in frame.envelopes]


def run_envelope(**run: Any) -> Envelope:
    return Envelope(target="consumer-controller", sequenced_run=delivery_pb2.SequencedRun(**run))


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
        Delivery(b"x", CC, "producer-1", 1, 1),
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

    # A run carries several messages: decode_run reads it, not the one-message table.
    assert kinds == {*codec_module._DECODERS, "sequenced_run"}


# ----------------------------------------------------------------------------------- runs

CONSUMER = "consumer-controller"


def test_consecutive_sequenced_messages_of_one_producer_travel_in_one_envelope(
    codec: Codec, resolver: Resolver
) -> None:
    sent = [(CONSUMER, sequenced(b"x" * 100, seq_nr)) for seq_nr in range(1, 501)]

    frame = built(codec, *sent)

    assert bodies(frame) == ["sequenced_run"]
    run = frame.envelopes[0].sequenced_run
    assert (run.producer_id, run.first_seq_nr, run.serializer_id) == ("producer-1", 1, BYTES)
    assert decoded(codec, frame) == sent
    assert resolver.addressed == [PC]
    assert resolver.resolved == [PC.address]


@pytest.mark.parametrize("payload", PAYLOADS.values(), ids=PAYLOADS.keys())
def test_a_run_round_trips_with_its_payloads(codec: Codec, payload: object) -> None:
    sent = [(CONSUMER, sequenced(payload, seq_nr)) for seq_nr in range(7, 17)]

    frame = built(codec, *sent)
    received = decoded(codec, frame)

    assert bodies(frame) == ["sequenced_run"]
    assert received == sent
    assert all(type(m.message) is type(payload) for _, m in received)
    assert all(m.producer_controller == PC for _, m in received)


def test_decoded_run_names_one_producer_controller_ref(codec: Codec) -> None:
    frame = built(codec, *((CONSUMER, sequenced(b"x", seq_nr)) for seq_nr in (1, 2, 3)))

    refs = {id(m.producer_controller) for _, m in decoded(codec, frame)}

    assert len(refs) == 1


def test_an_equal_producer_controller_ref_continues_the_run(codec: Codec) -> None:
    same_address = Endpoint(PC.address)  # equal to PC, another object
    sent = [
        (CONSUMER, sequenced(b"a", 1)),
        (CONSUMER, sequenced(b"b", 2, producer_controller=same_address)),
        (CONSUMER, sequenced(b"c", 3)),
    ]

    frame = built(codec, *sent)

    assert bodies(frame) == ["sequenced_run"]
    assert decoded(codec, frame) == sent


RUN, ONE = "sequenced_run", "sequenced"
BREAKS: dict[str, tuple[tuple[str, object], list[str]]] = {
    "other-target": (("other-consumer", sequenced(b"x", 3)), [RUN, RUN, RUN]),
    "gap": ((CONSUMER, sequenced(b"x", 5)), [RUN, RUN, RUN]),
    "first": ((CONSUMER, sequenced(b"x", 3, first=True)), [RUN, ONE, RUN]),
    "ack": ((CONSUMER, sequenced(b"x", 3, ack=True)), [RUN, ONE, RUN]),
    "chunk": (
        (CONSUMER, sequenced(ChunkedMessage(b"x", True, False, STR, ""), 3)),
        [RUN, ONE, RUN],
    ),
    "other-producer": ((CONSUMER, sequenced(b"x", 3, producer_id="producer-2")), [RUN, RUN, RUN]),
    "other-serializer": ((CONSUMER, sequenced("text", 3)), [RUN, RUN, RUN]),
    "other-controller": (
        (CONSUMER, SequencedMessage("producer-1", 3, b"x", False, False, CC)),
        [RUN, RUN, RUN],
    ),
    "other-message": (("producer-controller", Request(0, 20)), [RUN, "request", RUN]),
}


@pytest.mark.parametrize(("between", "expected"), BREAKS.values(), ids=BREAKS.keys())
def test_a_message_that_does_not_continue_the_run_starts_another_envelope(
    codec: Codec, between: tuple[str, object], expected: list[str]
) -> None:
    # seq_nr 3 (or 5) in the middle, then 4: after a break even seq_nr 4 opens a new run.
    sent = [
        (CONSUMER, sequenced(b"a", 1)),
        (CONSUMER, sequenced(b"b", 2)),
        between,
        (CONSUMER, sequenced(b"d", 4)),
    ]

    frame = built(codec, *sent)

    assert bodies(frame) == expected
    assert decoded(codec, frame) == sent


def test_a_payload_with_another_manifest_starts_another_run(codec: Codec) -> None:
    sent = [
        (CONSUMER, sequenced(Hello(node="a"), 1)),
        (CONSUMER, sequenced(delivery_pb2.Ack(confirmed_seq_nr=7), 2)),
        (CONSUMER, sequenced(Hello(node="c"), 3)),
    ]

    frame = built(codec, *sent)

    assert [e.sequenced_run.manifest for e in frame.envelopes] == [
        "pykka_delivery.transport.v1.Hello",
        "pykka_delivery.delivery.v1.Ack",
        "pykka_delivery.transport.v1.Hello",
    ]
    assert decoded(codec, frame) == sent


def test_a_run_with_a_manifest_keeps_it_for_every_message(codec: Codec) -> None:
    sent = [(CONSUMER, sequenced(Hello(node=f"n{i}"), i)) for i in (1, 2, 3)]

    frame = built(codec, *sent)

    assert bodies(frame) == ["sequenced_run"]
    assert frame.envelopes[0].sequenced_run.manifest == "pykka_delivery.transport.v1.Hello"
    assert decoded(codec, frame) == sent


def test_add_without_a_builder_never_makes_a_run(codec: Codec) -> None:
    envelopes = over_the_wire(codec, (CONSUMER, sequenced(b"a", 1)), (CONSUMER, sequenced(b"b", 2)))

    assert [e.WhichOneof("body") for e in envelopes] == ["sequenced", "sequenced"]


class BytesAsText:
    """A user serializer bound to ``bytes``: it must win over the short cut for bytes."""

    serializer_id = USER_SERIALIZER_ID_MIN

    def manifest(self, obj: object) -> str:
        return "hex"

    def to_bytes(self, obj: object) -> bytes:
        assert isinstance(obj, bytes)
        return obj.hex().encode()

    def from_bytes(self, data: bytes, manifest: str) -> object:
        return bytes.fromhex(data.decode())


def test_a_user_serializer_bound_to_bytes_writes_the_run(resolver: Resolver) -> None:
    serialization = Serialization()
    serialization.register(BytesAsText(), for_types=(bytes,))
    codec = Codec(serialization, resolver.address_of, resolver.ref_at)
    sent = [(CONSUMER, sequenced(b"\x01\x02", seq_nr)) for seq_nr in (1, 2, 3)]

    frame = built(codec, *sent)

    run = frame.envelopes[0].sequenced_run
    assert (run.serializer_id, run.manifest) == (USER_SERIALIZER_ID_MIN, "hex")
    assert list(run.data) == [b"0102"] * 3
    assert decoded(codec, frame) == sent


# ---------------------------------------------------------------------- errors in runs


@pytest.mark.parametrize(
    "failing",
    [sequenced(object(), 3), sequenced(b"x", 3, producer_controller=LocalOnly())],
    ids=["unserializable", "unreachable-controller"],
)
def test_a_failed_add_in_a_run_leaves_the_frame_as_it_was(codec: Codec, failing: object) -> None:
    builder = FrameBuilder(codec)
    builder.add(CONSUMER, sequenced(b"a", 1))
    builder.add(CONSUMER, sequenced(b"b", 2))
    before = builder.frame.SerializeToString()

    with pytest.raises(ValueError) as raised:  # SerializationError is a ValueError
        builder.add(CONSUMER, failing)

    assert raised.value.__notes__ == [f"while encoding SequencedMessage for target {CONSUMER!r}"]
    assert builder.frame.SerializeToString() == before
    assert builder.messages == 2
    builder.add(CONSUMER, sequenced(b"d", 4))  # after the gap at 3: a new run
    frame = Frame.FromString(builder.frame.SerializeToString())
    assert bodies(frame) == ["sequenced_run", "sequenced_run"]
    assert decoded(codec, frame) == [
        (CONSUMER, sequenced(b"a", 1)),
        (CONSUMER, sequenced(b"b", 2)),
        (CONSUMER, sequenced(b"d", 4)),
    ]


def test_a_failed_add_of_another_message_does_not_end_the_run(codec: Codec) -> None:
    builder = FrameBuilder(codec)
    builder.add(CONSUMER, sequenced(b"a", 1))

    with pytest.raises(SerializationError):
        builder.add("service", object())
    builder.add(CONSUMER, sequenced(b"b", 2))

    assert len(builder.frame.envelopes) == 1
    assert builder.messages == 2


def test_decode_of_a_run_envelope_points_to_decode_run(codec: Codec) -> None:
    [envelope] = built(
        codec, (CONSUMER, sequenced(b"a", 1)), (CONSUMER, sequenced(b"b", 2))
    ).envelopes

    with pytest.raises(ValueError, match=r"run of 2 SequencedMessages.*decode_run") as raised:
        codec.decode(envelope)

    assert type(raised.value) is ValueError  # the caller's mistake, not a malformed envelope
    assert codec.decode_run(envelope) == [sequenced(b"a", 1), sequenced(b"b", 2)]


MALFORMED_RUNS: list[tuple[dict[str, Any], str]] = [
    (
        {
            "producer_id": "producer-1",
            "first_seq_nr": 1,
            "serializer_id": BYTES,
            "data": [b"x"],
        },
        "has an empty producer_controller address",
    ),
    (
        {
            "producer_id": "p",
            "first_seq_nr": 1,
            "producer_controller": "nowhere",
            "data": [b"x"],
        },
        "names producer_controller 'nowhere', which cannot be resolved",
    ),
    (
        {
            "producer_id": "producer-1",
            "first_seq_nr": 4,
            "producer_controller": PC.address,
            "serializer_id": STR,
            "data": [b"ok", b"\xff", b"ok"],
        },
        "payload of SequencedMessage seq_nr 5 of producer 'producer-1' (in a run)",
    ),
    (
        {"producer_id": "p", "first_seq_nr": 1, "producer_controller": PC.address},
        "carries a SequencedRun without messages",
    ),
]
MALFORMED_RUN_IDS = ["empty-address", "unresolvable-address", "undeserializable-element", "empty"]


@pytest.mark.parametrize(("run", "problem"), MALFORMED_RUNS, ids=MALFORMED_RUN_IDS)
def test_a_malformed_run_is_an_error_and_the_other_envelopes_are_decoded(
    codec: Codec, run: dict[str, Any], problem: str
) -> None:
    frame = built(codec, (CONSUMER, sequenced(b"a", 1)), ("producer-controller", Ack(1)))
    frame.envelopes.insert(1, run_envelope(**run))

    groups, errors = codec.decode_frame(frame)

    assert groups == [(CONSUMER, [sequenced(b"a", 1)]), ("producer-controller", [Ack(1)])]
    [error] = errors
    assert isinstance(error, CodecError)
    assert problem in str(error)


def test_decode_frame_reports_an_envelope_without_a_message(codec: Codec) -> None:
    frame = built(codec, ("producer-controller", Ack(1)))
    frame.envelopes.add(target="producer-controller")

    groups, errors = codec.decode_frame(frame)

    assert groups == [("producer-controller", [Ack(1)])]
    assert [str(e) for e in errors] == [
        "envelope for 'producer-controller' has no message: its body is empty, or of a kind "
        "this version does not know (is the sender's version newer?)"
    ]


# ---------------------------------------------------------------------------- decode_frame


def test_decode_frame_groups_consecutive_messages_for_one_target(codec: Codec) -> None:
    frame = built(
        codec,
        (CONSUMER, sequenced(b"a", 1)),
        (CONSUMER, sequenced(b"b", 2, first=True)),
        (CONSUMER, sequenced(b"c", 3)),
        ("producer-controller", Request(0, 20)),
        ("producer-controller", Ack(3)),
        (CONSUMER, sequenced(b"d", 4)),
    )

    groups, errors = codec.decode_frame(frame)

    assert errors == []
    assert groups == [
        (CONSUMER, [sequenced(b"a", 1), sequenced(b"b", 2, first=True), sequenced(b"c", 3)]),
        ("producer-controller", [Request(0, 20), Ack(3)]),
        (CONSUMER, [sequenced(b"d", 4)]),
    ]


def test_a_malformed_envelope_does_not_split_a_group(codec: Codec) -> None:
    frame = built(codec, ("producer-controller", Ack(1)))
    frame.envelopes.add(target="producer-controller")  # no body
    frame.envelopes.add(target="producer-controller").ack.confirmed_seq_nr = 2

    groups, errors = codec.decode_frame(frame)

    assert groups == [("producer-controller", [Ack(1), Ack(2)])]
    assert len(errors) == 1


# ------------------------------------------------------------ decode_frame(runs=True)


def expanded(groups: list[tuple[str, list[Any]]]) -> list[tuple[str, list[Any]]]:
    """``groups`` with each `SequencedRun` replaced by its messages (none taken yet)."""
    out = []
    for target, messages in groups:
        flat: list[Any] = []
        for message in messages:
            flat += message.expand() if type(message) is SequencedRun else [message]
        out.append((target, flat))
    return out


def refs_of(groups: list[tuple[str, list[Any]]]) -> list[object]:
    """The producer controller ref of every SequencedMessage, in order (None for others)."""
    return [getattr(m, "producer_controller", None) for _, ms in groups for m in ms]


def assert_runs_decode_as_expanded(codec: Codec, frame: Frame) -> list[tuple[str, list[Any]]]:
    """``decode_frame(frame, runs=True)`` gives one untaken `SequencedRun` per run
    envelope, and expanding them gives exactly what ``decode_frame(frame)`` gives."""
    one_by_one, errors = codec.decode_frame(frame)
    with_runs, run_errors = codec.decode_frame(frame, runs=True)

    assert (errors, run_errors) == ([], [])
    runs = [m for _, ms in with_runs for m in ms if type(m) is SequencedRun]
    assert len(runs) == bodies(frame).count("sequenced_run")
    for run, envelope in zip(
        runs, (e for e in frame.envelopes if e.WhichOneof("body") == "sequenced_run"), strict=True
    ):
        assert (run.producer_id, run.seq_nr + 1) == (
            envelope.sequenced_run.producer_id,
            envelope.sequenced_run.first_seq_nr,
        )
        assert run.remaining == len(envelope.sequenced_run.data)
    assert all(
        type(m) is not SequencedMessage or m.first or m.ack or type(m.message) is ChunkedMessage
        for _, ms in with_runs
        for m in ms
    ), "a plain SequencedMessage left out of a run"
    assert expanded(with_runs) == one_by_one
    # The same ref objects: the consumer's fast path compares producer controllers by
    # identity, so a run must name the object its session's first message named.
    assert [id(r) for r in refs_of(expanded(with_runs))] == [id(r) for r in refs_of(one_by_one)]
    assert [
        type(m.message) for _, ms in expanded(with_runs) for m in ms if hasattr(m, "message")
    ] == [type(m.message) for _, ms in one_by_one for m in ms if hasattr(m, "message")]
    return with_runs


def mixed_frame(codec: Codec, payload: Callable[[int], object]) -> Frame:
    """Runs for two targets and two producers, broken by single messages (first, ack, a
    chunk) and by messages for the producer controller."""
    other_pc = Endpoint("127.0.0.1:7003/other-producer-controller")
    return built(
        codec,
        (CONSUMER, sequenced(payload(1), 1, first=True)),
        *((CONSUMER, sequenced(payload(n), n)) for n in range(2, 6)),
        ("producer-controller", Request(0, 20)),
        *((CONSUMER, sequenced(payload(n), n)) for n in range(6, 9)),
        (CONSUMER, sequenced(payload(9), 9, ack=True)),
        (CONSUMER, sequenced(payload(10), 10)),
        (
            "other-consumer",
            sequenced(payload(1), 1, producer_id="p-2", producer_controller=other_pc),
        ),
        (
            "other-consumer",
            sequenced(payload(2), 2, producer_id="p-2", producer_controller=other_pc),
        ),
        (CONSUMER, sequenced(ChunkedMessage(b"piece", True, False, STR, ""), 11)),
        (CONSUMER, sequenced(payload(12), 12)),
        ("producer-controller", Ack(10)),
    )


PAYLOAD_MAKERS: dict[str, Callable[[int], object]] = {
    "bytes": lambda n: bytes([n]) * 3,
    "str": lambda n: f"text {n} ✓",
    "json": lambda n: {"n": n, "items": [n, None, True]},
    "protobuf": lambda n: Hello(node=f"127.0.0.1:{n}"),
}


@pytest.mark.parametrize("payload", PAYLOAD_MAKERS.values(), ids=PAYLOAD_MAKERS.keys())
def test_decode_frame_with_runs_gives_each_run_as_one_sequenced_run(
    codec: Codec, payload: Callable[[int], object]
) -> None:
    frame = mixed_frame(codec, payload)

    groups = assert_runs_decode_as_expanded(codec, frame)

    kinds = [[type(m).__name__ for m in ms] for _, ms in groups]
    assert kinds == [
        ["SequencedMessage", "SequencedRun"],  # 1 first; 2..5
        ["Request"],
        ["SequencedRun", "SequencedMessage", "SequencedRun"],  # 6..8; 9 ack; 10
        ["SequencedRun"],  # the other consumer's 1..2
        ["SequencedMessage", "SequencedRun"],  # 11 a chunk; 12
        ["Ack"],
    ]
    run = groups[0][1][1]
    assert (run.seq_nr, run.last_seq_nr, run.producer_controller) == (1, 5, PC)
    assert run.take() == payload(2)


def test_decode_frame_with_runs_deserializes_with_a_user_serializer_bound_to_bytes(
    resolver: Resolver,
) -> None:
    serialization = Serialization()
    serialization.register(BytesAsText(), for_types=(bytes,))
    codec = Codec(serialization, resolver.address_of, resolver.ref_at)
    frame = mixed_frame(codec, PAYLOAD_MAKERS["bytes"])
    assert frame.envelopes[1].sequenced_run.serializer_id == USER_SERIALIZER_ID_MIN

    groups = assert_runs_decode_as_expanded(codec, frame)

    assert [m.message for m in groups[0][1][1].expand()] == [bytes([n]) * 3 for n in range(2, 6)]


# One message to add to a frame: (target, producer, seq_nr step, kind, payload kind).
frame_items = st.lists(
    st.tuples(
        st.sampled_from([CONSUMER, CONSUMER, "other-consumer", "producer-controller"]),
        st.integers(0, 1),
        st.sampled_from([1, 1, 1, 0, 2]),
        st.sampled_from(["plain", "plain", "plain", "first", "ack", "chunk"]),
        st.sampled_from(list(PAYLOAD_MAKERS)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(items=frame_items)
def test_decode_frame_with_runs_expands_to_what_decode_frame_gives(
    items: list[tuple[str, int, int, str, str]],
) -> None:
    """Any mix of runs, single messages and other envelopes, as a `FrameBuilder` writes
    it: the runs as `SequencedRun`, expanded, are exactly what ``decode_frame`` gives."""
    resolver = Resolver()
    codec = Codec(Serialization(), resolver.address_of, resolver.ref_at)
    controllers = (PC, Endpoint("127.0.0.1:7003/other-producer-controller"))
    seq_nrs = [0, 0]
    sent: list[tuple[str, object]] = []
    for target, producer, step, kind, payload_kind in items:
        if target == "producer-controller":
            sent.append((target, Ack(seq_nrs[0])))
            continue
        seq_nrs[producer] += step
        seq_nr = seq_nrs[producer]
        payload: object = PAYLOAD_MAKERS[payload_kind](seq_nr % 256)
        if kind == "chunk":
            payload = ChunkedMessage(b"piece", True, True, STR, "")
        message = SequencedMessage(
            f"producer-{producer}",
            seq_nr,
            payload,
            kind == "first",
            kind == "ack",
            controllers[producer],
        )
        sent.append((target, message))

    frame = built(codec, *sent)

    assert_runs_decode_as_expanded(codec, frame)
    assert decoded(codec, frame) == sent


@pytest.mark.parametrize(("run", "problem"), MALFORMED_RUNS, ids=MALFORMED_RUN_IDS)
def test_with_runs_a_malformed_run_is_an_error_and_the_other_envelopes_are_decoded(
    codec: Codec, run: dict[str, Any], problem: str
) -> None:
    frame = built(
        codec,
        (CONSUMER, sequenced(b"a", 1)),
        (CONSUMER, sequenced(b"b", 2)),
        ("producer-controller", Ack(1)),
    )
    frame.envelopes.insert(1, run_envelope(**run))  # between the run of 1..2 and the Ack
    frame.envelopes.add(target=CONSUMER, sequenced_run=frame.envelopes[0].sequenced_run)

    groups, errors = codec.decode_frame(frame, runs=True)

    [error] = errors
    assert isinstance(error, CodecError)
    assert problem in str(error)
    assert [[type(m).__name__ for m in ms] for _, ms in groups] == [
        ["SequencedRun"],
        ["Ack"],
        ["SequencedRun"],
    ]
    assert expanded(groups) == [
        (CONSUMER, [sequenced(b"a", 1), sequenced(b"b", 2)]),
        ("producer-controller", [Ack(1)]),
        (CONSUMER, [sequenced(b"a", 1), sequenced(b"b", 2)]),
    ]
    assert groups[0][1][0] is not groups[2][1][0]  # each envelope its own cursor


# ----------------------------------------------------------------------------- splitting


def test_split_frame_cuts_a_run_in_two_runs(codec: Codec) -> None:
    sent = [(CONSUMER, sequenced(bytes([seq_nr]), seq_nr)) for seq_nr in range(3, 14)]
    frame = built(codec, *sent)

    halves = split_frame(frame)

    assert halves is not None
    head, tail = halves
    assert [e.sequenced_run.first_seq_nr for e in (*head.envelopes, *tail.envelopes)] == [3, 8]
    assert (messages_in(head), messages_in(tail)) == (5, 6)
    assert decoded(codec, head) + decoded(codec, tail) == sent


def test_split_frame_cuts_between_envelopes(codec: Codec) -> None:
    sent = [
        (CONSUMER, sequenced(b"a", 1)),
        (CONSUMER, sequenced(b"b", 2)),
        ("producer-controller", Ack(1)),
        ("producer-controller", Request(1, 20)),
    ]
    frame = built(codec, *sent)

    halves = split_frame(frame)

    assert halves is not None
    head, tail = halves
    assert (len(head.envelopes), len(tail.envelopes)) == (1, 2)
    assert (messages_in(head), messages_in(tail)) == (2, 2)
    assert decoded(codec, head) + decoded(codec, tail) == sent


@pytest.mark.parametrize(
    "message",
    [sequenced(b"a", 1), sequenced(b"a", 1, first=True), Ack(1)],
    ids=["run", "one", "ack"],
)
def test_split_frame_cannot_cut_a_single_message(codec: Codec, message: object) -> None:
    frame = built(codec, (CONSUMER, message))

    assert messages_in(frame) == 1
    assert split_frame(frame) is None


# ------------------------------------------------------------------------ micro-benchmark


def benchmark(batches: int = 2000, batch_size: int = 200) -> None:
    """Per-message cost of encoding and decoding a SequencedMessage with a 100-byte
    payload, timed per batch of ``batch_size`` messages in one frame: one envelope per
    message (`Codec.add`, `Codec.decode`), and in runs (`FrameBuilder`,
    `Codec.decode_frame`)."""
    codec = Codec(Serialization(), lambda ref: PC.address, Endpoint)
    messages = [sequenced(bytes(100), seq_nr) for seq_nr in range(1, batch_size + 1)]
    times: dict[str, list[float]] = {}

    def timed(name: str, start: float) -> None:
        times.setdefault(name, []).append((time.perf_counter() - start) / batch_size * 1e6)

    for _ in range(batches):
        frame = Frame()
        start = time.perf_counter()
        for message in messages:
            codec.add(frame, "consumer-controller", message)
        timed("encode, add", start)
        received = Frame.FromString(frame.SerializeToString())
        start = time.perf_counter()
        for envelope in received.envelopes:
            codec.decode(envelope)
        timed("decode, decode", start)
        start = time.perf_counter()
        builder = FrameBuilder(codec)
        for message in messages:
            builder.add("consumer-controller", message)
        timed("encode, FrameBuilder", start)
        received = Frame.FromString(builder.frame.SerializeToString())
        start = time.perf_counter()
        codec.decode_frame(received)
        timed("decode, decode_frame", start)
    for name, per_message in times.items():
        print(
            f"{name}: {statistics.median(per_message):.2f} µs/msg median, "
            f"{min(per_message):.2f} best ({batches} batches of {batch_size})"
        )


if __name__ == "__main__":
    benchmark()
