"""A coordinated group across hosts in network namespaces: the active consumer's host cut
from everything, or from the coordinator only, then healed.

Hosts (tests/netns.py): the coordinator in C, the producer in P, consumers ``a`` in A
(registered first: active) and ``b`` in B. The producer sends 1, 2, ... until the end;
each consumer records its activations and every number before confirming it
(tests/coordinator/procs.py). Keepalives are short, so both sides notice a silent link
within about a second, well inside the disconnected timeout. Skipped unless root with
``ip`` and ``iptables``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.coordinator.netns_cluster import STREAM, Cluster
from tests.coordinator.test_service_processes import check_stream
from tests.netns import Host, Hosts

pytestmark = pytest.mark.slow

BOUND = 25.0  # seconds for a whole scenario
TIMEOUT = 2.0  # the coordinator's disconnected timeout


def start_group(netns: Callable[..., Hosts], tmp_path: Path) -> Cluster:
    """The hosts, the services, ``a`` active and ``b`` waiting, ``a`` consuming."""
    cluster = Cluster(netns("C", "P", "A", "B"), tmp_path, time.monotonic() + BOUND)
    cluster.start(TIMEOUT)
    assert cluster.consumer("a", cluster.hosts["A"])["active"] == [True]
    assert cluster.consumer("b", cluster.hosts["B"])["active"] == [False]
    cluster.wait_for(lambda: len(cluster.log("a").numbers) >= 100, "a to consume")
    return cluster


def hand_over_and_heal(
    cluster: Cluster, fault: Callable[[], None], heal: Callable[[], None]
) -> int:
    """Apply ``fault`` to A; ``b`` must take over; ``heal``; the group must settle with
    ``b`` active; then everything stops. Returns the last number sent."""
    fault()
    cluster.wait_for(lambda: bool(cluster.log("b").numbers), "b to take over")
    heal()
    cluster.wait_for(
        lambda: cluster.settled_active() == "b", "one active consumer (b) after the heal"
    )
    last = cluster.stop_producer()[STREAM]
    cluster.wait_for(lambda: last in cluster.log("b").processed(), "b to process the last")
    assert cluster.settled_active() == "b", cluster.describe()
    cluster.stop_consumers()
    return last


def check_group(cluster: Cluster, last: int) -> None:
    """Every number processed, activations in order and never overlapping (check_stream);
    ``a`` first, then ``b``; every number committed once to the sink, under rising
    epochs."""
    logs = {name: cluster.log(name) for name in ("a", "b")}
    runs = check_stream(logs, last)
    assert [name for name, _, _ in runs] == ["a", "b"], cluster.describe()
    cluster.check_sink(STREAM, last)


def test_the_standby_takes_over_when_the_active_consumers_host_is_cut_and_one_stays_active(
    netns: Callable[..., Hosts], tmp_path: Path
) -> None:
    cluster = start_group(netns, tmp_path)
    a: Host = cluster.hosts["A"]
    last = hand_over_and_heal(cluster, lambda: cluster.hosts.cut(a), lambda: cluster.hosts.heal(a))
    check_group(cluster, last)


def test_the_standby_takes_over_when_the_active_consumer_is_cut_from_the_coordinator_only(
    netns: Callable[..., Hosts], tmp_path: Path
) -> None:
    cluster = start_group(netns, tmp_path)
    hosts = cluster.hosts
    a, c = hosts["A"], hosts["C"]
    last = hand_over_and_heal(
        cluster, lambda: hosts.drop_between(a, c), lambda: hosts.undrop_between(a, c)
    )
    check_group(cluster, last)
    both = set(cluster.log("a").processed()) & set(cluster.log("b").processed())
    assert not both, f"processed by both a and b: {sorted(both)[:10]}"
    # Fenced: the activation that consumed before the hand-over had a lower epoch.
    log_a, log_b = cluster.log("a"), cluster.log("b")
    numbered = zip(log_a.numbers, log_a.epochs, strict=True)
    before = {epoch for (run, _), epoch in numbered if run == 0}
    assert max(before) < min(log_b.epochs), f"a's epochs {before}, b's {set(log_b.epochs)}"
