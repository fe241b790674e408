"""What the payload check costs per message sent to another process, and what the frame
builder then pays to write the payload: a payload is encoded once (by the check, when it
is accepted), not twice.

In this process, no network: a producer core (a handle's, in its steady state) whose
consumer side is a transport `RemoteRef` (a started `Node`, a peer address that is never
dialled), so that its payload gate checks every payload with the node's serializers; and
the node's frame builder (`FrameBuilder` over a `Codec` on the same `Serialization`)
filling frames with what the core numbered, ``--batch`` messages at a time (the memo of
what the check encoded lives from one to the other). For each kind of payload:

* ``<kind>_accept_ns``: `ProducerCore.next_message` per message, the check included;
* ``<kind>_accept_in_process_ns``: the same with an in-process consumer side (no check):
  the floor the check adds to;
* ``<kind>_frame_ns``: `FrameBuilder.fill` per message;
* ``<kind>_total_ns``: accept plus frame, what one message costs the sending process;
* ``<kind>_check_ratio``: ``total`` over ``accept_in_process + frame``;
* ``user_writes_per_message``: how many times a registered user serializer wrote each
  payload (1.0: encoded once; 2.0: encoded by the check and again by the frame builder).

Kinds: ``dict`` (a small JSON dict), ``protobuf`` (a small message), ``bytes`` (100 bytes:
never checked), ``user`` (a small object with a user serializer). Each figure is the median
of ``--runs`` rounds, each the best of three tries; the kinds and the two consumer sides
are interleaved within a round. The last line printed is
one JSON object with every figure.

Usage: python bench/payload_check.py [--messages N] [--runs R] [--batch B]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pykka_delivery.delivery.core.producer import ProducerCore  # noqa: E402
from pykka_delivery.protocol import Serialization  # noqa: E402
from pykka_delivery.protocol.codec import Codec  # noqa: E402
from pykka_delivery.protocol.delivery_pb2 import Request as RequestPb  # noqa: E402
from pykka_delivery.protocol.messages import Ref, Request  # noqa: E402
from pykka_delivery.transport import Node  # noqa: E402
from pykka_delivery.transport.frames import FrameBuilder  # noqa: E402

PEER = "127.0.0.1:9/consumer"  # never dialled: nothing is told to it


class Order:
    """A small application object with a serializer of its own."""

    __slots__ = ("item", "qty")

    def __init__(self, item: str, qty: int) -> None:
        self.item = item
        self.qty = qty


class OrderSerializer:
    serializer_id = 100

    def __init__(self) -> None:
        self.writes = 0

    def manifest(self, obj: object) -> str:
        return ""

    def to_bytes(self, obj: object) -> bytes:
        self.writes += 1
        assert isinstance(obj, Order)
        return f"{obj.item}:{obj.qty}".encode()

    def from_bytes(self, data: bytes, manifest: str) -> object:
        item, qty = bytes(data).decode().split(":")
        return Order(item, int(qty))


PAYLOADS: dict[str, Callable[[int], Any]] = {
    "dict": lambda n: {"order": n, "item": "apple", "qty": 3},
    "protobuf": lambda n: RequestPb(confirmed_seq_nr=n, request_up_to_seq_nr=n + 500),
    "bytes": lambda n: b"x" * 100,
    "user": lambda n: Order("apple", n),
}


class _Sink:
    def tell(self, message: object) -> None:
        pass


def steady_core(consumer: Ref, window: int) -> ProducerCore:
    """A handle's core sending to ``consumer``, first message confirmed, window open."""
    core = ProducerCore("bench", _Sink(), _Sink(), announce_demand=False)
    core.on_start(_Sink())
    core.on_register_consumer(consumer)
    core.on_msg(b"first")
    core.on_request(Request(1, window + 1))
    return core


def measure(
    kind: str, consumer: Ref, codec: Codec | None, count: int, batch: int
) -> tuple[float, float]:
    """(accept, frame) in ns per message, the best of three tries: ``count`` payloads of
    ``kind`` accepted by a core sending to ``consumer``, ``batch`` at a time, each batch
    then written into a frame by ``codec``'s frame builder (None: not written)."""
    tries = [_measure_once(kind, consumer, codec, count, batch) for _ in range(3)]
    return min(t[0] for t in tries), min(t[1] for t in tries)


def _measure_once(
    kind: str, consumer: Ref, codec: Codec | None, count: int, batch: int
) -> tuple[float, float]:
    gc.collect()
    make = PAYLOADS[kind]
    payloads = [make(n) for n in range(count)]
    core = steady_core(consumer, count)
    next_message = core.next_message
    accept = frame = 0.0
    for start in range(0, count, batch):
        chunk = payloads[start : start + batch]
        t0 = time.perf_counter()
        numbered = [next_message(p) for p in chunk]
        t1 = time.perf_counter()
        accept += t1 - t0
        if codec is not None:
            outbox = deque(("consumer", m) for m in numbered)
            t2 = time.perf_counter()
            builder = FrameBuilder(codec)
            failed = builder.fill(outbox, batch)
            frame += time.perf_counter() - t2
            assert not failed, failed
    return accept / count * 1e9, frame / count * 1e9


def one_round(count: int, batch: int) -> dict[str, float]:
    serializer = OrderSerializer()
    serialization = Serialization()
    serialization.register(serializer, for_types=(Order,))
    node = Node(serialization=serialization).start()
    try:
        remote = node.ref(PEER)
        codec = Codec(serialization, lambda ref: f"{node.address}/bench", node.ref)
        figures: dict[str, float] = {}
        for kind in PAYLOADS:
            writes = serializer.writes
            accept, frame = measure(kind, remote, codec, count, batch)
            if kind == "user":
                figures["user_writes_per_message"] = (serializer.writes - writes) / (3 * count)
            floor, _ = measure(kind, _Sink(), None, count, batch)
            figures[f"{kind}_accept_ns"] = accept
            figures[f"{kind}_accept_in_process_ns"] = floor
            figures[f"{kind}_frame_ns"] = frame
            figures[f"{kind}_total_ns"] = accept + frame
            figures[f"{kind}_check_ratio"] = (accept + frame) / (floor + frame)
    finally:
        node.stop()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=100)
    args = parser.parse_args()
    rounds = []
    for _ in range(args.runs):
        figures = one_round(args.messages, args.batch)
        rounds.append(figures)
        print(json.dumps({k: round(v, 3) for k, v in figures.items()}), flush=True)
    result: dict[str, float] = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    result["messages"] = args.messages
    result["batch"] = args.batch
    result["runs"] = args.runs
    for kind in PAYLOADS:
        print(
            f"{kind:9s} accept {result[f'{kind}_accept_ns']:7.0f} ns "
            f"(in-process {result[f'{kind}_accept_in_process_ns']:5.0f}), "
            f"frame {result[f'{kind}_frame_ns']:6.0f} ns, "
            f"total {result[f'{kind}_total_ns']:7.0f} ns, "
            f"x{result[f'{kind}_check_ratio']:.2f} of no check"
        )
    print(f"user serializer writes per message: {result['user_writes_per_message']:.2f}")
    print(json.dumps({k: round(v, 3) for k, v in result.items()}))


if __name__ == "__main__":
    main()
