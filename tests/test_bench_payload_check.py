"""bench/payload_check.py runs and reports every figure, and a payload crossing to another
process is written once (its ``user_writes_per_message``). No timing is judged here."""

from __future__ import annotations

from tests.harness import bench_figures


def test_the_payload_check_bench_reports_one_write_per_message_and_every_figure() -> None:
    figures = bench_figures("payload_check.py", "--messages", "200", "--runs", "1")

    assert figures["user_writes_per_message"] == 1.0
    kinds = ("dict", "protobuf", "bytes", "user")
    assert [kind for kind in kinds if not figures[f"{kind}_total_ns"] > 0] == []
