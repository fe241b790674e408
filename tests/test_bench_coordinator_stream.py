"""bench/coordinator_stream.py runs and ends with its JSON line (it drives the server's
private `_Stream`, so a change there that breaks the bench shows here). No figure is
judged: timing assertions do not belong in tests on a shared machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_coordinator_stream_bench_answers_every_request_and_prints_both_figures() -> None:
    done = subprocess.run(
        [sys.executable, "bench/coordinator_stream.py", "--requests", "200", "--runs", "1"],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(figures) == ["stream_us_per_request", "stream_us_per_request_pipelined"]
    assert all(value > 0 for value in figures.values())
