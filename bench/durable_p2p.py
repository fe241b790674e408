"""Durable versus in-memory point-to-point throughput between two processes, same run.

The producer runs in this process, the consumer in a child process (bench/p2p_grpc.py's
``child_handle``: a `Consumer` handle that confirms each delivery), each on its own
`Node`; window 500, one-by-one confirmation, 100-byte payloads. Measured in the same run:

* ``memory``: `Producer.send` without a durable queue (the reference);
* ``durable``: a `SqliteDurableQueue` with the default fsync policy (``"normal"``), sent
  with `Producer.send_many` (one store, one commit, per batch the window allows);
* ``durable_off`` and ``durable_full``: the same with ``synchronous="off"`` and ``"full"``;
* ``durable_send_one``: ``"normal"`` with plain `Producer.send` (a commit per message),
  for reference; it runs a tenth of the messages.

Each figure is messages per second as the consumer sees them (from its first delivery to
its last), the median of ``--runs`` runs made in turn (see `run`);
``durable_vs_memory`` is the ratio of the two medians. The SQLite files are in a
temporary directory, removed at the end. The last line printed is one JSON object with
the figures.

Usage: python bench/durable_p2p.py [--messages N] [--runs R] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.p2p_grpc import PAYLOAD, child_handle  # noqa: E402
from pykka_delivery import Producer, SqliteDurableQueue  # noqa: E402
from pykka_delivery.delivery.stores.durable_sqlite import SqliteQueueSettings  # noqa: E402
from pykka_delivery.transport import Node  # noqa: E402

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


def run_one(count: int, *, db: Path | None, synchronous: str = "normal", many: bool) -> float:
    """msgs/s of one run: a producer (durable when ``db`` is given) sending ``count``
    messages to a fresh consumer process."""
    queue = None
    if db is not None:
        queue = SqliteDurableQueue(db, "bench", SqliteQueueSettings(synchronous=synchronous))
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
    "memory_msgs_per_s": {"db": None, "many": False},
    "durable_msgs_per_s": {"db": "normal.db", "many": True},
    "durable_off_msgs_per_s": {"db": "off.db", "synchronous": "off", "many": True},
    "durable_full_msgs_per_s": {"db": "full.db", "synchronous": "full", "many": True},
    "durable_send_one_msgs_per_s": {"db": "one.db", "many": False},
}


def run(count: int, runs: int = 3) -> dict[str, float]:
    """Every figure of the module docstring, with ``count`` messages per run (a tenth for
    ``durable_send_one``): each the median of ``runs`` runs, the variants interleaved
    (memory, durable, off, full, send-one, memory, ...) so that a burst of load on the
    shared machine slows one run of each, not every run of one variant. Each durable run
    has an SQLite file of its own."""
    samples: dict[str, list[float]] = {key: [] for key in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="pykka-delivery-durable-bench-") as tmp:
        for round_number in range(runs):
            for key, variant in VARIANTS.items():
                db = variant["db"]
                n = (
                    max(1_000, count // SEND_ONE_SHARE)
                    if key.endswith("send_one_msgs_per_s")
                    else count
                )
                samples[key].append(
                    run_one(
                        n,
                        db=None if db is None else Path(tmp) / f"{round_number}-{db}",
                        synchronous=variant.get("synchronous", "normal"),
                        many=variant["many"],
                    )
                )
    figures = {key: statistics.median(values) for key, values in samples.items()}
    figures["durable_vs_memory"] = figures["durable_msgs_per_s"] / figures["memory_msgs_per_s"]
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
    args = parser.parse_args()
    figures = run(20_000 if args.quick else args.messages, 1 if args.quick else args.runs)
    for key, value in figures.items():
        print(f"{key:<32}{value:>14,.3f}" if "_vs_" in key else f"{key:<32}{value:>14,.0f}")
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
