"""The pipeline demo's child processes: producer and consumer services whose stdout lines
report their state."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
WAIT = 120.0  # bound on every wait for a service


class Service:
    """A child process whose stdout lines report its state (READY, SENT n, APPLIED n, DONE)."""

    def __init__(self, name: str, script: str, *args: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / script), *args],
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.address = ""
        self.count = 0
        self.ready = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            word, _, rest = line.strip().partition(" ")
            if word == "READY":
                self.address = rest
                self.ready.set()
            elif word in ("SENT", "APPLIED"):
                self.count = int(rest)
            elif word == "DONE":
                self.done.set()

    def wait_ready(self) -> None:
        if not self.ready.wait(WAIT):
            raise RuntimeError(f"{self.name} did not start within {WAIT} s")

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(WAIT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(WAIT)


def stop_services(services: list[Service]) -> None:
    """SIGTERM to every service still running, then wait for each (SIGKILL after 15 s)."""
    for service in services:
        if service.proc.poll() is None:
            service.proc.terminate()
    for service in services:
        service.stop()
