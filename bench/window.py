"""The flow-control window of the handles: throughput against memory, to choose defaults.

Between two processes over gRPC (as ``bench/p2p_grpc.py`` runs them: `Producer` here,
`Consumer` in a child process, one-by-one confirmation, 100-byte payloads), for each
window of ``--windows``: messages per second, and the ratio to a raw gRPC stream moving
the same envelopes measured in the same round (500 a frame, no flow control, no
confirmation). And, in this process, what a window costs in memory: the bytes
allocated per message held unconfirmed (a producer holds up to a window of them, and a
consumer up to a window in its inbox), measured with ``tracemalloc`` for the 100-byte
payload of the throughput runs.

Each figure is the median of ``--runs`` rounds. The last line printed is one JSON object:
``window_<W>_msgs_per_s`` and ``window_<W>_vs_grpc_ceiling`` per window,
``grpc_ceiling_msgs_per_s``, ``producer_bytes_per_message``,
``consumer_bytes_per_message``.

Usage: python bench/window.py [--messages N] [--runs R] [--windows 50,500,...]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.p2p_grpc import PAYLOAD, RAW_BATCH, run_handle, run_raw  # noqa: E402
from pykka_delivery import Consumer, ConsumerControllerSettings, Producer  # noqa: E402
from pykka_delivery.delivery.timers import TimerService  # noqa: E402
from pykka_delivery.protocol.messages import (  # noqa: E402
    Request,
    SequencedMessage,
    SequencedRun,
    new_sequenced_message,
)

WINDOWS = (16, 50, 100, 250, 500, 1000, 2000)


class _Grant:
    """A consumer side that grants ``window`` at the session's first message and never
    confirms: the producer then holds a window of unconfirmed messages."""

    def __init__(self, window: int) -> None:
        self.window = window

    def tell(self, message: object) -> None:
        if isinstance(message, SequencedMessage) and message.first:
            message.producer_controller.tell(Request(0, self.window))


class _Silent:
    def tell(self, message: object) -> None:
        pass


def _allocated(action: Callable[[], object]) -> int:
    """Bytes still allocated after ``action()`` (what it keeps alive)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = action()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return after - before


def bytes_per_message(held: int = 2_000) -> tuple[float, float]:
    """(producer, consumer) bytes allocated per message held: a producer's unconfirmed
    message (payload included, as the application built it), and a message waiting in a
    consumer's inbox as a transport hands it over (its payload decoded from a frame)."""
    timers = TimerService()
    try:
        producer = Producer("bench", timer_service=timers)
        producer.register_consumer(_Grant(held))

        def send_all() -> None:
            for _ in range(held):
                producer.send(bytes(bytearray(PAYLOAD)), timeout=10)

        producer_bytes = _allocated(send_all) / held
        producer.close()

        settings = ConsumerControllerSettings(flow_control_window=held + 1)
        consumer = Consumer(settings, timer_service=timers)
        silent = _Silent()
        consumer.ref.tell(new_sequenced_message("bench", 1, PAYLOAD, True, False, silent))
        consumer.receive(timeout=10).confirm()

        def arrive() -> None:
            run = SequencedRun("bench", 2, [bytes(bytearray(PAYLOAD)) for _ in range(held)], silent)
            consumer.ref.tell_runs([run])  # type: ignore[attr-defined]

        consumer_bytes = _allocated(arrive) / held
        consumer.close()
    finally:
        timers.shutdown()
    return producer_bytes, consumer_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--windows", default=",".join(str(w) for w in WINDOWS))
    args = parser.parse_args()
    windows = [int(w) for w in args.windows.split(",")]
    port_file = Path(f"/tmp/pykka-delivery-bench-window-{os.getpid()}.port")
    rounds: list[dict[str, float]] = []
    for _ in range(args.runs):
        figures: dict[str, float] = {}
        figures["grpc_ceiling_msgs_per_s"] = run_raw(args.messages, port_file, RAW_BATCH)[
            "msgs_per_s"
        ]
        for window in windows:
            # Small windows are slow: fewer messages keep each route to seconds.
            count = args.messages if window >= 250 else args.messages // 4
            rate = run_handle(count, window)["msgs_per_s"]
            figures[f"window_{window}_msgs_per_s"] = rate
            figures[f"window_{window}_vs_grpc_ceiling"] = rate / figures["grpc_ceiling_msgs_per_s"]
        rounds.append(figures)
        print(json.dumps({k: round(v, 3) for k, v in figures.items()}), flush=True)
    result = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    producer_bytes, consumer_bytes = bytes_per_message()
    result["producer_bytes_per_message"] = producer_bytes
    result["consumer_bytes_per_message"] = consumer_bytes
    result["payload_bytes"] = len(PAYLOAD)
    result["runs"] = args.runs
    print(json.dumps({k: round(v, 3) for k, v in result.items()}))


if __name__ == "__main__":
    main()
