"""bench/coordinator_stream.py runs and ends with its JSON line (it drives the server's
private `_Stream`, so a change there that breaks the bench shows here). No figure is
judged: timing assertions do not belong in tests on a shared machine."""

from __future__ import annotations

from tests.harness import bench_figures


def test_the_coordinator_stream_bench_answers_every_request_and_prints_both_figures() -> None:
    figures = bench_figures("coordinator_stream.py", "--requests", "200", "--runs", "1")
    assert sorted(figures) == ["stream_us_per_request", "stream_us_per_request_pipelined"]
    assert all(value > 0 for value in figures.values())
