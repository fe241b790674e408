"""Frames: how a node groups the envelopes it sends to one peer into a `transport_pb2.Frame`.

The body of each envelope is the codec's (`pykka_delivery.protocol.codec`); what goes into
one frame, and how, is the transport's: a writer fills a frame with everything queued for
a peer (`FrameBuilder.fill`), splits one that is too large (`split_frame`) and counts what
a frame carries (`messages_in`).

Runs. A `FrameBuilder` fills one frame; a `SequencedMessage` that directly follows one of
the same producer to the same target (next seq_nr, same producer controller, same payload
serializer and manifest), and that is neither ``first`` nor ``ack`` nor a chunk, does not
get an envelope of its own: its payload bytes are appended to the open run's ``data``
(see ``SequencedRun`` in ``delivery.proto``). So a frame of 500 messages of one producer is
one envelope, and target, producer id, address, serializer id and manifest are written,
read and turned into Python objects once per frame instead of once per message. Anything
else closes the run; a plain `SequencedMessage` that cannot join a run opens a new one.
A ``bytes`` payload is written as it is, without the serializer registry, once the
registry has said (once per frame) that it writes ``bytes`` that way.

Speed. `FrameBuilder.add` and `FrameBuilder.fill` run for every message a node sends:
they read the codec's caches and serializers directly (`Codec.serialize`,
`Codec.address`, `Codec.last_address`), with no call in between.
"""

from __future__ import annotations

from collections import deque
from collections.abc import MutableSequence

from pykka_delivery.protocol import transport_pb2
from pykka_delivery.protocol.codec import NO_REF, Codec
from pykka_delivery.protocol.messages import ChunkedMessage, SequencedMessage
from pykka_delivery.protocol.serialization import BYTES

__all__ = ["FrameBuilder", "messages_in", "split_frame"]


class FrameBuilder:
    """One frame being filled one message at a time, consecutive plain `SequencedMessage`
    objects merged into runs (see the module docstring).

    Args:
        codec: encodes the messages; its caches and serializers are used.

    Attributes:
        frame: the frame; complete and consistent after every `add`, whether it succeeded
            or not.
        messages: how many messages were added (a run counts each of its messages).

    One thread at a time; make one builder per frame.
    """

    __slots__ = (
        "_address",
        "_bytes_as_is",
        "_bytes_run",
        "_codec",
        "_data",
        "_manifest",
        "_next_seq_nr",
        "_producer_id",
        "_ref",
        "_serializer_id",
        "_target",
        "frame",
        "messages",
    )

    def __init__(self, codec: Codec) -> None:
        self.frame = transport_pb2.Frame()
        self.messages = 0
        self._codec = codec
        # The open run: its target (None when no run is open), its data, what its next
        # message must match, and the last producer controller ref seen for it (identity
        # is checked first: every message of a producer names the same ref object).
        self._target: str | None = None
        self._data: MutableSequence[bytes] = []
        self._producer_id = ""
        self._next_seq_nr = 0
        self._ref: object = NO_REF
        self._address = ""
        self._serializer_id = 0
        self._manifest = ""
        # Whether the registry writes a `bytes` value as it is (BYTES, no manifest): None
        # until the first one is written; asked once per frame so that a user serializer
        # registered for `bytes` meanwhile is honoured.
        self._bytes_as_is: bool | None = None
        # A run is open, of `bytes` written as they are: the next one can be appended.
        self._bytes_run = False

    def add(self, target: str, message: object) -> None:
        """Append ``message`` for ``target``: to the open run if it continues it, else in
        an envelope of its own. Raises as `Codec.add`, leaving the frame as it was."""
        if type(message) is SequencedMessage:
            # The hot path: the next bytes payload of the open run, nothing to look up.
            if (
                self._bytes_run
                and message.seq_nr == self._next_seq_nr
                and message.producer_controller is self._ref
                and type(message.message) is bytes
                and not message.first
                and not message.ack
                and message.producer_id == self._producer_id
                and target == self._target
            ):
                self._data.append(message.message)
                self._next_seq_nr += 1
                self.messages += 1
                return
            if (
                not message.first
                and not message.ack
                and type(message.message) is not ChunkedMessage
            ):
                self._add_to_run(target, message)
                return
        self._codec.add(self.frame, target, message)
        self._target = None  # anything else ends the run
        self._bytes_run = False
        self.messages += 1

    def fill(
        self, outbox: deque[tuple[str, object]], limit: int
    ) -> list[tuple[str, object, Exception]]:
        """Move ``(target, message)`` pairs from the left of ``outbox`` into the frame, as
        `add` would, until the outbox is empty or the frame holds ``limit`` messages.

        A message that `add` refuses is left out of the frame. Returns those, each with its
        target and the error, for the caller to report.

        A run that goes on for many messages, the common case under load, is filled in
        a loop of its own with its state in local variables: this runs for every message
        a node sends.
        """
        failed: list[tuple[str, object, Exception]] = []
        popleft = outbox.popleft
        while outbox and self.messages < limit:
            target, message = popleft()
            if self._bytes_run and type(message) is SequencedMessage and target == self._target:
                data = self._data
                next_seq_nr = self._next_seq_nr
                ref = self._ref
                producer_id = self._producer_id
                count = self.messages
                more = True
                while (
                    message.seq_nr == next_seq_nr
                    and message.producer_controller is ref
                    and type(message.message) is bytes
                    and not message.first
                    and not message.ack
                    and message.producer_id == producer_id
                ):
                    data.append(message.message)
                    next_seq_nr += 1
                    count += 1
                    if not outbox or count >= limit:
                        more = False
                        break
                    target, message = popleft()
                    if type(message) is not SequencedMessage or target != self._target:
                        break
                self._next_seq_nr = next_seq_nr
                self.messages = count
                if not more:
                    break
            try:
                self.add(target, message)
            except Exception as error:
                failed.append((target, message, error))
        return failed

    def _add_to_run(self, target: str, m: SequencedMessage) -> None:
        """Append ``m`` to the open run if it continues it, else open a new run."""
        try:
            serializer_id, manifest, data, address = self._prepare(m)
            if (
                target == self._target
                and m.seq_nr == self._next_seq_nr
                and m.producer_id == self._producer_id
                and address == self._address
                and serializer_id == self._serializer_id
                and manifest == self._manifest
            ):
                self._data.append(data)
            else:
                self._open_run(
                    target,
                    m,
                    serializer_id=serializer_id,
                    manifest=manifest,
                    data=data,
                    address=address,
                )
        except Exception as e:
            e.add_note(f"while encoding {type(m).__qualname__} for target {target!r}")
            raise
        self._ref = m.producer_controller
        self._next_seq_nr = m.seq_nr + 1
        self._bytes_run = bool(
            self._bytes_as_is and self._serializer_id == BYTES and not self._manifest
        )
        self.messages += 1

    def _prepare(self, m: SequencedMessage) -> tuple[int, str, bytes, str]:
        """``m``'s serialized payload and producer controller address (may raise)."""
        codec = self._codec
        ref = m.producer_controller
        if ref is self._ref:
            address = self._address
        else:
            last = codec.last_address
            address = last[1] if last[0] is ref else codec.address(ref)
        inner = m.message
        if type(inner) is bytes and self._bytes_as_is:
            return BYTES, "", inner, address
        serializer_id, manifest, data = codec.serialize(inner)
        if type(inner) is bytes:
            self._bytes_as_is = serializer_id == BYTES and not manifest and data is inner
        return serializer_id, manifest, data, address

    def _open_run(
        self,
        target: str,
        m: SequencedMessage,
        *,
        serializer_id: int,
        manifest: str,
        data: bytes,
        address: str,
    ) -> None:
        envelopes = self.frame.envelopes
        envelope = envelopes.add()
        try:
            envelope.target = target
            run = envelope.sequenced_run
            run.producer_id = m.producer_id
            run.first_seq_nr = m.seq_nr
            run.producer_controller = address
            run.serializer_id = serializer_id
            run.manifest = manifest
            run.data.append(data)  # gives the body its presence (a run is never empty)
        except Exception:
            del envelopes[-1]
            raise
        self._data = run.data
        self._target = target
        self._producer_id = m.producer_id
        self._address = address
        self._serializer_id = serializer_id
        self._manifest = manifest


def messages_in(frame: transport_pb2.Frame) -> int:
    """How many messages ``frame`` carries: one per envelope, each message of a run."""
    return sum(
        len(envelope.sequenced_run.data) if envelope.WhichOneof("body") == "sequenced_run" else 1
        for envelope in frame.envelopes
    )


def split_frame(
    frame: transport_pb2.Frame,
) -> tuple[transport_pb2.Frame, transport_pb2.Frame] | None:
    """``frame``'s envelopes in two frames, in order, or None if it carries one message.

    A frame of several envelopes is cut between envelopes, half of them on each side; a
    frame of one run is cut inside the run, into two runs of about half its messages.
    ``frame``'s ``hello`` is not copied.
    """
    envelopes = frame.envelopes
    head = transport_pb2.Frame()
    tail = transport_pb2.Frame()
    if len(envelopes) > 1:
        half = len(envelopes) // 2
        head.envelopes.extend(envelopes[:half])
        tail.envelopes.extend(envelopes[half:])
        return head, tail
    if len(envelopes) == 1 and envelopes[0].WhichOneof("body") == "sequenced_run":
        envelope = envelopes[0]
        half = len(envelope.sequenced_run.data) // 2
        if half == 0:
            return None
        head.envelopes.add().CopyFrom(envelope)
        del head.envelopes[0].sequenced_run.data[half:]
        second = tail.envelopes.add()
        second.CopyFrom(envelope)
        del second.sequenced_run.data[:half]
        second.sequenced_run.first_seq_nr += half
        return head, tail
    return None
