"""The demos `make demo` runs finish and report success (small counts, bounded time),
with nothing on stderr that looks like a failure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_example(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, *args],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # A clean run leaves no traceback, and no grpc complaint about a loop closed too early.
    assert "Traceback" not in done.stderr, done.stderr
    assert "Event loop is closed" not in done.stderr, done.stderr
    return done.stdout


@pytest.mark.slow
def test_sac_demo_hands_the_stream_over_twice_without_loss_or_overlap() -> None:
    out = run_example("examples/sac_demo.py", "--count", "3000", "--timeout", "0.5")
    assert out.count("messages processed: losing") == 2
    assert "every message processed: True" in out
    assert "each activation a run of consecutive messages: True" in out
    assert "two services active at once: False" in out


@pytest.mark.slow
def test_p2p_demo_delivers_everything_once_over_a_lossy_link() -> None:
    out = run_example("examples/p2p_demo.py", "--messages", "3000", "--timeout", "60")
    rows = [line.split() for line in out.splitlines() if line.startswith(("actors", "handles"))]
    assert [row[:5] for row in rows] == [
        ["actors", "3,000", "0", "0", "yes"],
        ["handles", "3,000", "0", "0", "yes"],
    ]


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_pipeline_demo_loses_and_doubles_nothing_through_two_failovers_and_shows_the_lag() -> None:
    pytest.importorskip("pyspark", reason="the [spark] extra is not installed")
    out = run_example("examples/pipeline/run.py", "--clicks", "1500", "--rate", "1000", timeout=540)
    summary = json.loads(out.splitlines()[-1])
    assert summary["ok"] is True
    assert (summary["sent"], summary["received"]) == (3000, 3000)
    assert (summary["lost"], summary["duplicates"], summary["failovers"]) == (0, 0, 2)
    # The producers and the query's consumers report positions: stage 1's lag was seen.
    assert "stage 1" in summary["lag"]
    assert "Pipeline report" in out
