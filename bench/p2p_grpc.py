"""Point-to-point delivery between two processes over gRPC, against two ceilings.

The producer runs in this process, the consumer in a child process; one-by-one
confirmation, 100-byte payloads. Measured in the same run:

* ``handle``: `Producer` -> `Consumer` handles, windows 50 and 500 (msgs/s);
* ``metrics_on``: the same handle route (window 500) with Prometheus metrics served in
  both processes (`pykka_delivery.metrics.serve`), each scraped by a scraper process of
  its own every ``--scrape-every`` seconds during the run (default 1 s, fifteen times as
  often as Prometheus' default interval of 15 s); ``metrics_on_vs_handle`` is its ratio to
  ``handle`` (issue 19 asks for at least 0.9);
* ``actor``: producer actor -> ProducerController -> ConsumerController -> consumer actor,
  window 500 (msgs/s);
* ``async_handle``: `AsyncProducer` -> `AsyncConsumer`, each on its process's event loop
  with the node on that loop too (``async with Node()``), window 500 (msgs/s);
* ``latency``: end-to-end latency through the handles (window 500) at fixed rates of
  2 000, 10 000 and 100 000 msgs/s, for both kinds of handles (keys ``p99_ms_at_2k``
  for the sync handles, ``async_p99_ms_at_2k`` for the asyncio ones): the payload
  carries the CLOCK_MONOTONIC send time (shared by both processes) and the consumer takes
  the difference on receipt;
* ceiling ``grpc``: a raw bidirectional gRPC stream moving the same SequencedMessage
  envelopes batched as the transport batched them in the same round (the mean number of
  messages per frame of the window-500 handle run: 250, since the consumer grants half a
  window at a time), no flow control, no confirmation; ``grpc_ceiling_500`` is the same
  with 500 messages per frame, a stricter bound shown beside it;
* latency floor ``grpc``: the same raw stream paced as the asyncio handles are, one frame a
  burst of stamped messages, its server taking each message's delay as the consumer
  does (keys ``grpc_p50_ms_at_2k``, ``grpc_p99_ms_at_2k``...): what gRPC alone gives on
  this machine at that moment, with no protocol, no handle and no transport;
* ceiling ``pykka_pingpong``: a raw pykka ping-pong (each message waits for its reply).

The last line printed is one JSON object with the figures.

Each figure is the median of ``--runs`` rounds (default 3), each round measuring every
figure once, a ceiling right before its route; ``steal_pct`` is the share of the
machine's CPU time its host took during the run (a noisy neighbour shows there).

Usage: python bench/p2p_grpc.py [--messages N] [--runs R] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pykka

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.p2p_local import pykka_pingpong  # noqa: E402
from pykka_delivery import (  # noqa: E402
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    ConsumerController,
    ConsumerControllerSettings,
    Delivery,
    Producer,
    ProducerController,
    RegisterToProducerController,
    RequestNext,
    metrics,
)
from pykka_delivery.protocol import transport_pb2, transport_pb2_grpc  # noqa: E402
from pykka_delivery.transport import Node  # noqa: E402

PAYLOAD = b"x" * 100
RAW_BATCH = 500
SCRAPER = Path(__file__).with_name("_scraper.py")
# Seconds between two scrapes of a process's metrics (metrics_on): --scrape-every, passed
# on to the child process through the environment.
SCRAPE_EVERY = float(os.environ.get("BENCH_SCRAPE_EVERY", "1.0"))


def set_scrape_every(seconds: float) -> None:
    """Scrape every ``seconds`` in this process and in the children it spawns."""
    global SCRAPE_EVERY  # noqa: PLW0603 (a setting of the whole run)
    SCRAPE_EVERY = seconds
    os.environ["BENCH_SCRAPE_EVERY"] = str(seconds)


@contextmanager
def scraped(on: bool) -> Iterator[list[int]]:
    """With ``on``: this process's metrics served (port 0) and scraped by a process of its
    own, as Prometheus scrapes, at once and then every SCRAPE_EVERY seconds, until the
    block ends; yields a list that holds the number of scrapes once it has ended. (A
    scraping thread inside the measured process would charge its own HTTP client's work
    and GIL turns to the route; what a user pays is the endpoint's side only.)"""
    count = [0]
    if not on:
        yield count
        return
    server = metrics.serve(port=0)
    scraper = subprocess.Popen(
        [sys.executable, str(SCRAPER), server.address, str(SCRAPE_EVERY)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert scraper.stdin is not None and scraper.stdout is not None
    try:
        if scraper.stdout.readline().strip() != "ready":  # started, and scraped once
            raise RuntimeError(f"the scraper of {server.url} failed")
        yield count
    finally:
        scraper.stdin.close()
        count[0] = int(scraper.stdout.read() or 0)
        scraper.wait(30)
        server.close()


# --- child process: the consumer side ------------------------------------------------


class _Tally:
    """What the consumer side measures: the rate from the first delivery on, or (with
    ``latency``) each message's delay from the send time it carries."""

    def __init__(self, count: int, latency: bool) -> None:
        self.count = count
        self.latency = latency
        self.delays: list[float] = []
        self.started = 0.0
        self.seconds = 0.0

    def take(self, delivery: Delivery) -> bool:
        """Count ``delivery``, then confirm it; True at the last one."""
        last = self.record(delivery.seq_nr, delivery.message)
        delivery.confirm()
        return last

    def record(self, seq_nr: int, payload: bytes) -> bool:
        """Count message ``seq_nr`` carrying ``payload``; True at the last one."""
        if self.latency:
            if seq_nr > 1:  # 1 is the warm-up: it waited for the session
                self.delays.append(time.monotonic() - float(payload[:20]))
        elif seq_nr == 1:
            self.started = time.perf_counter()
        if seq_nr >= self.count:
            self.seconds = time.perf_counter() - self.started
            return True
        return False

    def result(self, node: Node | None) -> dict[str, Any]:
        if not self.latency:
            rate = (self.count - 1) / self.seconds
            if node is None:
                return {"msgs_per_s": rate}
            stats = node.statistics()
            per_frame = stats.envelopes_received / max(1, stats.frames_received)
            return {"msgs_per_s": rate, "msgs_per_frame": per_frame}
        delays = sorted(self.delays)
        return {
            "p50_ms": delays[len(delays) // 2] * 1000,
            "p99_ms": delays[int(len(delays) * 0.99)] * 1000,
            "max_ms": delays[-1] * 1000,
        }


def _connected(kind: Any, node: Node, producer_path: str, window: int) -> Any:
    """A ``kind`` (`Consumer` or `AsyncConsumer`) exposed on ``node``, registered to the
    bench's producer."""
    settings = ConsumerControllerSettings(flow_control_window=window)
    consumer = kind(settings, self_ref_factory=node.expose("bench-consumer"))
    consumer.register_to(node.ref(producer_path))
    return consumer


def child_handle(
    producer_path: str, count: int, window: int, latency: bool, metrics_on: bool = False
) -> dict[str, Any]:
    with Node() as node, scraped(metrics_on) as scrapes:
        consumer = _connected(Consumer, node, producer_path, window)
        tally = _Tally(count, latency)
        for delivery in consumer:
            if tally.take(delivery):
                break
        consumer.close()
        result = tally.result(node)
    return {**result, "scrapes": scrapes[0]}


def child_async(producer_path: str, count: int, window: int, latency: bool) -> dict[str, Any]:
    async def consume() -> dict[str, Any]:
        async with Node() as node:
            consumer = _connected(AsyncConsumer, node, producer_path, window)
            tally = _Tally(count, latency)
            async for delivery in consumer:
                if tally.take(delivery):
                    break
            consumer.close()
            return tally.result(node)

    return asyncio.run(consume())


class _Confirmer(pykka.ThreadingActor):
    def __init__(self, count: int, done: threading.Event) -> None:
        super().__init__()
        self.count = count
        self.done = done
        self.started = 0.0

    def on_receive(self, delivery: Any) -> None:
        if delivery.seq_nr == 1:
            self.started = time.perf_counter()
        delivery.confirm()
        if delivery.seq_nr >= self.count:
            self.done.set()


def child_actor(producer_path: str, count: int, window: int) -> dict[str, Any]:
    with Node() as node:
        done = threading.Event()
        confirmer = _Confirmer.start(count, done)
        settings = ConsumerControllerSettings(flow_control_window=window)
        cc = ConsumerController.start(settings, self_ref_factory=node.expose("bench-cc"))
        cc.tell(ConsumerController.Start(confirmer))
        cc.tell(RegisterToProducerController(node.ref(producer_path)))
        done.wait(600)
        seconds = time.perf_counter() - confirmer.proxy().started.get()
        pykka.ActorRegistry.stop_all()
    return {"msgs_per_s": (count - 1) / seconds}


class _RawServicer(transport_pb2_grpc.NodeServicer):
    def __init__(self, tally: _Tally, done: asyncio.Event) -> None:
        self.tally = tally
        self.done = done

    async def Link(self, request_iterator: Any, context: Any) -> None:
        tally = self.tally
        received = 0
        while (frame := await context.read()) is not grpc.aio.EOF:
            if tally.latency:  # each message's delay, as the handles' consumer takes it
                for envelope in frame.envelopes:
                    message = envelope.sequenced
                    if tally.record(message.seq_nr, message.payload.data):
                        self.done.set()
                        return
                continue
            if not received:
                tally.started = time.perf_counter()
            for envelope in frame.envelopes:  # touch each message as a consumer would
                _ = envelope.sequenced.payload.data
            received += len(frame.envelopes)
            if received >= tally.count:
                tally.seconds = time.perf_counter() - tally.started
                self.done.set()
                return


def child_raw(port_file: str, count: int, latency: bool) -> dict[str, Any]:
    async def serve() -> dict[str, Any]:
        done = asyncio.Event()
        tally = _Tally(count, latency)
        server = grpc.aio.server()
        transport_pb2_grpc.add_NodeServicer_to_server(_RawServicer(tally, done), server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        Path(port_file).write_text(str(port))
        await done.wait()
        await server.stop(0.5)
        return tally.result(None)

    return asyncio.run(serve())


# --- parent process: the producer side -------------------------------------------------


def spawn(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, __file__, "--child", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )


def result_of(child: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = child.communicate(timeout=600)
    return dict(json.loads(out.strip().splitlines()[-1]))


PERIOD = 0.001  # paced runs send rate * PERIOD messages at once, every PERIOD seconds


def stamped() -> bytes:
    """A payload carrying the send time (CLOCK_MONOTONIC, shared by both processes)."""
    return f"{time.monotonic():<20.9f}".encode() + PAYLOAD[20:]


def run_handle(
    count: int, window: int, rate: float | None = None, metrics_on: bool = False
) -> dict[str, Any]:
    """The handle route; with ``metrics_on``, metrics are served and scraped in both
    processes meanwhile (``scrapes``: how many scrapes both did)."""
    with Node() as node, scraped(metrics_on) as scrapes:
        producer = Producer("bench", self_ref_factory=node.expose("bench"))
        args = (f"{node.address}/bench", str(count), str(window), str(bool(rate)))
        child = spawn("handle", *args, str(metrics_on))
        sent = 0
        if rate:  # warm up: the paced messages must not wait for the session to start
            producer.send(stamped(), timeout=120)
            producer.wait_confirmed(timeout=120)
            sent = 1
        per_tick = max(1, round((rate or 0) * PERIOD))
        next_tick = time.monotonic()
        while sent < count:
            if rate:
                for _ in range(min(per_tick, count - sent)):
                    producer.send(stamped(), timeout=120)
                    sent += 1
                next_tick += PERIOD
                pause = next_tick - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            else:
                producer.send(PAYLOAD, timeout=120)
                sent += 1
        result = result_of(child)
        producer.close()
    return {**result, "scrapes": result["scrapes"] + scrapes[0]}


async def paced(count: int, rate: float, burst: Callable[[int], Awaitable[None]]) -> None:
    """Send messages 2..``count`` (1 was the warm-up) at ``rate``: ``burst(n)`` sends the
    next ``n``, ``rate * PERIOD`` of them every PERIOD seconds. asyncio rounds timers up
    to whole milliseconds: a late tick is caught up by the next (the schedule is absolute),
    as in `run_handle`."""
    per_tick = max(1, round(rate * PERIOD))
    sent = 1
    next_tick = time.monotonic()
    while sent < count:
        n = min(per_tick, count - sent)
        await burst(n)
        sent += n
        next_tick += PERIOD
        pause = next_tick - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)


def run_async_handle(count: int, window: int, rate: float | None = None) -> dict[str, Any]:
    """`run_handle` with the asyncio handles, each process's node on its event loop."""

    async def produce() -> dict[str, Any]:
        async with Node() as node:
            producer = AsyncProducer("bench", self_ref_factory=node.expose("bench"))
            path = f"{node.address}/bench"
            child = spawn("async", path, str(count), str(window), str(bool(rate)))
            if rate:
                await producer.send(stamped(), timeout=120)
                await producer.wait_confirmed(timeout=120)

                async def burst(n: int) -> None:
                    for _ in range(n):
                        await producer.send(stamped(), timeout=120)

                await paced(count, rate, burst)
            else:
                for _ in range(count):
                    await producer.send(PAYLOAD, timeout=120)
            result = await asyncio.to_thread(result_of, child)
            producer.close()
            return result

    return asyncio.run(produce())


class _Numbers(pykka.ThreadingActor):
    def __init__(self, count: int) -> None:
        super().__init__()
        self.count = count
        self.sent = 0

    def on_receive(self, message: Any) -> None:
        if isinstance(message, RequestNext) and self.sent < self.count:
            self.sent += 1
            message.send_next_to.tell(PAYLOAD)


def run_actor(count: int, window: int) -> dict[str, Any]:
    with Node() as node:
        pc = ProducerController.start("bench-actor", self_ref_factory=node.expose("bench-pc"))
        pc.tell(ProducerController.Start(_Numbers.start(count)))
        child = spawn("actor", f"{node.address}/bench-pc", str(count), str(window))
        result = result_of(child)
        pykka.ActorRegistry.stop_all()
    return result


def run_raw(
    count: int, port_file: Path, batch: int = RAW_BATCH, rate: float | None = None
) -> dict[str, Any]:
    """The raw stream: ``batch`` messages a frame as fast as it goes (msgs/s), or, at
    ``rate``, paced as `run_async_handle` paces its sends, a frame a burst (latency)."""
    port_file.unlink(missing_ok=True)
    child = spawn("raw", str(port_file), str(count), str(bool(rate)))
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline:
            raise RuntimeError("raw server did not start")
        time.sleep(0.01)
    port = int(port_file.read_text())

    async def push() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = transport_pb2_grpc.NodeStub(channel).Link()  # type: ignore[no-untyped-call]
            sent = 0

            async def write(n: int) -> None:
                nonlocal sent
                frame = transport_pb2.Frame()
                for _ in range(n):
                    envelope = frame.envelopes.add()
                    envelope.target = "bench-consumer"
                    message = envelope.sequenced
                    message.producer_id = "bench"
                    message.seq_nr = sent + 1
                    message.producer_controller = "127.0.0.1:1/bench"
                    message.payload.serializer_id = 1
                    message.payload.data = stamped() if rate else PAYLOAD
                    sent += 1
                await call.write(frame)

            if rate:
                await write(1)  # warm up: the stream is open before the paced messages
                await asyncio.sleep(0.2)
                await paced(count, rate, write)
            while sent < count:
                await write(min(batch, count - sent))
            await call.done_writing()
            async for _ in call:
                pass

    asyncio.run(push())
    return result_of(child)


def cpu_ticks() -> tuple[int, int]:
    """(all CPU ticks, stolen ticks) of the machine so far, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[7]


def metrics_pair(n: int, index: int) -> dict[str, float]:
    """The handle route and its metrics-on twin back to back, in turns first (round
    ``index``), and their ratio."""
    if index % 2:
        metrics_on = run_handle(n, 500, metrics_on=True)
        handle = run_handle(n, 500)
    else:
        handle = run_handle(n, 500)
        metrics_on = run_handle(n, 500, metrics_on=True)
    return {
        "handle_msgs_per_s": handle["msgs_per_s"],
        "msgs_per_frame": handle["msgs_per_frame"],
        "metrics_on_msgs_per_s": metrics_on["msgs_per_s"],
        "metrics_on_scrapes": metrics_on["scrapes"],
        "metrics_on_vs_handle": metrics_on["msgs_per_s"] / handle["msgs_per_s"],
    }


def one_round(n: int, port_file: Path, quick: bool, index: int = 0) -> dict[str, float]:
    """Every figure once, each ceiling right before the route it bounds; the handle route
    and its metrics-on twin back to back, in turns first (round ``index``)."""
    figures = metrics_pair(n, index)
    batch = round(figures["msgs_per_frame"])  # the ceiling batches as the transport did
    figures["grpc_ceiling_msgs_per_s"] = run_raw(n, port_file, batch)["msgs_per_s"]
    figures["async_handle_msgs_per_s"] = run_async_handle(n, 500)["msgs_per_s"]
    figures["grpc_ceiling_500_msgs_per_s"] = run_raw(n, port_file, RAW_BATCH)["msgs_per_s"]
    figures["handle_w50_msgs_per_s"] = run_handle(n // 2, 50)["msgs_per_s"]
    figures["pykka_pingpong_msgs_per_s"] = pykka_pingpong(20_000)
    figures["actor_msgs_per_s"] = run_actor(n // 10, 500)["msgs_per_s"]
    for rate, key in ((2_000, "2k"), (10_000, "10k"), (100_000, "100k")):
        count = max(2_000, int(rate * (2.0 if quick else 5.0)))
        floor = run_raw(count, port_file, rate=rate)  # what gRPC alone gives, paced alike
        figures[f"grpc_p50_ms_at_{key}"] = floor["p50_ms"]
        figures[f"grpc_p99_ms_at_{key}"] = floor["p99_ms"]
        for route, prefix in ((run_handle, ""), (run_async_handle, "async_")):
            latency = route(count, 500, rate)
            figures[f"{prefix}p50_ms_at_{key}"] = latency["p50_ms"]
            figures[f"{prefix}p99_ms_at_{key}"] = latency["p99_ms"]
    for name in ("handle", "async_handle"):
        for ceiling in ("grpc_ceiling", "grpc_ceiling_500"):
            figures[f"{name}_vs_{ceiling}"] = (
                figures[f"{name}_msgs_per_s"] / figures[f"{ceiling}_msgs_per_s"]
            )
    figures["actor_vs_pingpong"] = (
        figures["actor_msgs_per_s"] / figures["pykka_pingpong_msgs_per_s"]
    )
    return figures


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        role, *child_args = sys.argv[2:]
        if role == "handle":
            out = child_handle(
                child_args[0],
                int(child_args[1]),
                int(child_args[2]),
                child_args[3] == "True",
                child_args[4] == "True",
            )
        elif role == "async":
            out = child_async(
                child_args[0], int(child_args[1]), int(child_args[2]), child_args[3] == "True"
            )
        elif role == "actor":
            out = child_actor(child_args[0], int(child_args[1]), int(child_args[2]))
        else:
            out = child_raw(child_args[0], int(child_args[1]), child_args[2] == "True")
        print(json.dumps(out), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3, help="rounds; each figure is a median")
    parser.add_argument("--quick", action="store_true", help="fewer messages, for a smoke run")
    parser.add_argument(
        "--metrics-only",
        action="store_true",
        help="only the handle route and its metrics-on twin, --runs pairs (the ratio wants "
        "more pairs than the whole bench has rounds: the machine's noise is larger than "
        "the cost measured)",
    )
    parser.add_argument(
        "--scrape-every",
        type=float,
        default=SCRAPE_EVERY,
        help="seconds between two scrapes of each process's metrics on the metrics-on "
        "route (default 1: fifteen times as often as Prometheus' default interval)",
    )
    args = parser.parse_args()
    set_scrape_every(args.scrape_every)
    n = 20_000 if args.quick else args.messages
    runs = 1 if args.quick else args.runs
    port_file = Path(f"/tmp/pykka-delivery-bench-{os.getpid()}.port")
    total_before, stolen_before = cpu_ticks()
    if args.metrics_only:
        rounds = [metrics_pair(n, index) for index in range(runs)]
    else:
        rounds = [one_round(n, port_file, args.quick, index) for index in range(runs)]
    total_after, stolen_after = cpu_ticks()
    # The median of each figure over the rounds; a ratio is the median of the rounds'
    # ratios (each round measures a ceiling and its route minutes apart at most).
    figures = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    for key, value in figures.items():
        exact = "_ms_" in key or "_vs_" in key
        each = ", ".join(f"{r[key]:.3f}" if exact else f"{r[key]:,.0f}" for r in rounds)
        shown = f"{value:>14,.3f}" if exact else f"{value:>14,.0f}"
        print(f"{key:<36}{shown}   ({each})")
    summary = {k: round(v, 3) for k, v in figures.items()}
    summary["runs"] = runs
    summary["scrape_every_s"] = SCRAPE_EVERY
    # How much of the machine its host took meanwhile (steal): a noisy run shows here.
    summary["steal_pct"] = round(
        100 * (stolen_after - stolen_before) / max(1, total_after - total_before), 2
    )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
