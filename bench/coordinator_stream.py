"""The coordinator server's own CPU per request, without gRPC: a less noisy A/B figure.

One ``Connect`` stream of a `CoordinatorServer` (its `_Stream`: reader, writer, the
actor's answers handed back to the loop) is driven by a fake gRPC context that returns
``--requests`` registrations (already serialized) and takes the replies, and a fake actor
that answers each told `Execute` at once from its own thread (as the real actor does after
its group commit, with no machine and no log). The figure is this process's CPU (all
threads) per request: what the server's Python costs around the actor, apart from gRPC's
read and write. ``stream_us_per_request``: one request at a time (the client waits for each
reply); ``stream_us_per_request_pipelined``: up to ``PIPELINED`` requests in flight (as
``stream_pipeline`` allows). ``--runs`` runs of each, the median printed.

On a machine shared with other work the throughput figures of bench/coordinator.py move by
±30% from run to run; this one, in one process and without the network, moves far less.

Usage: python bench/coordinator_stream.py [--requests N] [--runs R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import queue
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pykka_delivery.coordinator import CoordinatorServer, Registered  # noqa: E402
from pykka_delivery.coordinator._service_stream import _Stream  # noqa: E402
from pykka_delivery.protocol import coordinator_pb2 as pb  # noqa: E402

PIPELINED = 16  # requests in flight in the pipelined variant
HELLO_ID = 1


class _Answered:
    def get(self, timeout: float | None = None) -> None:
        return None


class FakeActor:
    """Answers every told `Execute` at once, from its own thread; asks get None."""

    def __init__(self) -> None:
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._reply = Registered(True, 1)
        threading.Thread(target=self._run, name="fake-actor", daemon=True).start()

    def _run(self) -> None:
        while True:
            message = self._inbox.get()
            if message is None:
                return
            message.reply_to(self._reply)

    def tell(self, message: Any) -> None:
        self._inbox.put(message)

    def ask(self, message: Any, block: bool = False) -> _Answered:
        return _Answered()

    def stop(self) -> None:
        self._inbox.put(None)


class FakeContext:
    """A Connect call's server side: reads the requests (at most ``in_flight`` not yet
    answered), takes the replies."""

    def __init__(self, requests: int, in_flight: int) -> None:
        self._requests = [
            pb.ClientMessage(
                request_id=HELLO_ID + 1 + i,
                register=pb.Register(
                    group=pb.GroupKey(namespace="bench", stream="s", name=f"g{i % 100}"),
                    subscription_id=i,
                ),
            ).SerializeToString()
            for i in range(requests)
        ]
        self._in_flight = in_flight
        self.read_count = 0
        self.answered = 0
        self.error = ""
        self._answer = asyncio.Event()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    async def read(self) -> Any:
        while self.read_count - self.answered >= self._in_flight and not self.error:
            self._answer.clear()
            await self._answer.wait()
        if self.error:
            raise RuntimeError(self.error)
        if self.read_count == len(self._requests):
            return grpc.aio.EOF
        self.read_count += 1
        return self._requests[self.read_count - 1]

    async def write(self, message: pb.ServerMessage) -> None:
        if message.reply.request_id == HELLO_ID:
            return
        expected = HELLO_ID + 1 + self.answered  # replies come in request order
        if message.reply.request_id != expected or not message.reply.HasField("registered"):
            # Raised by the reader: the stream's writer takes a failed write for a gone call.
            self.error = f"reply {message} where the registration {expected} was expected"
            self._answer.set()
            return
        self.answered += 1
        self._answer.set()

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"the stream was aborted: {code.name}: {details}")


def run_once(requests: int, in_flight: int) -> float:
    """CPU µs per request of one stream carrying ``requests`` registrations."""
    actor = FakeActor()
    server = CoordinatorServer(actor)  # type: ignore[arg-type]
    context = FakeContext(requests, in_flight)

    async def carry() -> float:
        hello = pb.Hello(connection_id="bench", node="bench", owner="bench")
        stream = _Stream(server, context, hello)  # type: ignore[arg-type]
        started = time.process_time()
        await stream.run(HELLO_ID)
        return time.process_time() - started

    try:
        cpu = server._loop.run_until_complete(carry())
    finally:
        actor.stop()
        server._asks.shutdown()
        server._loop.close()
    if context.answered != requests:
        raise RuntimeError(f"{context.answered} of {requests} requests answered")
    return cpu / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    figures: dict[str, float] = {}
    for name, in_flight in (("", 1), ("_pipelined", PIPELINED)):
        runs = [run_once(args.requests, in_flight) for _ in range(args.runs)]
        figures[f"stream_us_per_request{name}"] = round(statistics.median(runs), 1)
        print(f"  stream_us_per_request{name:<12}" + " ".join(f"{r:7.1f}" for r in runs))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
