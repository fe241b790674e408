"""The worker service of the work-pulling process tests (test_workpull_processes.py) and
of bench/workpull.py, and the helpers that read what workers wrote.

A worker is a process on 127.0.0.1 with one transport `Node`, one `CoordinatorClient` and
a `CoordinatorServiceRegistry` on it, registered under a service key in the coordinator's
directory, printing JSON lines on stdout (a ``{"ready": true, ...}`` line once it is up, a
``{"done": true, ...}`` line when it stops)::

    python -m tests.delivery.durable.workpull_procs worker --coordinator HOST:PORT --key jobs \\
        --file F --name worker-1 [--work-us 50 | --iterations N] [--window 50] \\
        [--route actor|handle]

For each message (the first 8 bytes of its payload: the message's number, big-endian) it
spends about ``--work-us`` µs of CPU in a busy loop calibrated when it starts, or
``--iterations`` rounds of it (a fixed number of rounds, so that a worker preempted by
another process does not count the wait as work), then appends the number to ``--file``
with a single ``write(2)`` (O_APPEND, unbuffered: a SIGKILL cannot leave a partial line),
and only then confirms it. The file therefore holds every message the worker processed,
confirmed or not.

Two ways to be a worker, ``--route``:

* ``actor``: a `ConsumerController` started with ``service_key`` (it registers itself)
  and a pykka actor doing the work: two thread hops per message (delivery, confirmation).
* ``handle``: a `Consumer` handle registered under the key (``service_key=``), the work
  done in the main thread: no thread hop per message.

On SIGTERM the worker stops (its last `Ack` goes out, then it deregisters), says goodbye
to the coordinator and prints its summary. On SIGKILL it just vanishes: the coordinator
drops its entry after its ``disconnected_timeout``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pykka

from pykka_delivery import Consumer, ConsumerController, ConsumerControllerSettings, Delivery
from pykka_delivery.coordinator import CoordinatorClient, CoordinatorClientSettings
from pykka_delivery.coordinator.service_registry import CoordinatorServiceRegistry
from pykka_delivery.errors import DeliveryTimeout
from pykka_delivery.transport import Node

PAYLOAD_PAD = bytes(92)  # 8 bytes of number + 92: the 100-byte payloads of the other tests


def payload(number: int) -> bytes:
    """The message for ``number``, as workers read it back."""
    return number.to_bytes(8, "big") + PAYLOAD_PAD


# --- the test side ---------------------------------------------------------------------


def numbers_in(path: Path) -> list[int]:
    """The numbers a worker wrote, in the order it processed them."""
    return [int(line) for line in path.read_bytes().splitlines()] if path.exists() else []


# --- simulated work --------------------------------------------------------------------


def spend(iterations: int) -> int:
    """Burn CPU: ``iterations`` rounds of small-integer arithmetic, each costing the same
    (the result defeats any temptation to optimize the loop away)."""
    x = 0
    for _ in range(iterations):
        x = (x * 31 + 7) & 0xFFFF
    return x


def calibrate(work_us: float, rounds: int = 9) -> int:
    """The number of `spend` iterations taking ``work_us`` µs of CPU on this machine: from
    the fastest of ``rounds`` timings of 5 ms or so, in CPU time of this thread, so that a
    round slowed down by the other processes of a busy machine does not count."""
    if work_us <= 0:
        return 0
    probe = 100_000
    best = min(_cpu_seconds(probe) for _ in range(rounds))
    return max(1, round(probe * work_us / 1e6 / best))


def _cpu_seconds(iterations: int) -> float:
    start = time.thread_time()
    spend(iterations)
    return max(time.thread_time() - start, 1e-9)


# --- the worker service ----------------------------------------------------------------


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


class _Work:
    """What a worker does per message, whichever route brings it: work, record, count."""

    def __init__(self, path: str, iterations: int) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.iterations = iterations
        self.processed = 0
        self.last_at = 0.0  # CLOCK_MONOTONIC, shared by the processes of a host

    def process(self, delivery: Delivery) -> None:
        spend(self.iterations)
        number = int.from_bytes(delivery.message[:8], "big")
        os.write(self.fd, b"%d\n" % number)  # recorded before it is confirmed
        delivery.confirm()
        self.processed += 1
        self.last_at = time.monotonic()

    def close(self) -> None:
        os.close(self.fd)


class _WorkerActor(pykka.ThreadingActor):
    use_daemon_thread = True

    def __init__(self, work: _Work) -> None:
        super().__init__()
        self.work = work

    def on_receive(self, message: Any) -> None:
        if type(message) is Delivery:
            self.work.process(message)


class _Stop:
    """Set by SIGTERM. A plain flag: a handler that took a lock (``Event.set``) could
    deadlock with the main thread interrupted while holding that same lock."""

    requested = False

    @classmethod
    def on_signal(cls, *_: object) -> None:
        cls.requested = True


def _run_actor(
    args: argparse.Namespace, node: Node, registry: CoordinatorServiceRegistry, work: _Work
) -> None:
    worker = _WorkerActor.start(work)
    cc = ConsumerController.start(
        _settings(args),
        service_key=args.key,
        registry=registry,
        self_ref_factory=node.expose(args.name),
    )
    cc.tell(ConsumerController.Start(worker))
    _emit(ready=True, address=f"{node.address}/{args.name}", iterations=work.iterations)
    while not _Stop.requested:
        time.sleep(0.05)
    cc.stop(timeout=10)  # the last Ack, then the deregistration
    worker.stop(timeout=10)


def _run_handle(
    args: argparse.Namespace, node: Node, registry: CoordinatorServiceRegistry, work: _Work
) -> None:
    consumer = Consumer(
        _settings(args),
        self_ref_factory=node.expose(args.name),
        service_key=args.key,
        registry=registry,
    )
    _emit(ready=True, address=f"{node.address}/{args.name}", iterations=work.iterations)
    while not _Stop.requested:
        try:
            delivery = consumer.receive(timeout=0.1)
        except DeliveryTimeout:
            continue
        work.process(delivery)
    consumer.close()  # the last Ack, then the deregistration


def _settings(args: argparse.Namespace) -> ConsumerControllerSettings:
    return ConsumerControllerSettings(
        flow_control_window=args.window, resend_interval_min=0.2, resend_interval_max=2.0
    )


def worker(args: argparse.Namespace) -> None:
    signal.signal(signal.SIGTERM, _Stop.on_signal)
    faulthandler.register(signal.SIGUSR1)  # every thread's stack on stderr, for a hang
    client_settings = CoordinatorClientSettings(
        reconnect_backoff_min=0.05, reconnect_backoff_max=0.5, request_timeout=10.0
    )
    work = _Work(args.file, args.iterations if args.iterations else calibrate(args.work_us))
    try:
        with Node() as node:
            client = CoordinatorClient(
                args.coordinator, node=node.address, owner=args.name, settings=client_settings
            )
            registry = CoordinatorServiceRegistry(client, node.ref)
            cpu = time.process_time()
            run = _run_actor if args.route == "actor" else _run_handle
            run(args, node, registry, work)
            cpu = time.process_time() - cpu
            client.close()
            stats = node.statistics()
    finally:
        work.close()
    _emit(
        done=True,
        processed=work.processed,
        last_at=work.last_at,
        iterations=work.iterations,
        cpu_seconds=round(cpu, 3),
        frames_received=stats.frames_received,
        frames_sent=stats.frames_sent,
        envelopes_sent=stats.envelopes_sent,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the worker of the work-pulling tests")
    commands = parser.add_subparsers(dest="command", required=True)
    sub = commands.add_parser("worker", help="a worker registered in the coordinator")
    sub.add_argument("--coordinator", required=True, help="host:port of the coordinator")
    sub.add_argument("--key", required=True, help="the service key to register under")
    sub.add_argument("--file", required=True, help="where each processed number is appended")
    sub.add_argument("--name", default="worker", help="the name exposed on the node")
    sub.add_argument("--work-us", type=float, default=50.0, help="CPU µs per message")
    sub.add_argument("--iterations", type=int, default=0, help="of the work loop (0: calibrate)")
    sub.add_argument("--window", type=int, default=50, help="flow-control window")
    sub.add_argument("--route", choices=("actor", "handle"), default="actor")
    sub.set_defaults(run=worker)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
