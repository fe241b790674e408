"""Helpers for the multi-process tests (test_processes.py): services and a process wrapper.

Services, each a process with one `Node` on 127.0.0.1, printing JSON lines on stdout (a
``{"ready": true, ...}`` line once it is reachable, a summary line at the end)::

    python -m tests.transport.procs relay --producer HOST:PORT/orders --count N
    python -m tests.transport.procs consume --producer HOST:PORT/orders --file F --count N

* ``relay``: a `Consumer` (exposed as ``relay-in``) receiving from a producer process and a
  `Producer` (exposed as ``relay-out``) re-sending each message to a consumer process that
  registers with it. Each message is handed on before it is confirmed upstream, so the
  relay never confirms what it has not forwarded.
* ``consume``: a `Consumer` that appends each received number (the first 8 bytes of the
  payload, big-endian, as examples/remote_producer.py sends them) to ``--file``, one line
  per message with a single ``write(2)`` (O_APPEND, unbuffered: a SIGKILL cannot leave a
  partial line), *before* confirming it. ``receive`` times out after ``--receive-timeout``
  seconds; each `DeliveryTimeout` prints ``{"timeout": ...}`` and the service carries on,
  until ``--max-timeouts`` of them.

`Proc` (used by the tests) starts a service with ``PYTHONPATH`` at the repository root and
reads its stdout and stderr line by line on daemon threads, so no wait on a process's output
can block for longer than the timeout given.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from pykka_delivery import (
    Consumer,
    ConsumerControllerSettings,
    DeliveryTimeout,
    Producer,
)
from pykka_delivery.transport import Node, NodeSettings

ROOT = Path(__file__).resolve().parents[2]


# --- the process wrapper (test side) ---------------------------------------------------


class Proc:
    """A subprocess whose stdout JSON lines and stderr lines are collected by threads.

    Args:
        name: for messages.
        argv: the command line after the interpreter (a script path or ``-m module``).
    """

    def __init__(self, name: str, argv: Sequence[str]) -> None:
        self.name = name
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH", "")])])
        env["PYTHONUNBUFFERED"] = "1"
        self.popen = subprocess.Popen(
            [sys.executable, *argv],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._readers = [
            threading.Thread(target=self._read, args=(self.popen.stdout, True), daemon=True),
            threading.Thread(target=self._read, args=(self.popen.stderr, False), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream: IO[str], is_stdout: bool) -> None:
        for line in stream:
            if not is_stdout:
                self.stderr.append(line)
                continue
            self.stdout.append(line)
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict):
                    self.lines.put(parsed)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def expect(self, predicate: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """The next stdout JSON object satisfying ``predicate`` (earlier ones are skipped).

        Raises:
            AssertionError: none within ``timeout`` seconds (with the process's output).
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(
                    f"{self.name}: no such line within {timeout} s\n{self.output()}"
                )
            try:
                line = self.lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                if not self.alive() and self.lines.empty():
                    self._join_readers(1.0)  # the last lines may still be in flight
                    if self.lines.empty():
                        raise AssertionError(
                            f"{self.name} exited with {self.popen.returncode} before printing "
                            f"such a line\n{self.output()}"
                        ) from None
                continue
            if predicate(line):
                return line

    def ready(self, timeout: float = 30.0) -> str:
        """Wait for the ``ready`` line; returns the address it announces."""
        return str(self.expect(lambda line: bool(line.get("ready")), timeout)["address"])

    def wait(self, timeout: float) -> int:
        """The exit status, waiting at most ``timeout`` seconds for it.

        Raises:
            AssertionError: still running after ``timeout``.
        """
        try:
            code = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{self.name} still running after {timeout} s\n{self.output()}"
            ) from None
        self._join_readers(5.0)
        return code

    def kill(self, timeout: float = 10.0) -> None:
        """SIGKILL, then reap it (bounded)."""
        if self.alive():
            self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)
        self._join_readers(2.0)

    def _join_readers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))

    def output(self) -> str:
        return (
            f"--- {self.name} (pid {self.popen.pid}) stdout ---\n{''.join(self.stdout[-20:])}"
            f"--- stderr ---\n{''.join(self.stderr[-40:])}"
        )


# --- the services (subprocess side) ----------------------------------------------------


Spawn = Callable[..., Proc]
"""The ``spawn`` fixture (tests/conftest.py): ``spawn(name, *argv)`` starts a `Proc`."""


@contextlib.contextmanager
def spawner() -> Iterator[Spawn]:
    """``spawn(name, *argv)`` starts ``python *argv``; on leaving, every process is
    SIGKILLed and reaped (a no-op for those that exited), and its last output printed
    (pytest shows it when the test failed)."""
    started: list[Proc] = []

    def start(name: str, *argv: str) -> Proc:
        proc = Proc(name, argv)
        started.append(proc)
        return proc

    try:
        yield start
    finally:
        for proc in started:
            proc.kill(timeout=10)
        for proc in started:
            print(proc.output())


def left(deadline: float) -> float:
    """Seconds until ``deadline`` (a little at least, so a last check can run)."""
    return max(0.5, deadline - time.monotonic())


def wait_for(
    check: Callable[[], bool],
    what: str,
    procs: Sequence[Proc],
    deadline: float,
    poll: float = 0.05,
) -> None:
    """Poll ``check`` until it holds; fail at once naming a process of ``procs`` that
    exited, or ``what`` at ``deadline``."""
    while not check():
        for proc in procs:
            assert proc.alive(), f"{proc.name} exited early\n{proc.output()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(poll)


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _consumer_settings(window: int, resend_interval: float) -> ConsumerControllerSettings:
    return ConsumerControllerSettings(
        flow_control_window=window,
        resend_interval_min=resend_interval,
        resend_interval_max=max(resend_interval, 30.0),
    )


def relay(args: argparse.Namespace) -> None:
    with Node(NodeSettings(port=args.port)) as node:
        producer = Producer("relay", self_ref_factory=node.expose("relay-out"))
        consumer = Consumer(
            _consumer_settings(args.window, args.resend_interval),
            self_ref_factory=node.expose("relay-in"),
        )
        consumer.register_to(node.ref(args.producer))
        _emit(ready=True, address=f"{node.address}/relay-out", inbound=f"{node.address}/relay-in")
        forwarded = 0
        started = None
        while forwarded < args.count:
            delivery = consumer.receive(timeout=args.timeout)
            if started is None:
                started = time.perf_counter()
            producer.send(delivery.message, timeout=args.timeout)  # forwarded, then confirmed
            delivery.confirm()
            forwarded += 1
        consumer.close()  # its Ack lets the upstream producer finish
        producer.wait_confirmed(timeout=args.timeout)
        seconds = time.perf_counter() - (started or time.perf_counter())
        _emit(
            forwarded=forwarded,
            seconds=round(seconds, 3),
            msgs_per_s=round(forwarded / seconds) if seconds else None,
            resent=producer.statistics().resent,
        )
        producer.close()


def consume(args: argparse.Namespace) -> None:
    fd = os.open(args.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        with Node(NodeSettings(port=args.port)) as node:
            consumer = Consumer(
                _consumer_settings(args.window, args.resend_interval),
                self_ref_factory=node.expose(args.name),
            )
            consumer.register_to(node.ref(args.producer))
            _emit(ready=True, address=f"{node.address}/{args.name}")
            received = timeouts = 0
            first = last = None
            pause = 1 / args.throttle if args.throttle else 0.0
            started = time.perf_counter()
            while True:
                try:
                    delivery = consumer.receive(timeout=args.receive_timeout)
                except DeliveryTimeout as error:
                    timeouts += 1
                    _emit(timeout=type(error).__name__, received=received, last=last)
                    if timeouts >= args.max_timeouts:
                        break
                    continue
                number = int.from_bytes(delivery.message[:8], "big")
                os.write(fd, b"%d\n" % number)  # recorded before it is confirmed
                delivery.confirm()
                received += 1
                if first is None:
                    first = number
                last = number
                if pause:
                    time.sleep(pause)  # a steady flow: a kill lands anywhere in it
                if number >= args.count:
                    break
            seconds = time.perf_counter() - started
            consumer.close()
            _emit(
                received=received,
                first=first,
                last=last,
                timeouts=timeouts,
                seconds=round(seconds, 3),
                stats=dataclasses.asdict(consumer.statistics()),
            )
    finally:
        os.close(fd)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="services for tests/transport/test_processes.py")
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--producer", required=True, help="host:port/name to register to")
        sub.add_argument("--count", type=int, required=True, help="stop after this number")
        sub.add_argument("--port", type=int, default=0, help="this node's port (0: any free)")
        sub.add_argument("--window", type=int, default=500, help="flow-control window")
        sub.add_argument("--resend-interval", type=float, default=2.0)

    sub = commands.add_parser("relay", help="consumer from --producer, producer to the next")
    common(sub)
    sub.add_argument("--timeout", type=float, default=60.0, help="bound on every wait")
    sub.set_defaults(run=relay)

    sub = commands.add_parser("consume", help="append each received number to --file")
    common(sub)
    sub.add_argument("--file", required=True)
    sub.add_argument("--name", default="orders-consumer")
    sub.add_argument("--throttle", type=float, default=0.0, help="most messages/s (0: no limit)")
    sub.add_argument("--receive-timeout", type=float, default=30.0)
    sub.add_argument("--max-timeouts", type=int, default=1, help="stop after this many")
    sub.set_defaults(run=consume)

    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    main()
