"""Issue 5's benchmark: durable versus in-memory delivery, and work pulling over 1, 2 and 4
worker processes, in one run.

* Point to point (bench/durable_p2p.py): producer in this process, consumer in a child,
  window 500, one-by-one confirmation, 100-byte payloads; in memory, then durable
  (`SqliteDurableQueue`, `Producer.send_many`) for each fsync policy, durable with plain
  `send` for reference, and durable on PostgreSQL (`PostgresDurableQueue`, `send_many`,
  a throwaway cluster started for the run as the tests start theirs: tests/postgres.py).
  Medians of ``--runs`` interleaved runs. The ceiling of the durable figures is the
  in-memory figure of the same run (``durable_vs_memory``, ``postgres_vs_memory``).
* Work pulling (bench/workpull.py): a `WorkPullingProducer` here, 1, 2 and 4 worker
  processes found through the coordinator's service directory, each spending about
  ``--work-us`` µs of CPU per message; the best of ``--repeat`` interleaved runs. The
  ceiling of 2 and 4 workers is one worker's figure from the same run (``_vs_1``).

The last line printed is one JSON object with at least ``memory_msgs_per_s``,
``durable_msgs_per_s`` (default fsync policy), ``postgres_msgs_per_s``,
``workpull_1_msgs_per_s``, ``workpull_2_msgs_per_s`` and ``workpull_4_msgs_per_s``.

Usage: python bench/durable.py [--messages N] [--workpull-messages N] [--runs R]
[--repeat K] [--work-us U] [--quick]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import durable_p2p, workpull  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000, help="point-to-point runs")
    parser.add_argument("--workpull-messages", type=int, default=40_000)
    parser.add_argument("--runs", type=int, default=3, help="point-to-point runs per figure")
    parser.add_argument("--repeat", type=int, default=3, help="work-pulling runs per figure")
    parser.add_argument("--work-us", type=float, default=50.0, help="CPU µs per message")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # closed loops' grpc noise
    p2p_count = 20_000 if args.quick else args.messages
    wp_count = 5_000 if args.quick else args.workpull_messages
    runs = 1 if args.quick else args.runs
    repeat = 1 if args.quick else args.repeat

    figures: dict[str, float] = dict(durable_p2p.run(p2p_count, runs))
    iterations = workpull.calibrate(args.work_us, rounds=50)
    figures.update(
        workpull.measure(
            (1, 2, 4),
            wp_count,
            repeat,
            ("handle",),
            iterations=iterations,
            window=500,
            warmup=min(2_000, wp_count),
        )
    )
    for key, value in figures.items():
        print(f"{key:<45}{value:>14,.3f}" if "_vs_" in key else f"{key:<45}{value:>14,.1f}")
    print(json.dumps({k: round(v, 3) for k, v in figures.items()}))


if __name__ == "__main__":
    main()
