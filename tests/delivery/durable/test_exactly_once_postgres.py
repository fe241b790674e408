"""The exactly-once recipe on PostgreSQL (examples/exactly_once_postgres.py) with its
consumer SIGKILLed mid-flow, on the throwaway server of tests/postgres.py: the same run as
tests/delivery/durable/test_exactly_once_sqlite.py, the effects and positions in the
PostgreSQL database, written through `PostgresTxDedupStore`."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.delivery.durable.test_exactly_once_sqlite import check_exactly_once, kill_seed, run_demo

pytestmark = pytest.mark.slow


def test_consumer_killed_mid_flow_with_the_postgres_store_applies_every_effect_once(
    tmp_path: Path, postgres_url: str
) -> None:
    seed = kill_seed()

    report = run_demo(
        tmp_path, "examples/exactly_once_postgres.py", "--url", postgres_url, seed=seed
    )

    check_exactly_once(report, seed)
