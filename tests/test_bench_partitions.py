"""bench/partitions.py runs (its quick mode) and ends with its JSON line, every figure in it.

No throughput is judged here (timing assertions do not belong in tests on a shared
machine): only that every part ran and reported; the partitions moved are a count, not a
timing, so that one is checked.
"""

from __future__ import annotations

import pytest

from tests.harness import bench_figures

KEYS = [
    "consumers_1_msgs_per_s",
    "consumers_2_msgs_per_s",
    "consumers_4_msgs_per_s",
    "producers_1_msgs_per_s",
    "producers_3_msgs_per_s",
    "producers_3_vs_1",
    "pause_ms_moved_partition",
    "pause_ms_unmoved_partition",
]


@pytest.mark.slow
def test_the_partitions_bench_runs_every_part_and_prints_its_json_line() -> None:
    figures = bench_figures("partitions.py", "--quick", timeout=180)
    assert [key for key in KEYS if not figures.get(key, 0) > 0] == []
    assert figures["moved_partitions_2_to_3"] == 2
