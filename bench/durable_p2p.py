"""Durable versus in-memory point-to-point throughput between two processes, same run.

The producer runs in this process, the consumer in a child process (bench/p2p_grpc.py's
``child_handle``: a `Consumer` handle that confirms each delivery), each on its own
`Node`; window 500, one-by-one confirmation, 100-byte payloads. Measured in the same run:

* ``memory``: `Producer.send` without a durable queue (the reference);
* ``durable``: a `SqliteDurableQueue` with the default fsync policy (``"normal"``), sent
  with `Producer.send_many` (one store, one commit, per batch the window allows);
* ``durable_off`` and ``durable_full``: the same with ``synchronous="off"`` and ``"full"``;
* ``postgres``: a `PostgresDurableQueue` (default settings: ``synchronous_commit`` on) on
  a throwaway PostgreSQL server started for the run as the tests start theirs
  (tests/postgres.py: a unix socket, ``fsync`` off, so like SQLite's ``"normal"`` a commit
  is written to the WAL but not flushed), a fresh database per run, `Producer.send_many`;
* ``durable_send_one``: ``"normal"`` with plain `Producer.send` (a commit per message),
  for reference; it runs a tenth of the messages.

Each figure is messages per second as the consumer sees them (from its first delivery to
its last), the median of ``--runs`` runs made in turn (see `run`);
``durable_vs_memory`` and ``postgres_vs_memory`` are ratios of the medians. The SQLite
files and the PostgreSQL server are in temporary directories, removed at the end. The
last line printed is one JSON object with the figures.

Usage: python bench/durable_p2p.py [--messages N] [--runs R] [--quick] [--only K ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.p2p_grpc import PAYLOAD, child_handle  # noqa: E402
from pykka_delivery import Producer, SqliteDurableQueue  # noqa: E402
from pykka_delivery.delivery.stores.durable_postgres import PostgresDurableQueue  # noqa: E402
from pykka_delivery.delivery.stores.durable_queue import DurableProducerQueue  # noqa: E402
from pykka_delivery.delivery.stores.durable_sqlite import SqliteQueueSettings  # noqa: E402
from pykka_delivery.transport import Node  # noqa: E402
from tests.postgres import PostgresServer, running_server  # noqa: E402

WINDOW = 500
BATCH = 1_000  # messages per send_many call; each call stores what the window allows
TIMEOUT = 600.0  # seconds: bound on every wait of a run
SEND_ONE_SHARE = 10  # durable_send_one runs count // SEND_ONE_SHARE messages


def spawn_consumer(producer_path: str, count: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, __file__, "--child", producer_path, str(count), str(WINDOW)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)


def consumer_result(child: subprocess.Popen[str]) -> dict[str, Any]:
    try:
        out, _ = child.communicate(timeout=TIMEOUT)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    if child.returncode != 0:
        msg = f"the consumer process exited with {child.returncode}"
        raise RuntimeError(msg)
    return dict(json.loads(out.strip().splitlines()[-1]))


def batches(count: int) -> Iterator[list[bytes]]:
    for start in range(0, count, BATCH):
        yield [PAYLOAD] * min(BATCH, count - start)


def run_one(count: int, open_queue: Callable[[], DurableProducerQueue] | None, many: bool) -> float:
    """msgs/s of one run: a producer (durable on ``open_queue()`` when given) sending
    ``count`` messages to a fresh consumer process."""
    queue = None if open_queue is None else open_queue()
    try:
        with Node() as node:
            producer = Producer("bench", durable_queue=queue, self_ref_factory=node.expose("bench"))
            child = spawn_consumer(f"{node.address}/bench", count)
            try:
                if many:
                    for batch in batches(count):
                        producer.send_many(batch, timeout=TIMEOUT)
                else:
                    for _ in range(count):
                        producer.send(PAYLOAD, timeout=TIMEOUT)
                result = consumer_result(child)
                producer.wait_confirmed(timeout=TIMEOUT)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
            producer.close()
    finally:
        if queue is not None:
            queue.close()
    return float(result["msgs_per_s"])


VARIANTS: dict[str, dict[str, Any]] = {
    "memory_msgs_per_s": {"many": False},
    "durable_msgs_per_s": {"db": "normal.db", "many": True},
    "durable_off_msgs_per_s": {"db": "off.db", "synchronous": "off", "many": True},
    "durable_full_msgs_per_s": {"db": "full.db", "synchronous": "full", "many": True},
    "durable_send_one_msgs_per_s": {"db": "one.db", "many": False},
    "postgres_msgs_per_s": {"postgres": True, "many": True},
}


def _opener(
    variant: dict[str, Any], tmp: Path, round_number: int, server: PostgresServer | None
) -> Callable[[], DurableProducerQueue] | None:
    """How a run of ``variant`` opens its queue: a fresh SQLite file, or a fresh database
    on ``server``; None in memory."""
    if variant.get("postgres"):
        assert server is not None
        url = server.create_database()
        return lambda: PostgresDurableQueue(url, "bench")
    db = variant.get("db")
    if db is None:
        return None
    path = tmp / f"{round_number}-{db}"
    settings = SqliteQueueSettings(synchronous=variant.get("synchronous", "normal"))
    return lambda: SqliteDurableQueue(path, "bench", settings)


def run(count: int, runs: int = 3, only: tuple[str, ...] = ()) -> dict[str, float]:
    """Every figure of the module docstring (those named in ``only``, and the in-memory
    one, when given), with ``count`` messages per run (a tenth for
    ``durable_send_one``): each the median of ``runs`` runs, the variants interleaved
    (memory, durable, off, full, send-one, postgres, memory, ...) so that a burst of load
    on the shared machine slows one run of each, not every run of one variant. Each
    durable run has an SQLite file or a database of its own."""
    variants = {
        key: v
        for key, v in VARIANTS.items()
        if not only or key in only or key == "memory_msgs_per_s"
    }
    samples: dict[str, list[float]] = {key: [] for key in variants}
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="pykka-durable-bench-")))
        server = (
            stack.enter_context(running_server())
            if any(v.get("postgres") for v in variants.values())
            else None
        )
        for round_number in range(runs):
            for key, variant in variants.items():
                n = (
                    max(1_000, count // SEND_ONE_SHARE)
                    if key.endswith("send_one_msgs_per_s")
                    else count
                )
                opener = _opener(variant, tmp, round_number, server)
                samples[key].append(run_one(n, opener, variant["many"]))
    figures = {key: statistics.median(values) for key, values in samples.items()}
    memory = figures["memory_msgs_per_s"]
    for key in ("durable", "postgres"):
        if f"{key}_msgs_per_s" in figures:
            figures[f"{key}_vs_memory"] = figures[f"{key}_msgs_per_s"] / memory
    return figures


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        producer_path, count, window = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        print(json.dumps(child_handle(producer_path, count, window, False)), flush=True)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each variant (median)")
    parser.add_argument("--quick", action="store_true", help="fewer messages, for a smoke run")
    parser.add_argument(
        "--only", nargs="*", default=(), choices=tuple(VARIANTS), help="these and memory"
    )
    args = parser.parse_args()
    count, runs = (20_000, 1) if args.quick else (args.messages, args.runs)
    figures = run(count, runs, tuple(args.only))
    for key, value in figures.items():
        print(f"{key:<32}{value:>14,.3f}" if "_vs_" in key else f"{key:<32}{value:>14,.0f}")
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
