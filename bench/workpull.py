"""Work pulling over worker processes: throughput with 1, 2 and 4 workers.

Each worker is a process of its own (``python -m tests.delivery.durable.workpull_procs worker``)
that spends about ``--work-us`` µs of CPU per message in a busy loop calibrated when it
starts, so that the work, not the transport, is the bottleneck; it registers in the
coordinator's service directory, where the producer finds it. The coordinator (in
memory, its gRPC server) and the work-pulling producer run in this process, with 100-byte
messages. A run sends ``--warmup`` messages and waits until they are confirmed, then sends
the other ``--messages``; it is timed from then to the moment the last of them is
processed (each worker reports the CLOCK_MONOTONIC of its last message; the processes
share the clock), and checked: every message processed exactly once (no worker leaves).

Two routes, measured in the same run:

* ``handle`` (the figures named ``workpull_N_msgs_per_s``): a `WorkPullingProducer`
  handle, and workers that are `Consumer` handles registered under the service key;
  workers confirm with their Requests (the handle's default, ``ack_each_message=False``).
* ``actor`` (``--actor``): a `WorkPullingProducerController` actor fed by a producer
  actor, one message per `RequestNext`, and workers that are `ConsumerController` actors
  with a worker actor: a thread hop per message on each side, and every message
  acknowledged (Akka's behaviour). An eighth of the messages (it is that much slower).

The machine is shared, so each configuration runs ``--repeat`` times, interleaved, and the
best run counts (another process's load only ever slows a run down).

The last line printed is one JSON object with ``workpull_1_msgs_per_s``,
``workpull_2_msgs_per_s``, ``workpull_4_msgs_per_s``, the ratios ``workpull_2_vs_1`` and
``workpull_4_vs_1``, and with ``--actor`` the same for the actor route.

Usage: python bench/workpull.py [--messages N] [--work-us U] [--window W] [--repeat K]
[--actor] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pykka

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pykka_delivery import (  # noqa: E402
    RequestNext,
    WorkPullingProducerController,
)
from pykka_delivery.coordinator import (  # noqa: E402
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    CoordinatorSettings,
)
from pykka_delivery.coordinator.service_registry import CoordinatorServiceRegistry  # noqa: E402
from pykka_delivery.delivery.handles.work_pulling import WorkPullingProducer  # noqa: E402
from pykka_delivery.transport import Node  # noqa: E402
from tests.delivery.durable.workpull_procs import calibrate, numbers_in, payload  # noqa: E402
from tests.transport.procs import Proc  # noqa: E402

KEY = "bench-jobs"
WAIT = 60.0  # bound on every single wait


class _Numbers(pykka.ThreadingActor):
    """The producer of the actor route: one numbered message per `RequestNext`, from
    ``first`` to ``last``."""

    use_daemon_thread = True

    def __init__(self, first: int, last: int) -> None:
        super().__init__()
        self.next = first
        self.last = last

    def on_receive(self, message: Any) -> None:
        if type(message) is RequestNext and self.next <= self.last:
            message.send_next_to.tell(payload(self.next))
            self.next += 1


def _wait(condition: Callable[[], bool], what: str, poll: float = 0.01) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > deadline:
            msg = f"{what}: not within {WAIT} s"
            raise RuntimeError(msg)
        time.sleep(poll)


def run(
    workers: int,
    count: int,
    *,
    route: str = "handle",
    warmup: int = 2_000,
    iterations: int = 0,
    window: int = 500,
) -> dict[str, Any]:
    """One timed run: ``warmup`` messages, then ``count`` more, through work pulling to
    ``workers`` worker processes, all of the same ``route`` (``"handle"`` or ``"actor"``),
    each running ``iterations`` of the work loop per message (0: 50 µs, calibrated by
    each worker).

    Returns:
        ``msgs_per_s`` (the ``count`` timed messages), ``seconds``, ``processed`` per
        worker, CPU per message of this process (producer, transport, coordinator) and
        of the workers (work included), and ``missing`` / ``duplicates`` (both 0).

    Raises:
        RuntimeError: a wait took longer than 60 s, or a message was lost or duplicated.
    """
    coordinator = CoordinatorActor.start(settings=CoordinatorSettings(disconnected_timeout=0.5))
    server = CoordinatorServer(coordinator).start()
    node = Node().start()
    settings = CoordinatorClientSettings(request_timeout=WAIT)
    client = CoordinatorClient(server.address, node=node.address, settings=settings)
    registry = CoordinatorServiceRegistry(client, node.ref)
    procs: list[Proc] = []
    with tempfile.TemporaryDirectory(prefix="workpull-bench-") as tmp:
        files = [Path(tmp) / f"worker-{i}.txt" for i in range(workers)]
        try:
            for i, path in enumerate(files):
                argv = ["-m", "tests.delivery.durable.workpull_procs", "worker"]
                argv += ["--coordinator", server.address, "--key", KEY, "--file", str(path)]
                argv += ["--name", f"worker-{i}", "--iterations", str(iterations)]
                argv += ["--window", str(window), "--route", route]
                procs.append(Proc(f"worker-{i}", argv))
            for proc in procs:
                proc.ready(WAIT)
            drive = _drive_actor if route == "actor" else _drive_handle
            cpu = time.process_time()
            started = drive(node, registry, workers, warmup, count)
            cpu = time.process_time() - cpu
            for proc in procs:
                proc.popen.terminate()
            done = [proc.expect(lambda line: bool(line.get("done")), WAIT) for proc in procs]
            processed = [numbers_in(path) for path in files]
        finally:
            for proc in procs:
                proc.kill()
            pykka.ActorRegistry.stop_all()
            client.close()
            node.stop()
            server.stop()
            coordinator.stop()
    everything = [n for numbers in processed for n in numbers]
    missing = warmup + count - len(set(everything))
    duplicates = len(everything) - len(set(everything))
    if missing or duplicates:
        msg = f"{workers} workers, {route}: {missing} messages missing, {duplicates} duplicates"
        raise RuntimeError(msg)
    seconds = max(line["last_at"] for line in done) - started
    total = warmup + count
    return {
        "msgs_per_s": count / seconds,
        "seconds": seconds,
        "processed": [len(numbers) for numbers in processed],
        "producer_cpu_us_per_msg": cpu / total * 1e6,
        "worker_cpu_us_per_msg": sum(line["cpu_seconds"] for line in done) / total * 1e6,
        "worker_iterations": [line["iterations"] for line in done],
        "missing": missing,
        "duplicates": duplicates,
    }


def _worker_ref_factory(node: Node) -> Callable[[Any, str], Any]:
    return lambda ref, worker_id: node.register(f"bench-{worker_id}", ref)


def _drive_handle(
    node: Node, registry: CoordinatorServiceRegistry, workers: int, warmup: int, count: int
) -> float:
    """Send through a `WorkPullingProducer`; returns when the timed part started."""
    with WorkPullingProducer(
        "bench", KEY, registry=registry, worker_ref_factory=_worker_ref_factory(node)
    ) as producer:
        _wait(lambda: producer.worker_stats().number_of_workers == workers, "workers listed")
        for n in range(1, warmup + 1):
            producer.send(payload(n), timeout=WAIT)
        producer.wait_confirmed(timeout=WAIT)
        started = time.monotonic()
        for n in range(warmup + 1, warmup + count + 1):
            producer.send(payload(n), timeout=WAIT)
        producer.wait_confirmed(timeout=WAIT)
    return started


def _drive_actor(
    node: Node, registry: CoordinatorServiceRegistry, workers: int, warmup: int, count: int
) -> float:
    """Send through a `WorkPullingProducerController` fed by a producer actor; returns
    when the timed part started."""
    wppc = WorkPullingProducerController.start(
        "bench", KEY, registry=registry, worker_ref_factory=_worker_ref_factory(node)
    )
    proxy = wppc.proxy()
    _wait(lambda: proxy.worker_stats().get().number_of_workers == workers, "workers listed")
    producer = _Numbers.start(1, warmup)
    wppc.tell(WorkPullingProducerController.Start(producer))
    _wait(lambda: proxy.statistics().get().confirmed >= warmup, "warm-up confirmed", 0.002)
    started = time.monotonic()
    # A new producer takes over the outstanding RequestNext (Akka's "allow restart of
    # producer"): the timed messages.
    wppc.tell(WorkPullingProducerController.Start(_Numbers.start(warmup + 1, warmup + count)))
    total = warmup + count
    _wait(lambda: proxy.statistics().get().confirmed >= total, "every message confirmed")
    return started


def measure(
    counts: tuple[int, ...], count: int, repeat: int, routes: tuple[str, ...], **kwargs: Any
) -> dict[str, Any]:
    """Every (route, workers) configuration ``repeat`` times, interleaved; the best run
    of each, and the ratios to one worker."""
    best: dict[tuple[str, int], dict[str, Any]] = {}
    for attempt in range(1, repeat + 1):
        for route in routes:
            for workers in counts:
                # The actor route is an order of magnitude slower: fewer messages.
                n = count if route == "handle" else max(2_000, count // 8)
                result = run(workers, n, route=route, **kwargs)
                print(f"{route} {workers} worker(s), run {attempt}: {json.dumps(result)}")
                key = (route, workers)
                if key not in best or result["msgs_per_s"] > best[key]["msgs_per_s"]:
                    best[key] = result
    figures: dict[str, Any] = {}
    for (route, workers), result in best.items():
        prefix = "workpull" if route == "handle" else "workpull_actor"
        figures[f"{prefix}_{workers}_msgs_per_s"] = result["msgs_per_s"]
        figures[f"{prefix}_{workers}_producer_cpu_us_per_msg"] = result["producer_cpu_us_per_msg"]
        figures[f"{prefix}_{workers}_worker_cpu_us_per_msg"] = result["worker_cpu_us_per_msg"]
    for route in routes:
        prefix = "workpull" if route == "handle" else "workpull_actor"
        one = figures.get(f"{prefix}_1_msgs_per_s")
        for workers in counts:
            if one and workers > 1:
                figures[f"{prefix}_{workers}_vs_1"] = (
                    figures[f"{prefix}_{workers}_msgs_per_s"] / one
                )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=40_000, help="timed messages per run")
    parser.add_argument("--work-us", type=float, default=50.0, help="CPU µs per message")
    parser.add_argument("--window", type=int, default=500, help="the workers' window")
    parser.add_argument("--repeat", type=int, default=3, help="runs per configuration")
    parser.add_argument("--actor", action="store_true", help="also the actor route")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    count = 5_000 if args.quick else args.messages
    repeat = 1 if args.quick else args.repeat
    routes = ("handle", "actor") if args.actor else ("handle",)
    # grpc.aio calls back into the event loops of clients already closed, and asyncio
    # logs that at ERROR when they close: noise.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    # Calibrated once, here, so that every worker of every run does the same work.
    iterations = calibrate(args.work_us, rounds=50)
    print(f"work: {iterations} iterations of the loop for {args.work_us} µs of CPU")
    figures = measure(
        (1, 2, 4),
        count,
        repeat,
        routes,
        iterations=iterations,
        window=args.window,
        warmup=min(2_000, count),
    )
    for key, value in figures.items():
        print(f"{key:<40}{value:>14,.2f}" if "_vs_" in key else f"{key:<40}{value:>14,.0f}")
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
