"""The active consumer's process SIGKILLed, every coordinator and client setting at its
default: the coordinator probes the consumer's node, finds the process gone and hands
the group over at once, instead of after the disconnected timeout.

Hosts (tests/netns.py): the coordinator in C, the producer in P, consumers ``a`` in A
(active) and ``b`` in B (waiting); the consumers' clients are given their `Node`, so the
coordinator can probe it (tests/coordinator/procs.py). Skipped unless root with ``ip``
and ``iptables``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pykka_delivery.coordinator import CoordinatorSettings
from tests.coordinator.netns_cluster import STREAM, Cluster
from tests.coordinator.test_service_processes import check_stream
from tests.netns import Hosts

pytestmark = pytest.mark.slow

DEFAULT_TIMEOUT = CoordinatorSettings().disconnected_timeout
BOUND = 25.0  # seconds for the whole scenario


def test_a_killed_active_consumer_is_replaced_before_the_default_disconnected_timeout(
    netns: Callable[..., Hosts], tmp_path: Path
) -> None:
    hosts = netns("C", "P", "A", "B")
    cluster = Cluster(hosts, tmp_path, time.monotonic() + BOUND)
    cluster.start(DEFAULT_TIMEOUT, fast_keepalive=False)
    assert cluster.consumer("a", hosts["A"], fast_keepalive=False)["active"] == [True]
    assert cluster.consumer("b", hosts["B"], fast_keepalive=False)["active"] == [False]
    cluster.wait_for(lambda: len(cluster.log("a").numbers) >= 100, "a to consume")

    killed_at = cluster.kill("a")
    cluster.wait_for(lambda: bool(cluster.log("b").numbers), "b to take over")
    took = cluster.log("b").starts[0] - killed_at
    print(f"\nb took over {took * 1000:.0f} ms after the kill (timeout {DEFAULT_TIMEOUT} s)")
    last = cluster.stop_producer()[STREAM]
    cluster.wait_for(lambda: last in cluster.log("b").processed(), "b to process the last")
    cluster.stop_consumers()

    dead, alive = cluster.log("a"), cluster.log("b")
    dead.intervals = [(dead.starts[0], killed_at)]  # it consumed at most until killed
    assert [name for name, _, _ in check_stream({"a": dead, "b": alive}, last)] == ["a", "b"]
    cluster.check_sink(STREAM, last)
    assert took < DEFAULT_TIMEOUT / 4, "handed over by the probe, not by the timeout"
