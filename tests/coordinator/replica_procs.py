"""A coordinator replica as a process, for the multi-process tests of several coordinators
on one PostgreSQL (test_replica_processes.py)::

    python -m tests.coordinator.replica_procs --url postgresql://... --port P --ttl 1.5

It runs a `CoordinatorReplica` on 127.0.0.1:``--port`` and prints JSON lines on stdout:
``{"ready": true, "address": ...}`` once its server listens, then ``{"leading": bool,
"at": <CLOCK_MONOTONIC seconds>, "epoch": n}`` at every change of role. On SIGCONT (a
resume after SIGSTOP) it tries one append with the lease it led under, as a request that
passed the leadership check just before the pause would, and prints ``{"append_after_resume":
"<the exception's class name, or 'stored'>"}``. It runs until killed (SIGTERM: it closes,
releasing the lease, and exits).
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
import time
from collections.abc import Sequence
from typing import Any

from pykka_delivery.coordinator import CoordinatorServerSettings, CoordinatorSettings
from pykka_delivery.coordinator.commands import CreateStream
from pykka_delivery.coordinator.replica import CoordinatorReplica, ReplicaSettings
from pykka_delivery.coordinator.store_postgres import PostgresCommandLog


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def _report_roles(replica: CoordinatorReplica, stop: threading.Event) -> None:
    leading = False
    with replica.role_changed:
        while not stop.is_set():
            replica.role_changed.wait(0.05)
            if replica.leading != leading:
                leading = replica.leading
                _emit(leading=leading, at=time.monotonic(), epoch=replica.epoch)


def _append_with_own_lease(replica: CoordinatorReplica, url: str, name: str) -> None:
    try:
        log = PostgresCommandLog(url, name=name, lease=replica.lease)
        try:
            log.append(CreateStream("resumed", "after-sigstop", 1))
        finally:
            log.close()
    except Exception as error:  # what the test wants to see
        _emit(append_after_resume=type(error).__name__, message=str(error))
        return
    _emit(append_after_resume="stored")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a coordinator replica for tests")
    parser.add_argument("--url", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttl", type=float, default=1.5)
    parser.add_argument("--acquire-interval", type=float, default=0.2)
    parser.add_argument("--disconnected-timeout", type=float, default=2.0)
    args = parser.parse_args(argv)

    timeout = args.disconnected_timeout
    settings = CoordinatorSettings(disconnected_timeout=timeout, recovery_min_delay=timeout)
    replica = CoordinatorReplica(
        args.url,
        settings=settings,
        server_settings=CoordinatorServerSettings(port=args.port),
        replica_settings=ReplicaSettings(ttl=args.ttl, acquire_interval=args.acquire_interval),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    resumed = threading.Event()
    signal.signal(signal.SIGCONT, lambda *_: resumed.set())
    with replica:
        reporter = threading.Thread(target=_report_roles, args=(replica, stop), daemon=True)
        reporter.start()
        _emit(ready=True, address=replica.address)
        while not stop.wait(0.05):
            if resumed.is_set():
                resumed.clear()
                _append_with_own_lease(replica, args.url, replica.replica_settings.name)
        stop.set()


if __name__ == "__main__":
    main()
