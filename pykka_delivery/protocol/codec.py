"""The wire codec: delivery messages to transport envelopes and back.

A node batches the messages it sends to one peer into a `transport_pb2.Frame`; each
message goes into an `Envelope` naming its recipient on the peer (``target``) and carrying
the message in its ``body``:

====================  ======================  ===========================================
Python message        ``body`` field          refs on the wire
====================  ======================  ===========================================
`SequencedMessage`    ``sequenced_run``       ``producer_controller`` as an address, once
(consecutive, plain)                          per run
`SequencedMessage`    ``sequenced``           ``producer_controller`` as an address
`Request`             ``request``
`Resend`              ``resend``
`Ack`                 ``ack``
`RegisterConsumer`    ``register_consumer``   ``consumer_controller`` as an address
`Fenced`              ``fenced``
anything else         ``user``                (the payload serializer's business)
====================  ======================  ===========================================

A `SequencedMessage` whose message is a `ChunkedMessage` carries the piece as its payload
(the chunk's serializer id, manifest and bytes) and sets both ``first_chunk`` and
``last_chunk``; the *presence* of ``first_chunk`` is what tells the decoder to rebuild the
`ChunkedMessage` instead of deserializing the payload (see ``delivery.proto``).

Runs. A `SequencedRun` body (see ``delivery.proto``) carries consecutive messages of one
producer to one target in one envelope: target, producer id, address, serializer id and
manifest are written, read and turned into Python objects once per run instead of once
per message. Building runs is the transport's business (``transport/frames.py``, its
``FrameBuilder``: what goes into one frame is its choice); `Codec.add` (one message) never
makes runs. On the receiving side `Codec.decode_frame` groups consecutive messages for one
target and expands runs, or, with ``runs=True``, gives each run as one `SequencedRun`: the
node hands those to the consumer handles, which deliver from them without building a
`SequencedMessage` per message.

The ``bytes`` payload takes a short cut both ways: a run of them is read as it is, without
the serializer registry, and the frame builder writes them as they are (it asks the
registry once per frame how it writes ``bytes``, so a user serializer bound to ``bytes``
still wins).

The application-facing messages (`ConsumerStart`, `Delivery`, `RequestNext`, ...) never
cross a process boundary, as in Akka: `Codec.add` refuses them even when pickle is enabled.

Speed. This is the per-message cost of the transport, so it is written for it (figures
in bench/RESULTS.md, "Hot paths"): envelopes are built in place in the frame with attribute sets,
fields at their default value are not set, dispatch is one dict lookup on the message's
exact type (encoding) or on the ``body`` field's name (decoding), and refs and addresses
are looked up in small caches instead of calling the node back for every message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from pykka_delivery.protocol import delivery_pb2, transport_pb2
from pykka_delivery.protocol.messages import (
    LOCAL_ONLY,
    Ack,
    ChunkedMessage,
    Fenced,
    Ref,
    RegisterConsumer,
    Request,
    Resend,
    SequencedMessage,
    SequencedRun,
)
from pykka_delivery.protocol.serialization import BYTES, Serialization, SerializationError

__all__ = ["NO_REF", "PROMPT", "Codec", "CodecError"]

# Entries each cache holds at most; a full cache is emptied and refilled. Far above the
# number of controllers a node talks to, so only a peer sending endless new addresses
# (or a leak of refs) ever reaches it.
_CACHE_LIMIT: Final = 4096

# Messages the other side waits for before it can go on (flow control, recovery,
# registration): a node hands them to its writer at once instead of letting a batch gather.
PROMPT: Final[frozenset[type]] = frozenset({Request, Resend, Ack, RegisterConsumer, Fenced})

# No ref: what `Codec.last_address` and a frame builder's run start from.
NO_REF: Final = object()

# A frame's groups of decoded messages: (target, messages for it), in frame order.
Groups = list[tuple[str, list[object]]]


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

    One codec may be shared by the threads of a node (writers calling `add` or filling a
    frame builder, readers calling `decode_frame`); a frame must be built by one thread
    at a time.

    Attributes:
        serialize: the payload serializers' ``serialize``; with `address` and
            ``last_address``, what the transport's frame builder encodes runs with (no
            wrapper on its per-message path).
        last_address: the last ``(ref, address)`` `address` looked up, as one tuple so
            that threads swap it whole: every message of a producer names the same ref.
    """

    __slots__ = (
        "_address_of",
        "_addresses",
        "_deserialize",
        "_ref_at",
        "_refs",
        "last_address",
        "serialize",
    )

    def __init__(
        self,
        serialization: Serialization,
        address_of: Callable[[Ref], str],
        ref_at: Callable[[str], Ref],
    ) -> None:
        self.serialize = serialization.serialize
        self._deserialize = serialization.deserialize
        self._address_of = address_of
        self._ref_at = ref_at
        # id(ref) -> (ref, address); the ref is kept so that its id is not reused.
        self._addresses: dict[int, tuple[object, str]] = {}
        self.last_address: tuple[object, str] = (NO_REF, "")
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
            ValueError: the envelope carries a ``sequenced_run``, several messages: read
                it with `decode_run` (or the whole frame with `decode_frame`).
        """
        kind = envelope.WhichOneof("body")
        if kind is None:
            raise self._no_message(envelope)
        decoder = _DECODERS.get(kind)
        if decoder is None:
            msg = (
                f"envelope for {envelope.target!r} carries a run of "
                f"{len(envelope.sequenced_run.data)} SequencedMessages, not one message: "
                "decode it with decode_run or decode_frame"
            )
            raise ValueError(msg)
        return decoder(self, envelope)

    def decode_run(self, envelope: transport_pb2.Envelope) -> list[SequencedMessage]:
        """Every `SequencedMessage` a ``sequenced_run`` envelope carries, in seq_nr order.

        Raises:
            CodecError: the run is empty, its producer controller address is empty or
                refused by ``ref_at``, or one of its payloads does not deserialize (the
                whole run is refused then).
        """
        return self.decode_run_as_one(envelope).expand()

    def decode_run_as_one(self, envelope: transport_pb2.Envelope) -> SequencedRun:
        """What a ``sequenced_run`` envelope carries, as one `SequencedRun` (no
        `SequencedMessage` built per message). Raises as `decode_run`."""
        run = envelope.sequenced_run
        data = run.data
        if not data:
            msg = f"envelope for {envelope.target!r} carries a SequencedRun without messages"
            raise CodecError(msg)
        address = run.producer_controller
        ref = self._refs.get(address)
        if ref is None:
            ref = self._ref(envelope, "producer_controller", address)
        if run.serializer_id == BYTES:
            # The BYTES serializer gives the bytes back as they are: skip the registry.
            messages: list[Any] = list(data)
        else:
            messages = self._deserialize_run(envelope, run)
        return SequencedRun(run.producer_id, run.first_seq_nr, messages, ref)

    def decode_frame(
        self, frame: transport_pb2.Frame, runs: bool = False
    ) -> tuple[Groups, list[CodecError]]:
        """Every message ``frame`` carries, grouped by target; a run as its messages, or
        with ``runs`` as one `SequencedRun`.

        Returns:
            ``(groups, errors)``: ``groups`` is a list of ``(target, messages)`` in frame
            order, consecutive messages for one target in one list (so a recipient that
            takes batches gets them at once); ``errors`` holds the `CodecError` of each
            envelope that could not be decoded, which is left out of ``groups`` without
            affecting the other envelopes.
        """
        groups: Groups = []
        errors: list[CodecError] = []
        messages: list[object] = []
        group_target: str | None = None
        for envelope in frame.envelopes:
            run: list[SequencedMessage] | None = None
            message: object = None
            try:
                if envelope.WhichOneof("body") != "sequenced_run":
                    message = self.decode(envelope)
                elif runs:
                    message = self.decode_run_as_one(envelope)
                else:
                    run = self.decode_run(envelope)
            except CodecError as error:
                errors.append(error)
                continue
            target = envelope.target
            if target != group_target:
                messages = []
                groups.append((target, messages))
                group_target = target
            if run is None:
                messages.append(message)
            else:
                messages += run
        return groups, errors

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
        last = self.last_address
        s.producer_controller = last[1] if last[0] is ref else self.address(ref)
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
            payload.serializer_id, payload.manifest, payload.data = self.serialize(inner)

    def _encode_request(self, envelope: transport_pb2.Envelope, m: Request) -> None:
        r = envelope.request
        r.confirmed_seq_nr = m.confirmed_seq_nr  # always set: it gives the body its presence
        r.request_up_to_seq_nr = m.request_up_to_seq_nr
        if m.support_resend:
            r.support_resend = True
        if m.via_timeout:
            r.via_timeout = True
        if m.epoch:  # 0, no fencing, is left out: what a peer without epochs reads
            r.epoch = m.epoch

    def _encode_resend(self, envelope: transport_pb2.Envelope, m: Resend) -> None:
        envelope.resend.from_seq_nr = m.from_seq_nr  # even 0: setting it makes `resend` present

    def _encode_ack(self, envelope: transport_pb2.Envelope, m: Ack) -> None:
        a = envelope.ack
        a.confirmed_seq_nr = m.confirmed_seq_nr  # even 0, as above
        if m.epoch:
            a.epoch = m.epoch

    def _encode_register_consumer(
        self, envelope: transport_pb2.Envelope, m: RegisterConsumer
    ) -> None:
        r = envelope.register_consumer
        r.consumer_controller = self.address(m.consumer_controller)
        if m.epoch:
            r.epoch = m.epoch

    def _encode_fenced(self, envelope: transport_pb2.Envelope, m: Fenced) -> None:
        f = envelope.fenced
        f.epoch = m.epoch  # even 0: setting it makes `fenced` present
        f.producer_id = m.producer_id

    def _encode_user(self, envelope: transport_pb2.Envelope, message: object) -> None:
        if type(message) in LOCAL_ONLY:
            self._refuse_local(envelope, message)
        u = envelope.user
        u.serializer_id, u.manifest, u.data = self.serialize(message)

    def _refuse_local(self, envelope: transport_pb2.Envelope, message: object) -> None:
        name = type(message).__qualname__
        where = "inside a SequencedMessage" if type(message) is ChunkedMessage else "locally"
        msg = (
            f"{name} never crosses a process boundary: it is an application-facing "
            f"message, to be sent {where} (only SequencedMessage, Request, Resend, Ack, "
            "RegisterConsumer and user payloads go on the wire)"
        )
        raise SerializationError(msg)

    def address(self, ref: Ref) -> str:
        """``ref``'s address on the wire (``address_of``, cached). Raises as ``address_of``."""
        key = id(ref)
        entry = self._addresses.get(key)
        if entry is None:
            entry = (ref, self._address_of(ref))
            if len(self._addresses) >= _CACHE_LIMIT:
                self._addresses.clear()
            self._addresses[key] = entry
        self.last_address = entry
        return entry[1]

    # --- decoding ----------------------------------------------------------------------

    def _no_message(self, envelope: transport_pb2.Envelope) -> CodecError:
        msg = (
            f"envelope for {envelope.target!r} has no message: its body is empty, or "
            "of a kind this version does not know (is the sender's version newer?)"
        )
        return CodecError(msg)

    def _deserialize_run(
        self, envelope: transport_pb2.Envelope, run: delivery_pb2.SequencedRun
    ) -> list[object]:
        deserialize = self._deserialize
        serializer_id = run.serializer_id
        manifest = run.manifest
        payloads: list[object] = []
        for seq_nr, data in enumerate(run.data, run.first_seq_nr):
            try:
                payloads.append(deserialize(serializer_id, manifest, data))
            except SerializationError as e:
                msg = (
                    f"envelope for {envelope.target!r}: the payload of SequencedMessage "
                    f"seq_nr {seq_nr} of producer {run.producer_id!r} (in a run) does not "
                    f"deserialize: {e}"
                )
                raise CodecError(msg) from e
        return payloads

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
                r.confirmed_seq_nr, r.request_up_to_seq_nr, r.support_resend, r.via_timeout, r.epoch
            )
        except ValueError as e:
            msg = f"envelope for {envelope.target!r} carries an invalid Request: {e}"
            raise CodecError(msg) from e

    def _decode_resend(self, envelope: transport_pb2.Envelope) -> Resend:
        return Resend(envelope.resend.from_seq_nr)

    def _decode_ack(self, envelope: transport_pb2.Envelope) -> Ack:
        a = envelope.ack
        return Ack(a.confirmed_seq_nr, a.epoch)

    def _decode_register_consumer(self, envelope: transport_pb2.Envelope) -> RegisterConsumer:
        address = envelope.register_consumer.consumer_controller
        ref = self._refs.get(address)
        if ref is None:
            ref = self._ref(envelope, "consumer_controller", address)
        return RegisterConsumer(ref, envelope.register_consumer.epoch)

    def _decode_fenced(self, envelope: transport_pb2.Envelope) -> Fenced:
        f = envelope.fenced
        return Fenced(f.epoch, f.producer_id)

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
    Fenced: Codec._encode_fenced,
}
_DECODERS: Final[dict[str, Callable[[Codec, transport_pb2.Envelope], object]]] = {
    "sequenced": Codec._decode_sequenced,
    "request": Codec._decode_request,
    "resend": Codec._decode_resend,
    "ack": Codec._decode_ack,
    "register_consumer": Codec._decode_register_consumer,
    "fenced": Codec._decode_fenced,
    "user": Codec._decode_user,
}
