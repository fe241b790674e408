"""Services for the coordinator's multi-process tests (test_service_processes.py).

Each is a process on 127.0.0.1 printing JSON lines on stdout (a ``{"ready": true, ...}``
line once it is reachable)::

    python -m tests.coordinator.procs coordinator --disconnected-timeout 1.0
    python -m tests.coordinator.procs consume --coordinator HOST:PORT \\
        --producer HOST:PORT/orders --file F --count N

* ``coordinator``: a `CoordinatorActor` behind a `CoordinatorServer` (port 0; the ready
  line gives the address). It runs until it is killed.
* ``consume``: a transport `Node` and a `CoordinatedConsumer` in the simple group
  ``test/orders/billing``, consuming the producer's numbers (the first 8 bytes of each
  payload, big-endian, as examples/remote_producer.py sends them). To ``--file`` it
  appends, each with a single ``write(2)`` (O_APPEND: a SIGKILL cannot leave a partial
  line), ``start <monotonic seconds>`` when an activation begins, then each number
  *before* confirming it, and ``end <monotonic seconds>`` per activation when it exits.
  It exits after processing number ``--count`` (or when killed).

The processes share the host's monotonic clock (CLOCK_MONOTONIC), so the test compares
their activation times with its own.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from pykka_delivery import ConsumerControllerSettings
from pykka_delivery.coordinator import (
    CoordinatedConsumer,
    CoordinatorActor,
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServer,
    CoordinatorServerSettings,
    CoordinatorSettings,
)
from pykka_delivery.transport import Node

GROUP = ("test", "orders", "billing")


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def coordinator(args: argparse.Namespace) -> None:
    timeout = args.disconnected_timeout
    settings = CoordinatorSettings(disconnected_timeout=timeout, recovery_min_delay=timeout)
    actor = CoordinatorActor.start(settings=settings)
    with CoordinatorServer(actor, CoordinatorServerSettings(port=args.port)) as server:
        _emit(ready=True, address=server.address)
        threading.Event().wait()  # until killed


def consume(args: argparse.Namespace) -> None:
    fd = os.open(args.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    client_settings = CoordinatorClientSettings(
        reconnect_backoff_min=0.05, reconnect_backoff_max=0.5, request_timeout=10.0
    )
    consumer_settings = ConsumerControllerSettings(
        flow_control_window=args.window, resend_interval_min=0.2, resend_interval_max=2.0
    )
    with Node() as node:
        client = CoordinatorClient(
            args.coordinator, node=node.address, owner=args.name, settings=client_settings
        )
        consumer = CoordinatedConsumer(
            client, *GROUP, node.ref(args.producer), settings=consumer_settings, node=node
        )
        _emit(ready=True, active=consumer.registered.active, connection=client.connection_id)
        pause = 1 / args.throttle if args.throttle else 0.0
        started = 0
        for delivery in consumer:
            intervals = consumer.intervals()
            if len(intervals) > started:
                started = len(intervals)
                os.write(fd, b"start %r\n" % intervals[-1].start)
            number = int.from_bytes(delivery.message[:8], "big")
            os.write(fd, b"%d\n" % number)  # recorded before it is confirmed
            delivery.confirm()
            if pause:
                time.sleep(pause)  # a steady flow: a kill lands anywhere in it
            if number >= args.count:
                break
        consumer.close()
        for interval in consumer.intervals():
            os.write(fd, b"end %r\n" % interval.end)
        client.close()
        _emit(done=True, confirmed=consumer.confirmed)
    os.close(fd)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="services for tests/coordinator")
    commands = parser.add_subparsers(dest="command", required=True)

    sub = commands.add_parser("coordinator", help="a coordinator actor behind its server")
    sub.add_argument("--port", type=int, default=0)
    sub.add_argument("--disconnected-timeout", type=float, default=1.0)
    sub.set_defaults(run=coordinator)

    sub = commands.add_parser("consume", help="a coordinated consumer writing to --file")
    sub.add_argument("--coordinator", required=True, help="host:port of the coordinator")
    sub.add_argument("--producer", required=True, help="host:port/name of the producer")
    sub.add_argument("--file", required=True)
    sub.add_argument("--count", type=int, required=True, help="exit after this number")
    sub.add_argument("--name", default="consumer")
    sub.add_argument("--window", type=int, default=100, help="flow-control window")
    sub.add_argument("--throttle", type=float, default=0.0, help="most messages/s (0: no limit)")
    sub.set_defaults(run=consume)

    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
