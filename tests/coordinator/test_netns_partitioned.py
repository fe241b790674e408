"""A partitioned group of 8 over 3 consumer hosts (network namespaces, tests/netns.py):
one host isolated, then healed; never two active consumers on a partition.

The coordinator in host C, a producer per partition in P, consumer processes ``a``, ``b``
and ``d`` in hosts A, B and D, each subscribed to all 8 partitions (partition i of the
group is consumed by the i-th joined modulo 3: the coordinator's rule). A is cut from
everything: after the disconnected timeout its partitions go to the others; when healed,
every partition settles with one active consumer. Every partition's stream is then
checked: nothing lost, activations in order and never overlapping. Skipped unless root
with ``ip`` and ``iptables``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.coordinator.netns_cluster import Cluster
from tests.coordinator.procs import assert_no_overlap
from tests.netns import Hosts

pytestmark = pytest.mark.slow

BOUND = 40.0  # seconds for the whole scenario
TIMEOUT = 2.0  # the coordinator's disconnected timeout
PARTITIONS = 8
THROTTLE = 100  # messages/s per partition and consumer
CONSUMERS = {"a": "A", "b": "B", "d": "D"}  # consumer process -> its host, in join order


def test_a_partitioned_group_never_has_two_active_on_a_partition_when_a_host_is_isolated(
    netns: Callable[..., Hosts], tmp_path: Path
) -> None:
    hosts = netns("C", "P", *CONSUMERS.values())
    streams = [f"invoices-{i}" for i in range(PARTITIONS)]
    cluster = Cluster(hosts, tmp_path, time.monotonic() + BOUND, streams)
    cluster.start(TIMEOUT)
    for name, host in CONSUMERS.items():
        cluster.consumer(name, hosts[host], partitioned=True, throttle=THROTTLE)
    members = list(CONSUMERS)
    spread = {s: members[i % len(members)] for i, s in enumerate(streams)}

    def settled() -> dict[str, str | None]:
        return {stream: cluster.settled_active(stream) for stream in streams}

    def consuming(holders: dict[str, str | None], since: float) -> bool:
        """Each partition's holder processed numbers in an activation begun after
        ``since``."""
        for stream, holder in holders.items():
            runs = cluster.log(str(holder), stream).runs() if holder else []
            if not runs or runs[-1][0] < since or len(runs[-1][1]) < 10:
                return False
        return True

    cluster.wait_for(lambda: settled() == spread, f"the partitions spread as {spread}")
    cluster.wait_for(lambda: consuming(spread, 0.0), "every partition to be consumed")

    hosts.cut(hosts["A"])
    cut_at = time.monotonic()
    taken = [s for s, holder in spread.items() if holder == "a"]

    def taken_over() -> bool:
        return all(
            any(start > cut_at for name in members[1:] for start, _ in cluster.log(name, s).runs())
            for s in taken
        )

    cluster.wait_for(taken_over, f"the others to take over {taken} from a")
    hosts.heal(hosts["A"])
    cluster.wait_for(
        lambda: (
            None not in settled().values()
            and all(len(cluster.listing()[s]) == len(members) for s in streams)
        ),
        "every partition settled with every consumer connected after the heal",
    )
    after = settled()
    cluster.wait_for(lambda: consuming(after, 0.0), "every partition consumed after the heal")

    sent = cluster.stop_producer()

    def processed(stream: str) -> set[int]:
        return {n for name in members for n in cluster.log(name, stream).processed()}

    cluster.wait_for(
        lambda: all(processed(s) >= set(range(1, sent[s] + 1)) for s in streams),
        "every partition processed to its last number",
    )
    cluster.stop_consumers()
    for stream in streams:
        logs = {name: cluster.log(name, stream) for name in members}
        for name, log in logs.items():
            for _, numbers in log.runs():
                assert numbers == list(range(numbers[0], numbers[-1] + 1)), (
                    f"{stream}: an activation of {name} out of order or with a gap"
                )
        assert processed(stream) == set(range(1, sent[stream] + 1)), f"{stream}: lost some"
        assert_no_overlap({name: log.intervals for name, log in logs.items()})
        # The isolated host's consumer went on processing what it had received until its
        # client noticed the cut; its commits after its successor began were refused.
        cluster.check_sink(stream, sent[stream])
