"""A coordinator, a producer and consumers on separate hosts (tests/netns.py), for the
scenarios of tests/coordinator/test_netns_*.py.

The services are those of `tests.coordinator.procs`, each bound to its host's address and
started inside its host with ``ip netns exec``: the coordinator in host C, the producer in
host P, each consumer in a host of its own. The test process cannot reach the hosts'
addresses, so a ``watch`` process in host C prints the coordinator's listing for it. The
consumers write their files on the shared filesystem and the hosts share
CLOCK_MONOTONIC, so the test reads and compares them directly.
"""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tests.coordinator.procs import Log, sink_rows
from tests.netns import Host, Hosts
from tests.transport.procs import Proc

PROCS = ("-m", "tests.coordinator.procs")
COORDINATOR_PORT = 7100
PRODUCER_PORT = 7200
STREAM = "orders"
# The coordinator notices a silent connection within 0.5 + 0.5 s; a client within 1 + 0.5 s
# (the server's shortest ping interval is 1 s): both well inside the disconnected timeout.
SERVER_KEEPALIVE = ("--keepalive-time", "0.5", "--keepalive-timeout", "0.5")
CLIENT_KEEPALIVE = ("--keepalive-time", "1.0", "--keepalive-timeout", "0.5")

Listing = dict[str, list[dict[str, Any]]]  # stream -> its consumers, as `watch` prints them


class Cluster:
    """The services of one scenario on ``hosts``; every process dies with the hosts.

    Args:
        hosts: with hosts ``C`` (coordinator) and ``P`` (producer).
        tmp_path: where the consumers' files go.
        deadline: monotonic time by which the whole scenario must be done.
        streams: the producer's streams (one producer each); every consumer process
            consumes each in a group of its own (with ``partitioned``: partition n).
    """

    def __init__(
        self, hosts: Hosts, tmp_path: Path, deadline: float, streams: Sequence[str] = (STREAM,)
    ) -> None:
        self.hosts = hosts
        self.tmp_path = tmp_path
        self.deadline = deadline
        self.streams = tuple(streams)
        self.procs: dict[str, Proc] = {}
        self.consumers: list[str] = []
        self.killed: set[str] = set()
        self.coordinator = f"{hosts['C'].address}:{COORDINATOR_PORT}"
        self.producer = f"{hosts['P'].address}:{PRODUCER_PORT}"
        self._watch: Proc | None = None
        self._listing: Listing = {}

    def left(self) -> float:
        """Seconds until the deadline (a little at least, so a last check can run)."""
        return max(0.5, self.deadline - time.monotonic())

    def start(
        self, disconnected_timeout: float, *, fast_keepalive: bool = True, advertise: str = ""
    ) -> None:
        """The coordinator (in C), the producer (in P, sending until SIGTERM), the watch.
        ``advertise``: the address the producer's refs carry (a proxy's), if not its own."""
        c, p = self.hosts["C"], self.hosts["P"]
        keepalive = SERVER_KEEPALIVE if fast_keepalive else ()
        coordinator = c.proc(
            "coordinator", *PROCS, "coordinator", "--host", c.address,
            "--port", str(COORDINATOR_PORT),
            "--disconnected-timeout", str(disconnected_timeout), *keepalive,
            # The scenarios place partitions by RabbitMQ's rule (the i-th joined modulo n).
            "--partition-assignment", "modulo",
        )  # fmt: skip
        self.procs["coordinator"] = coordinator
        coordinator.ready()
        streams = [arg for stream in self.streams for arg in ("--stream", stream)]
        producer = p.proc(
            "producer", *PROCS, "produce", "--host", p.address, "--port", str(PRODUCER_PORT),
            *streams, "--count", "0", "--advertise", advertise,
        )  # fmt: skip
        self.procs["producer"] = producer
        producer.ready()
        self._watch = c.proc("watch", *PROCS, "watch", "--coordinator", self.coordinator)
        self._watch.ready()
        self.producer = advertise or self.producer

    def consumer(
        self,
        name: str,
        host: Host,
        *,
        partitioned: bool = False,
        throttle: int = 500,
        fast_keepalive: bool = True,
    ) -> dict[str, Any]:
        """Start consumer process ``name`` in ``host`` (its files ``<name>-<stream>.txt``,
        committing to the shared sink of each stream); returns its ready line."""
        self.consumers.append(name)
        keepalive = CLIENT_KEEPALIVE if fast_keepalive else ()
        producers = [arg for s in self.streams for arg in ("--producer", f"{self.producer}/{s}")]
        options = ("--partitioned",) if partitioned else ()
        proc = host.proc(
            name, *PROCS, "consume", "--host", host.address,
            "--coordinator", self.coordinator, *producers, *options,
            "--file", str(self.tmp_path / f"{name}-{{stream}}.txt"), "--name", name,
            "--sink", str(self.tmp_path / "sink-{stream}.sqlite"),
            "--throttle", str(throttle), *keepalive,
        )  # fmt: skip
        self.procs[name] = proc
        return proc.expect(lambda line: bool(line.get("ready")), self.left())

    def log(self, name: str, stream: str = STREAM) -> Log:
        """What consumer process ``name`` recorded for ``stream``."""
        return Log(self.tmp_path / f"{name}-{stream}.txt")

    def check_sink(self, stream: str, last: int) -> None:
        """Each of 1..``last`` committed exactly once to the stream's sink (so never under
        two epochs), and the epochs rise with the numbers: a fenced activation committed
        nothing after its successor began."""
        rows = sink_rows(self.tmp_path / f"sink-{stream}.sqlite")
        numbers = [number for number, _, _ in rows]
        twice = sorted(n for n, times in collections.Counter(numbers).items() if times > 1)
        assert not twice, f"{stream}: committed more than once: {twice[:10]}"
        assert numbers == list(range(1, last + 1)), f"{stream}: not each of 1..{last} committed"
        epochs = [epoch for _, epoch, _ in rows]
        assert epochs == sorted(epochs), f"{stream}: an older epoch committed after a newer one"

    def wait_for(self, check: Callable[[], bool], what: str) -> None:
        """Poll ``check`` until it holds; fail at the deadline or if a process died."""
        while not check():
            for name, proc in self.procs.items():
                alive = proc.alive() or name in self.killed
                assert alive, f"{proc.name} exited early\n{proc.output()}"
            if time.monotonic() >= self.deadline:
                outputs = "\n".join(proc.output() for proc in self.procs.values())
                raise AssertionError(f"timed out waiting for {what}: {self.describe()}\n{outputs}")
            time.sleep(0.01)

    def kill(self, name: str) -> float:
        """SIGKILL process ``name`` and reap it; returns the monotonic time just before."""
        self.killed.add(name)
        killed_at = time.monotonic()
        self.procs[name].kill()
        return killed_at

    def listing(self) -> Listing:
        """The latest listing the watch printed (it prints one every 0.1 s)."""
        assert self._watch is not None
        while not self._watch.lines.empty():
            line = self._watch.lines.get_nowait()
            if "groups" in line:
                self._listing = line["groups"]
        return self._listing

    def settled_active(self, stream: str = STREAM) -> str | None:
        """The owner of the stream's one active consumer when every consumer is connected
        and all but it wait; None otherwise (nobody active, two, or one disconnected)."""
        consumers = self.listing().get(stream, [])
        active = [c["owner"] for c in consumers if c["activity"] == "ACTIVE"]
        waiting = [c for c in consumers if c["activity"] == "WAITING"]
        connected = all(c["connected"] for c in consumers)
        settled = len(active) == 1 and len(waiting) == len(consumers) - 1 and connected
        return active[0] if settled else None

    def stop_producer(self) -> dict[str, int]:
        """SIGTERM the producer; per stream the last number it sent, once all are
        confirmed."""
        producer = self.procs["producer"]
        producer.popen.terminate()
        sent = producer.expect(lambda line: "sent" in line, self.left())["sent"]
        return {stream: int(last) for stream, last in sent.items()}

    def stop_consumers(self) -> None:
        """SIGTERM the consumer processes still running: each closes its consumers
        (writing its activations) and exits."""
        running = [name for name in self.consumers if self.procs[name].alive()]
        for name in running:
            self.procs[name].popen.terminate()
        for name in running:
            proc = self.procs[name]
            proc.expect(lambda line: bool(line.get("done")), self.left())
            assert proc.wait(10) == 0, proc.output()

    def describe(self) -> str:
        """The listing and what each consumer processed, for failure messages."""
        ranges: dict[str, Any] = {}
        for name in self.consumers:
            for stream in self.streams:
                numbers = self.log(name, stream).processed()
                if numbers:
                    ranges[f"{name}/{stream}"] = (numbers[0], numbers[-1], len(numbers))
        return json.dumps({"listing": self.listing(), "processed": ranges})
