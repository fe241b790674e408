"""A coordinated consumer on a lossy, slow path to its producer (hosts in network
namespaces, tests/netns.py): nothing lost, nothing doubled, and the flow recovers.

The coordinator in host C, the producer in P, the consumer in A. The consumer reaches the
producer through the project's `TcpProxy` running inside A with a 50 ms delay (this kernel
has no netem), and A drops 30% of the packets it receives from P (iptables ``statistic``)
for 20 s. Skipped unless root with ``ip`` and ``iptables``.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.coordinator.netns_cluster import PRODUCER_PORT, STREAM, Cluster
from tests.netns import Hosts

pytestmark = pytest.mark.slow

BOUND = 50.0  # seconds for the whole scenario
TIMEOUT = 2.0  # the coordinator's disconnected timeout
LOSS = 0.3  # share of P's packets A drops
DELAY = 0.05  # seconds the proxy holds each chunk
LOSSY = 20.0  # seconds the loss and the delay last
AFTER = 300  # numbers to process once the path is clean again


def test_nothing_is_lost_or_doubled_with_loss_and_delay_between_producer_and_consumer(
    netns: Callable[..., Hosts], tmp_path: Path
) -> None:
    hosts = netns("C", "P", "A")
    a, p = hosts["A"], hosts["P"]
    cluster = Cluster(hosts, tmp_path, time.monotonic() + BOUND)
    proxy = a.proc(
        "proxy", "-m", "tests.netns", "proxy",
        "--upstream", f"{p.address}:{PRODUCER_PORT}", "--delay", str(DELAY),
    )  # fmt: skip
    cluster.procs["proxy"] = proxy
    # The producer's refs carry the proxy's address, so that A's replies take it too.
    cluster.start(TIMEOUT, advertise=proxy.ready())
    assert cluster.consumer("a", a)["active"] == [True]
    count = lambda: len(cluster.log("a").numbers)  # noqa: E731
    cluster.wait_for(lambda: count() >= 100, "a to consume")

    hosts.loss(a, LOSS, source=p)
    before = count()
    lossy_until = time.monotonic() + LOSSY
    cluster.wait_for(lambda: time.monotonic() >= lossy_until, "the end of the lossy period")
    during = count() - before
    dropped = hosts.dropped(a)
    hosts.no_loss(a)
    proxy.popen.send_signal(signal.SIGUSR1)
    proxy.expect(lambda line: line.get("delay") == 0.0, cluster.left())
    clean = count()
    cluster.wait_for(lambda: count() >= clean + AFTER, "the flow to recover")

    last = cluster.stop_producer()[STREAM]
    cluster.wait_for(lambda: last in cluster.log("a").processed(), "a to process the last")
    cluster.stop_consumers()
    processed = cluster.log("a").processed()
    print(f"\n{during} numbers in {LOSSY} s of loss ({dropped} packets dropped), {last} in all")
    assert dropped > 0, "the loss dropped nothing"
    assert during > 0, "nothing got through the lossy, slow path"
    assert processed == list(range(1, last + 1)), "each number once, in order, none lost"
    cluster.check_sink(STREAM, last)
