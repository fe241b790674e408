"""Leader fail-over of coordinator replicas on one PostgreSQL, for bench/coordinator.py
(``leader_failover_ms_p50`` / ``_max``).

Three `CoordinatorReplica` child processes (``python bench/_leader_failover.py --child
PORT URL TTL INTERVAL``, each printing ``{"ready": ...}`` then ``{"leading": true, "at":
...}`` when it leads) share a throwaway PostgreSQL database. This process holds a
`CoordinatorClient` given the three addresses, with a consumer registered. Each round
SIGKILLs the leader and times, from right before ``os.kill`` (CLOCK_MONOTONIC), until
the client's ``list_groups`` is answered (only a leader answers it), then starts the
killed replica again on its port, as a follower. A fail-over costs the lease's ttl at
most (the dead leader's lease runs out), plus up to one acquire interval, the new
leader's start (it loads the log and re-evaluates every group), and the client's next
attempt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pykka_delivery.coordinator import (  # noqa: E402
    CoordinatorClient,
    CoordinatorClientSettings,
    CoordinatorServerSettings,
    GroupId,
)
from pykka_delivery.errors import DeliveryError  # noqa: E402

TTL = 2.0
ACQUIRE_INTERVAL = 0.2
WAIT = 60.0  # bound on every wait


def child(port: int, url: str, ttl: float, acquire_interval: float) -> None:
    """A replica until killed; prints when it leads."""
    from pykka_delivery.coordinator.replica import (  # noqa: PLC0415 (the postgres extra)
        CoordinatorReplica,
        ReplicaSettings,
    )

    replica = CoordinatorReplica(
        url,
        server_settings=CoordinatorServerSettings(port=port),
        replica_settings=ReplicaSettings(ttl=ttl, acquire_interval=acquire_interval),
    )
    with replica:
        print(json.dumps({"ready": True, "address": replica.address}), flush=True)
        assert replica.wait_leading(3600.0)
        print(json.dumps({"leading": True, "at": time.monotonic()}), flush=True)
        threading.Event().wait()  # until killed


class _Replica:
    def __init__(self, port: int, url: str, log_dir: Path) -> None:
        self.port = port
        self.address = f"127.0.0.1:{port}"
        self.stderr = open(log_dir / f"replica-{port}.stderr", "a")  # noqa: SIM115
        self.popen = subprocess.Popen(
            [sys.executable, __file__, "--child", str(port), url, str(TTL), str(ACQUIRE_INTERVAL)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"},
            cwd=ROOT,
        )
        self.leading = threading.Event()
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            fields: dict[str, Any] = json.loads(line) if line.startswith("{") else {}
            if fields.get("ready"):
                self.ready.set()
            if fields.get("leading"):
                self.leading.set()

    def kill(self) -> None:
        if self.popen.poll() is None:
            os.kill(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)
        self.stderr.close()


def _free_ports(count: int) -> list[int]:
    from tests.coordinator.procs import free_port  # noqa: PLC0415

    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def _answered(client: CoordinatorClient, deadline: float) -> float:
    """When ``client``'s ``list_groups`` is first answered (CLOCK_MONOTONIC)."""
    while True:
        try:
            client.list_groups(timeout=2.0)
        except DeliveryError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)
            continue
        return time.monotonic()


def _leader(replicas: list[_Replica]) -> _Replica:
    deadline = time.monotonic() + WAIT
    while True:
        leader = next((r for r in replicas if r.leading.is_set()), None)
        if leader is not None:
            return leader
        if time.monotonic() > deadline:
            msg = "no replica leads"
            raise RuntimeError(msg)
        time.sleep(0.01)


def run(rounds: int, url: str, log_dir: Path) -> list[float]:
    """Fail-over times (ms) of ``rounds`` leader kills among three replicas on ``url``."""
    replicas = [_Replica(port, url, log_dir) for port in _free_ports(3)]
    settings = CoordinatorClientSettings(
        reconnect_backoff_min=0.02, reconnect_backoff_max=0.2, connect_timeout=1.0
    )
    client: CoordinatorClient | None = None
    try:
        for replica in replicas:
            if not replica.ready.wait(WAIT):
                msg = f"replica on port {replica.port} did not start (see {log_dir})"
                raise RuntimeError(msg)
        client = CoordinatorClient([r.address for r in replicas], settings=settings)
        client.register(GroupId("bench", "orders", "billing"), 1, lambda _: None, timeout=WAIT)
        times = []
        for _ in range(rounds):
            leader = _leader(replicas)
            killed_at = time.monotonic()
            leader.kill()
            answered_at = _answered(client, killed_at + WAIT)
            times.append((answered_at - killed_at) * 1000)
            print(f"  round {len(times)}: leader fail-over {times[-1]:7.1f} ms")
            replicas[replicas.index(leader)] = again = _Replica(leader.port, url, log_dir)
            again.ready.wait(WAIT)
        return times
    finally:
        if client is not None:
            client.close()
        for replica in replicas:
            replica.kill()


if __name__ == "__main__" and sys.argv[1:2] == ["--child"]:
    port, url, ttl, interval = sys.argv[2:6]
    child(int(port), url, float(ttl), float(interval))
