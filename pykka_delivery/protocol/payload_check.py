"""Checking a payload when a producer accepts it, against what will encode it on its way.

A producer numbers a message and keeps it until the consumer side confirms it. A payload
the transport cannot encode would never leave: resent for ever, it would hold back every
later message of its stream. So the producer checks each payload *before* numbering it,
with the serializers of whatever will encode it: the ref of a consumer side in another
process (an `EncodesPayloads`, such as a transport's remote ref) and a durable queue that
stores payloads as bytes. A payload one of them refuses is refused to the caller with the
serializer's `SerializationError` (which names the type and the fix); nothing is numbered,
so the next message takes the seq_nr the refused one would have had.

In-process refs take any object: they declare nothing, get no check, and pay nothing.

The check is not work thrown away: `Serialization.check` keeps what it encoded, and the
transport (or the durable queue) writes those bytes when the message goes out instead of
encoding the payload again (``serialization.py``, "Encoded once").

The rule lives here once: `payload_check` builds the check for a set of encoders; the
producer cores (``delivery/core/producer.py``, ``delivery/core/work_pulling.py``) build it
when their consumer side or workers change and apply it where they number a message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from pykka_delivery.protocol.serialization import Serialization

__all__ = ["EncodesPayloads", "PayloadCheck", "payload_check"]


@runtime_checkable
class EncodesPayloads(Protocol):
    """Something that serializes the payloads given to it (a transport's remote ref, a
    durable queue storing bytes): a producer checks each payload with the same serializers
    before it accepts it (see the module docstring)."""

    def payload_serialization(self) -> Serialization | None:
        """The serializers this will encode payloads with; None when it will not encode
        them (a remote ref to its own node delivers in-process)."""
        ...


class _NoValue:
    """A type no payload has: `PayloadCheck.unchecked` when every type needs the check."""


class PayloadCheck:
    """The check of a payload for one set of encoders (built by `payload_check`).

    Attributes:
        check: raises the `SerializationError` one of the encoders would raise for a
            payload; returns None when every one of them can encode it (each
            serialization then keeps the encoding for the payload's sending).
        unchecked: the one exact type whose values need no check (``bytes`` when every
            serialization writes it with the built-in bytes serializer, which cannot
            fail): a hot path tests ``type(payload) is not check.unchecked`` first.
        serializations: the distinct serializations it checks with.
    """

    __slots__ = ("check", "serializations", "unchecked")

    def __init__(self, serializations: tuple[Serialization, ...]) -> None:
        self.serializations = serializations
        self.unchecked: type = (
            bytes if all(s.always_writes(bytes) for s in serializations) else _NoValue
        )
        self.check: Callable[[object], None]
        if len(serializations) == 1:
            self.check = serializations[0].check
        else:
            checks = [s.check for s in serializations]

            def check_all(payload: object) -> None:
                for check in checks:
                    check(payload)

            self.check = check_all

    def __repr__(self) -> str:
        return f"PayloadCheck({len(self.serializations)} serialization(s))"


def payload_check(*encoders: object) -> PayloadCheck | None:
    """The check a payload must pass before it is accepted for ``encoders`` (the consumer
    side's ref, a durable queue, ...): None when none of them encodes payloads (all are
    in-process), so that the caller pays nothing.

    Each `EncodesPayloads` among ``encoders`` contributes its serialization (one check per
    distinct `Serialization` object); anything else, None included, is ignored.
    """
    serializations: list[Serialization] = []
    for encoder in encoders:
        if isinstance(encoder, EncodesPayloads):
            serialization = encoder.payload_serialization()
            if serialization is not None and all(serialization is not s for s in serializations):
                serializations.append(serialization)
    if not serializations:
        return None
    return PayloadCheck(tuple(serializations))
