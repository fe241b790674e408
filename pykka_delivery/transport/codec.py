"""The wire codec: delivery messages to transport envelopes and back.

A node batches the messages it sends to one peer into a `transport_pb2.Frame`; each
message becomes one `Envelope` naming its recipient on the peer (``target``) and carrying
the message in its ``body``:

====================  ======================  ===========================================
Python message        ``body`` field          refs on the wire
====================  ======================  ===========================================
`SequencedMessage`    ``sequenced``           ``producer_controller`` as an address
`Request`             ``request``
`Resend`              ``resend``
`Ack`                 ``ack``
`RegisterConsumer`    ``register_consumer``   ``consumer_controller`` as an address
anything else         ``user``                (the payload serializer's business)
====================  ======================  ===========================================

A `SequencedMessage` whose message is a `ChunkedMessage` carries the piece as its payload
(the chunk's serializer id, manifest and bytes) and sets both ``first_chunk`` and
``last_chunk``; the *presence* of ``first_chunk`` is what tells the decoder to rebuild the
`ChunkedMessage` instead of deserializing the payload (see ``delivery.proto``).

The application-facing messages (`ConsumerStart`, `Delivery`, `RequestNext`, ...) never
cross a process boundary, as in Akka: `Codec.add` refuses them even when pickle is enabled.

Speed. This is the per-message cost of the transport, so it is written for it (see
feasibility.md section 5): envelopes are built in place in the frame with attribute sets,
fields at their default value are not set, dispatch is one dict lookup on the message's
exact type (encoding) or on the ``body`` field's name (decoding), and refs and addresses
are looked up in small caches instead of calling the node back for every message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pykka_delivery.actors.messages import (
    Ack,
    ChunkedMessage,
    Confirmed,
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
from pykka_delivery.protocol import transport_pb2
from pykka_delivery.protocol.serialization import Serialization, SerializationError

__all__ = ["Codec", "CodecError"]

# Entries each cache holds at most; a full cache is emptied and refilled. Far above the
# number of controllers a node talks to, so only a peer sending endless new addresses
# (or a leak of refs) ever reaches it.
_CACHE_LIMIT: Final = 4096

# Application-facing messages: local to one process, they have no wire form.
_LOCAL_ONLY: Final[tuple[type, ...]] = (
    ChunkedMessage,
    Confirmed,
    ConsumerStart,
    DeliverThenStop,
    Delivery,
    MessageWithConfirmation,
    ProducerStart,
    RegisterToProducerController,
    RequestNext,
    SendNext,
)

_NO_REF: Final = object()


class CodecError(ValueError):
    """A received envelope cannot be decoded: it has no message, its payload does not
    deserialize, an address in it is unusable, or its message breaks an invariant."""


class Codec:
    """Encodes messages into a frame's envelopes and decodes received envelopes.

    Args:
        serialization: the payload serializers, for user messages and for the messages a
            `SequencedMessage` carries.
        address_of: the address (``"host:port/name"``) of a ref, stamped on the wire in
            place of a `SequencedMessage`'s producer controller and a `RegisterConsumer`'s
            consumer controller. Raises `ValueError` for a ref that cannot be reached
            from another process.
        ref_at: the ref for an address received on the wire.

    Both callbacks are cached: ``address_of`` is called once per ref object (the codec
    keeps those refs alive, and goes on using an address once given even if ``address_of``
    would refuse the ref later), ``ref_at`` once per address, so a decoded message names
    the same ref object every time. A full cache is emptied (after 4096 entries), after which
    ``ref_at`` makes a new ref for an address already seen: refs must compare equal by
    address, since the controllers recognize their peer with ``==``. A race between
    threads can also call a callback twice for one ref or address.

    One codec may be shared by the threads of a node (writers calling `add`, readers
    calling `decode`); a frame must be built by one thread at a time.
    """

    __slots__ = (
        "_address_of",
        "_addresses",
        "_deserialize",
        "_last_address",
        "_ref_at",
        "_refs",
        "_serialize",
    )

    def __init__(
        self,
        serialization: Serialization,
        address_of: Callable[[Ref], str],
        ref_at: Callable[[str], Ref],
    ) -> None:
        self._serialize = serialization.serialize
        self._deserialize = serialization.deserialize
        self._address_of = address_of
        self._ref_at = ref_at
        # id(ref) -> (ref, address); the ref is kept so that its id is not reused.
        self._addresses: dict[int, tuple[object, str]] = {}
        # The last (ref, address) looked up, as one tuple so that threads swap it whole:
        # every SequencedMessage of a producer names the same producer controller.
        self._last_address: tuple[object, str] = (_NO_REF, "")
        self._refs: dict[str, Ref] = {}

    def add(self, frame: transport_pb2.Frame, target: str, message: object) -> None:
        """Append to ``frame`` one envelope for ``target`` carrying ``message``.

        Args:
            frame: the frame being filled; the envelope is built in place in it.
            target: the recipient's name on the receiving node.
            message: a delivery wire message, or a user message the payload serializers
                can write.

        Raises:
            SerializationError: the message, or the message a `SequencedMessage`
                carries, cannot be serialized, or is an application-facing message
                that never leaves its process.
            ValueError: ``address_of`` refused a ref in the message.

        On any error the frame is left as it was; the exception gets a note naming the
        message and the target.
        """
        envelopes = frame.envelopes
        envelope = envelopes.add()
        try:
            envelope.target = target
            _ENCODERS.get(type(message), Codec._encode_user)(self, envelope, message)
        except Exception as e:
            del envelopes[-1]
            e.add_note(f"while encoding {type(message).__qualname__} for target {target!r}")
            raise

    def decode(self, envelope: transport_pb2.Envelope) -> object:
        """The message ``envelope`` carries, refs resolved with ``ref_at``.

        Raises:
            CodecError: the envelope carries no message (or one this version does not
                know), its payload does not deserialize, an address in it is empty or
                refused by ``ref_at`` (with `ValueError`), or a `Request` in it confirms
                beyond its window.
        """
        kind = envelope.WhichOneof("body")
        if kind is None:
            msg = (
                f"envelope for {envelope.target!r} has no message: its body is empty, or "
                "of a kind this version does not know (is the sender's version newer?)"
            )
            raise CodecError(msg)
        return _DECODERS[kind](self, envelope)

    # --- encoding ----------------------------------------------------------------------

    def _encode_sequenced(self, envelope: transport_pb2.Envelope, m: SequencedMessage) -> None:
        s = envelope.sequenced
        s.producer_id = m.producer_id  # always set: it gives the body its presence
        s.seq_nr = m.seq_nr
        if m.first:
            s.first = True
        if m.ack:
            s.ack = True
        ref = m.producer_controller
        last = self._last_address
        s.producer_controller = last[1] if last[0] is ref else self._address(ref)
        inner = m.message
        payload = s.payload
        if type(inner) is ChunkedMessage:
            payload.serializer_id = inner.serializer_id
            payload.manifest = inner.manifest
            payload.data = inner.data
            # Both set, False included: their presence marks the payload as a piece.
            s.first_chunk = inner.first_chunk
            s.last_chunk = inner.last_chunk
        else:
            payload.serializer_id, payload.manifest, payload.data = self._serialize(inner)

    def _encode_request(self, envelope: transport_pb2.Envelope, m: Request) -> None:
        r = envelope.request
        r.confirmed_seq_nr = m.confirmed_seq_nr  # always set: it gives the body its presence
        r.request_up_to_seq_nr = m.request_up_to_seq_nr
        if m.support_resend:
            r.support_resend = True
        if m.via_timeout:
            r.via_timeout = True

    def _encode_resend(self, envelope: transport_pb2.Envelope, m: Resend) -> None:
        envelope.resend.from_seq_nr = m.from_seq_nr  # even 0: setting it makes `resend` present

    def _encode_ack(self, envelope: transport_pb2.Envelope, m: Ack) -> None:
        envelope.ack.confirmed_seq_nr = m.confirmed_seq_nr  # even 0, as above

    def _encode_register_consumer(
        self, envelope: transport_pb2.Envelope, m: RegisterConsumer
    ) -> None:
        envelope.register_consumer.consumer_controller = self._address(m.consumer_controller)

    def _encode_user(self, envelope: transport_pb2.Envelope, message: object) -> None:
        u = envelope.user
        u.serializer_id, u.manifest, u.data = self._serialize(message)

    def _refuse_local(self, envelope: transport_pb2.Envelope, message: object) -> None:
        name = type(message).__qualname__
        where = "inside a SequencedMessage" if type(message) is ChunkedMessage else "locally"
        msg = (
            f"{name} never crosses a process boundary: it is an application-facing "
            f"message, to be sent {where} (only SequencedMessage, Request, Resend, Ack, "
            "RegisterConsumer and user payloads go on the wire)"
        )
        raise SerializationError(msg)

    def _address(self, ref: Ref) -> str:
        key = id(ref)
        entry = self._addresses.get(key)
        if entry is None:
            entry = (ref, self._address_of(ref))
            if len(self._addresses) >= _CACHE_LIMIT:
                self._addresses.clear()
            self._addresses[key] = entry
        self._last_address = entry
        return entry[1]

    # --- decoding ----------------------------------------------------------------------

    def _decode_sequenced(self, envelope: transport_pb2.Envelope) -> SequencedMessage:
        s = envelope.sequenced
        payload = s.payload
        message: object
        if s.HasField("first_chunk"):
            message = ChunkedMessage(
                payload.data,
                s.first_chunk,
                s.last_chunk,
                payload.serializer_id,
                payload.manifest,
            )
        else:
            try:
                message = self._deserialize(payload.serializer_id, payload.manifest, payload.data)
            except SerializationError as e:
                msg = (
                    f"envelope for {envelope.target!r}: the payload of SequencedMessage "
                    f"seq_nr {s.seq_nr} of producer {s.producer_id!r} does not "
                    f"deserialize: {e}"
                )
                raise CodecError(msg) from e
        address = s.producer_controller
        ref = self._refs.get(address)
        if ref is None:
            ref = self._ref(envelope, "producer_controller", address)
        return SequencedMessage(s.producer_id, s.seq_nr, message, s.first, s.ack, ref)

    def _decode_request(self, envelope: transport_pb2.Envelope) -> Request:
        r = envelope.request
        try:
            return Request(
                r.confirmed_seq_nr, r.request_up_to_seq_nr, r.support_resend, r.via_timeout
            )
        except ValueError as e:
            msg = f"envelope for {envelope.target!r} carries an invalid Request: {e}"
            raise CodecError(msg) from e

    def _decode_resend(self, envelope: transport_pb2.Envelope) -> Resend:
        return Resend(envelope.resend.from_seq_nr)

    def _decode_ack(self, envelope: transport_pb2.Envelope) -> Ack:
        return Ack(envelope.ack.confirmed_seq_nr)

    def _decode_register_consumer(self, envelope: transport_pb2.Envelope) -> RegisterConsumer:
        address = envelope.register_consumer.consumer_controller
        ref = self._refs.get(address)
        if ref is None:
            ref = self._ref(envelope, "consumer_controller", address)
        return RegisterConsumer(ref)

    def _decode_user(self, envelope: transport_pb2.Envelope) -> object:
        u = envelope.user
        try:
            return self._deserialize(u.serializer_id, u.manifest, u.data)
        except SerializationError as e:
            msg = f"envelope for {envelope.target!r}: the user payload does not deserialize: {e}"
            raise CodecError(msg) from e

    def _ref(self, envelope: transport_pb2.Envelope, field: str, address: str) -> Ref:
        if not address:
            msg = f"envelope for {envelope.target!r} has an empty {field} address"
            raise CodecError(msg)
        try:
            ref = self._ref_at(address)
        except ValueError as e:
            msg = (
                f"envelope for {envelope.target!r} names {field} {address!r}, which "
                f"cannot be resolved: {e}"
            )
            raise CodecError(msg) from e
        if len(self._refs) >= _CACHE_LIMIT:
            self._refs.clear()
        self._refs[address] = ref
        return ref


# Dispatch tables of plain functions (no bound method made per call).
_ENCODERS: Final[dict[type, Callable[[Codec, transport_pb2.Envelope, Any], None]]] = {
    SequencedMessage: Codec._encode_sequenced,
    Request: Codec._encode_request,
    Resend: Codec._encode_resend,
    Ack: Codec._encode_ack,
    RegisterConsumer: Codec._encode_register_consumer,
    **dict.fromkeys(_LOCAL_ONLY, Codec._refuse_local),
}
_DECODERS: Final[dict[str, Callable[[Codec, transport_pb2.Envelope], object]]] = {
    "sequenced": Codec._decode_sequenced,
    "request": Codec._decode_request,
    "resend": Codec._decode_resend,
    "ack": Codec._decode_ack,
    "register_consumer": Codec._decode_register_consumer,
    "user": Codec._decode_user,
}
