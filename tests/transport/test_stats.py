"""A node's counters and the snapshot a caller reads."""

from __future__ import annotations

import dataclasses

from pykka_delivery.transport.stats import Counters, NodeStats


def test_a_snapshot_holds_every_counter_under_its_own_name() -> None:
    names = [field.name for field in dataclasses.fields(Counters)]
    counters = Counters(*range(1, len(names) + 1))
    assert dataclasses.asdict(counters.snapshot()) == dataclasses.asdict(counters)
    assert [field.name for field in dataclasses.fields(NodeStats)] == names
