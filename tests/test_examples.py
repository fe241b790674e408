"""The demos `make demo` runs finish and report success (small counts, bounded time)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_example(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
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
