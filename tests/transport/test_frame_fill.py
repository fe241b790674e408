"""`FrameBuilder.fill`, the writer's loop, builds exactly the frame `add` builds.

``fill`` moves a node's outbox into a frame with the common case (a long run of one
producer's bytes payloads) in a loop of its own; whatever the outbox holds, the frame,
the message count and what is left in the outbox must be the same as when each pair is
given to ``add`` in turn, and a message ``add`` refuses is left out and reported.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from pykka_delivery.protocol.codec import Codec
from pykka_delivery.protocol.messages import Request, SequencedMessage
from pykka_delivery.protocol.serialization import Serialization
from pykka_delivery.transport.frames import FrameBuilder


class Endpoint:
    def __init__(self, address: str) -> None:
        self.address = address

    def tell(self, message: object) -> None:
        pass


class Unreachable:
    """A producer controller no other process can reach: `add` refuses its messages."""

    def tell(self, message: object) -> None:
        pass


REFS: list[Any] = [Endpoint("127.0.0.1:1/pc-a"), Endpoint("127.0.0.1:1/pc-b"), Unreachable()]


def address_of(ref: Any) -> str:
    if not isinstance(ref, Endpoint):
        msg = "not reachable from other processes"
        raise ValueError(msg)
    return ref.address


def new_codec() -> Codec:
    return Codec(Serialization(), address_of, Endpoint)


# Mostly the next message of producer "p" (seq_nr counting up), sometimes something else:
# a gap, another producer or target, a flag, a non-bytes payload, a Request, a refused ref.
items = st.lists(
    st.one_of(
        st.just(("next",)),
        st.just(("next",)),
        st.just(("next",)),
        st.tuples(st.just("gap"), st.integers(2, 5)),
        st.tuples(st.just("other_producer"), st.integers(1, 3)),
        st.just(("other_target",)),
        st.sampled_from([("first",), ("ack",), ("text",), ("request",), ("unreachable",)]),
    ),
    max_size=80,
)


def outbox_of(events: list[tuple[Any, ...]]) -> list[tuple[str, object]]:
    pairs: list[tuple[str, object]] = []
    seq_nr = 1
    for event in events:
        kind = event[0]
        target, producer_id, ref, payload = "c", "p", REFS[0], b"x" * (seq_nr % 7)
        first = ack = False
        if kind == "gap":
            seq_nr += event[1]
        elif kind == "other_producer":
            producer_id, ref = "q", REFS[1]
            seq_nr += event[1]
        elif kind == "other_target":
            target = "d"
        elif kind == "first":
            first = True
        elif kind == "ack":
            ack = True
        elif kind == "text":
            payload = f"text {seq_nr}"  # type: ignore[assignment]
        elif kind == "request":
            pairs.append(("c", Request(seq_nr, seq_nr + 10)))
            continue
        elif kind == "unreachable":
            ref = REFS[2]
        pairs.append((target, SequencedMessage(producer_id, seq_nr, payload, first, ack, ref)))
        seq_nr += 1
    return pairs


@settings(max_examples=300, deadline=None)
@given(events=items, limit=st.sampled_from([1, 3, 16, 500]))
def test_fill_builds_the_frame_add_builds(events: list[tuple[Any, ...]], limit: int) -> None:
    pairs = outbox_of(events)
    codec = new_codec()
    reference = FrameBuilder(codec)
    refused: list[tuple[str, object]] = []
    taken = 0
    for target, message in pairs:
        if reference.messages >= limit:
            break
        taken += 1
        try:
            reference.add(target, message)
        except ValueError:
            refused.append((target, message))
    outbox = deque(pairs)
    filled = FrameBuilder(new_codec())
    failed = filled.fill(outbox, limit)
    assert filled.frame.SerializeToString() == reference.frame.SerializeToString()
    assert filled.messages == reference.messages
    assert [(target, message) for target, message, _ in failed] == refused
    assert all(isinstance(error, ValueError) for _, _, error in failed)
    assert list(outbox) == pairs[taken:]


def test_fill_puts_a_long_run_in_one_envelope_and_stops_at_the_limit() -> None:
    ref = REFS[0]
    outbox: deque[tuple[str, object]] = deque(
        ("c", SequencedMessage("p", n, b"m%d" % n, False, False, ref)) for n in range(1, 701)
    )
    builder = FrameBuilder(new_codec())
    assert builder.fill(outbox, 500) == []
    assert builder.messages == 500
    [envelope] = builder.frame.envelopes
    run = envelope.sequenced_run
    assert (run.first_seq_nr, len(run.data), run.data[-1]) == (1, 500, b"m500")
    assert len(outbox) == 200 and outbox[0][1].seq_nr == 501  # type: ignore[attr-defined]
