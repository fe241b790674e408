"""Running the installed ``pykka-delivery`` console script in subprocesses.

`run` runs one command and returns its completed process; `Served` is a ``coordinator
serve`` process, stopped with SIGTERM when the test (or module) ends, failing or not. The
environment of every command is this process's without its ``PYKKA_DELIVERY_*``
variables, so a developer's settings do not leak in.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import pytest

WAIT = 30.0  # the most a command or a wait may take

COMMAND = shutil.which("pykka-delivery", path=str(Path(sys.executable).parent))


def environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYKKA_DELIVERY_")}
    env.update({"NO_COLOR": "1", "COLUMNS": "250", "TERM": "dumb"})
    env.update(extra or {})
    return env


def command() -> str:
    if COMMAND is None:
        pytest.fail(
            "the console script pykka-delivery is not installed next to this Python: "
            "run .venv/bin/pip install -e . --no-deps"
        )
    return COMMAND


def run(
    *args: str, env: Mapping[str, str] | None = None, input: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``pykka-delivery *args``, waited for (at most `WAIT` seconds)."""
    return subprocess.run(
        [command(), *args],
        capture_output=True,
        text=True,
        input=input,
        env=environment(env),
        timeout=WAIT,
        check=False,
    )


def run_json(*args: str, env: Mapping[str, str] | None = None) -> Any:
    """``pykka-delivery *args --json``'s output, parsed; the command must succeed."""
    done = run(*args, "--json", env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def free_port() -> int:
    """A port nothing listens on (it was free a moment ago)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Served:
    """A ``pykka-delivery coordinator serve --port 0 --json`` process and its address."""

    def __init__(self, *args: str, log: IO[str]) -> None:
        self.process = subprocess.Popen(
            [command(), "coordinator", "serve", "--port", "0", "--json", *args],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=environment(),
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # ends with the process if it fails to start
        assert line, f"coordinator serve ended with {self.process.wait(WAIT)} before listening"
        announced = json.loads(line)
        self.address: str = announced["listening"]
        self.metrics_url: str | None = announced["metrics"]

    def stop(self, signum: int = signal.SIGTERM) -> int:
        """Signal it, wait for it to end, and return its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signum)
        try:
            return self.process.wait(WAIT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
        finally:
            if self.process.stdout is not None:
                self.process.stdout.close()


@contextlib.contextmanager
def served(tmp: Path, *args: str) -> Iterator[Served]:
    """A `Served` coordinator, stopped at the end even on failure; its log in ``tmp``."""
    with (tmp / "coordinator.log").open("w") as log:
        server = Served(*args, log=log)
        try:
            yield server
        finally:
            with contextlib.suppress(Exception):
                server.stop()
            if server.process.poll() is None:
                server.process.kill()
                server.process.wait(WAIT)


def assert_one_clear_line(done: subprocess.CompletedProcess[str], *words: str) -> None:
    """The command failed with status 1 and one ``Error:`` line holding ``words``, no
    traceback."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("Error: ")
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], lines[0]
