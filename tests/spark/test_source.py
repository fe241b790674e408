"""The Spark streaming source: partitioned streams into a Structured Streaming query,
restarts from the checkpoint and standby queries."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.coordinator import CoordinatorClient, CoordinatorSettings
from pykka_delivery.coordinator.state import Activity, Connectivity
from pykka_delivery.partitions import PartitionedProducer
from pykka_delivery.spark import coordinator_in_driver
from pykka_delivery.transport import Node

pytestmark = pytest.mark.spark

PARTITIONS = 4
USERS = 50


@pytest.fixture
def coordinator(spark: Any) -> Iterator[Any]:
    with coordinator_in_driver(
        spark, settings=CoordinatorSettings(disconnected_timeout=2.0)
    ) as hosted:
        yield hosted


@pytest.fixture
def producer_node() -> Iterator[Node]:
    with Node() as node:
        yield node


@pytest.fixture
def clicks(producer_node: Node) -> Iterator[PartitionedProducer]:
    with PartitionedProducer("clicks", PARTITIONS, ["spark"], node=producer_node) as producer:
        yield producer


def send(producer: PartitionedProducer, first: int, count: int) -> Counter[str]:
    """Send clicks ``first`` .. ``first + count - 1``, keyed by user; the count per user."""
    sent: Counter[str] = Counter()
    for n in range(first, first + count):
        user = f"user-{n % USERS}"
        producer.send({"user": user, "n": n}, key=user, timeout=60)
        sent[user] += 1
    return sent


def start_query(
    spark: Any, coordinator: Any, options: dict[str, str], out: Path, checkpoint: Path
) -> Any:
    """A query writing each micro-batch's parsed clicks to ``out/batch-<id>.json``
    (overwritten when a batch runs again: idempotent per batch id)."""

    def write_batch(frame: Any, batch_id: int) -> None:
        rows = frame.selectExpr(
            "producer_id", "seq_nr", "partition", "key", "CAST(payload AS STRING) AS payload"
        ).collect()
        (out / f"batch-{batch_id}.json").write_text(json.dumps([r.asDict() for r in rows]))

    return (
        spark.readStream.format("pykka-delivery")
        .options(**options)
        .load()
        .writeStream.foreachBatch(write_batch)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def received(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in sorted(out.glob("batch-*.json")):
        rows.extend(json.loads(path.read_text()))
    return rows


def wait_until(condition: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.2)


def test_a_query_restarted_from_its_checkpoint_counts_every_click_once(
    spark: Any, coordinator: Any, producer_node: Node, clicks: PartitionedProducer, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    checkpoint = tmp_path / "checkpoint"
    options = coordinator.options(
        streams=f"clicks={producer_node.address}",
        partitions=PARTITIONS,
        log_dir=checkpoint / "pykka-delivery",
        window=50,
    )
    query = start_query(spark, coordinator, options, out, checkpoint)
    try:
        expected = send(clicks, 0, 3000)
        clicks.wait_confirmed(timeout=60)  # confirmed: in the partition logs
        query.processAllAvailable()
    finally:
        query.stop()
    assert len(received(out)) == 3000

    # Sent while no query runs: they wait at the producer (its window, then send blocks
    # for demand, so send them from a thread), and come to the restarted query.
    more: dict[str, Counter[str]] = {}
    sender = threading.Thread(target=lambda: more.setdefault("c", send(clicks, 3000, 2000)))
    sender.start()
    query = start_query(spark, coordinator, options, out, checkpoint)
    try:
        sender.join(timeout=120)
        assert not sender.is_alive()
        expected += more["c"]
        clicks.wait_confirmed(timeout=60)
        query.processAllAvailable()
    finally:
        query.stop()

    rows = received(out)
    seen = Counter((r["producer_id"], r["seq_nr"]) for r in rows)
    assert len(seen) == 5000 and max(seen.values()) == 1, "each click once"
    counted = Counter(json.loads(r["payload"])["user"] for r in rows)
    assert counted == expected
    for r in rows:  # keyed routing: a user's clicks stay on one partition
        assert r["key"] == json.loads(r["payload"])["user"]
    assert {r["partition"] for r in rows} == set(range(PARTITIONS))


def test_a_standby_query_takes_over_when_the_first_stops(
    spark: Any, coordinator: Any, producer_node: Node, clicks: PartitionedProducer, tmp_path: Path
) -> None:
    outs = [tmp_path / "out-1", tmp_path / "out-2"]
    for out in outs:
        out.mkdir()
    queries = []
    for i, out in enumerate(outs):
        checkpoint = tmp_path / f"checkpoint-{i}"
        options = coordinator.options(
            streams=f"clicks={producer_node.address}",
            partitions=PARTITIONS,
            log_dir=checkpoint / "pykka-delivery",
        )
        queries.append(start_query(spark, coordinator, options, out, checkpoint))
        if i == 0:
            # The first query's consumers registered (and so are active) before the second's.
            with CoordinatorClient(coordinator.address) as client:
                wait_until(lambda c=client: _active_connections(c) == 1)
    try:
        with CoordinatorClient(coordinator.address) as client:
            wait_until(lambda: _consumers(client) == 2 * PARTITIONS)
            first_connections = _active_connection_ids(client)
        send(clicks, 0, 500)
        clicks.wait_confirmed(timeout=60)
        queries[0].processAllAvailable()
        assert len(received(outs[0])) == 500 and not received(outs[1])

        # Spark ends the stream runner process of a stopped query: the coordinator sees
        # its connection break and, after disconnected_timeout, activates the standby.
        queries[0].stop()
        with CoordinatorClient(coordinator.address) as client:
            wait_until(lambda: _serving(client) - first_connections != set())
            second = _serving(client)
        assert len(second) == 1 and second.isdisjoint(first_connections)
        send(clicks, 500, 500)
        clicks.wait_confirmed(timeout=60)
        queries[1].processAllAvailable()
    finally:
        for query in queries:
            query.stop()
    assert len(received(outs[1])) == 500


def _groups(client: CoordinatorClient) -> list[Any]:
    return [g for g in client.list_groups() if g.group.name == "spark"]


def _consumers(client: CoordinatorClient) -> int:
    return sum(len(g.consumers) for g in _groups(client))


def _active_connection_ids(client: CoordinatorClient) -> set[str]:
    return {
        c.connection for g in _groups(client) for c in g.consumers if c.activity is Activity.ACTIVE
    }


def _serving(client: CoordinatorClient) -> set[str]:
    """The connections active and connected in every partition's group."""
    per_group = [
        {
            c.connection
            for c in g.consumers
            if c.activity is Activity.ACTIVE and c.connectivity is Connectivity.CONNECTED
        }
        for g in _groups(client)
    ]
    return set.intersection(*per_group) if len(per_group) == PARTITIONS else set()


def _active_connections(client: CoordinatorClient) -> int:
    groups = _groups(client)
    if len(groups) < PARTITIONS:
        return 0
    return len(_active_connection_ids(client))
