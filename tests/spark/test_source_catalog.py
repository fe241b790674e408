"""The Spark streaming source given stream names only: the producers of each stream are
found in the coordinator's catalog, several on one stream, and a stream grown while the
query runs is read on its new partitions too."""

from __future__ import annotations

import contextlib
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pykka_delivery.coordinator import CoordinatorClient, CoordinatorSettings
from pykka_delivery.errors import DeliveryTimeout
from pykka_delivery.partitions import PartitionedProducer
from pykka_delivery.spark import coordinator_in_driver
from pykka_delivery.spark._process import OptionError, Options, _close_all
from pykka_delivery.spark.log import PartitionLog
from pykka_delivery.spark.source import DeliveryStreamReader, SourceSettings
from pykka_delivery.transport import Node
from tests.coordinator.servers import served
from tests.spark.test_source import received, send, start_query, wait_until


def parse(streams: str) -> SourceSettings:
    options = {"coordinator": "h:1", "streams": streams, "log_dir": "/x"}
    return SourceSettings.parse(Options(options, "pykka-delivery source"))


@pytest.fixture
def coordinator(spark: Any) -> Iterator[Any]:
    with coordinator_in_driver(
        spark, settings=CoordinatorSettings(disconnected_timeout=2.0)
    ) as hosted:
        yield hosted


@contextlib.contextmanager
def named_producer(
    coordinator: Any, name: str, partitions: int
) -> Iterator[tuple[PartitionedProducer, CoordinatorClient]]:
    """A producer service of stream ``clicks``: its own node and coordinator connection, in
    the catalog under ``name`` (the first creates the stream with ``partitions``)."""
    with (
        Node() as node,
        CoordinatorClient(coordinator.address, node=node.address, owner=name) as client,
        PartitionedProducer.from_coordinator(
            client, "clicks", ["spark"], name=name, node=node, create_with=partitions
        ) as producer,
    ):
        yield producer, client


def confirmed(producer: PartitionedProducer, query: Any) -> None:
    """Wait until the query confirmed every message ``producer`` sent; a failure names
    the query's error, if it stopped on one."""
    try:
        producer.wait_confirmed(timeout=60)  # confirmed: in the partition logs
    except DeliveryTimeout as error:
        raise AssertionError(f"{error}; the query's error: {query.exception()}") from error


def by_producer(rows: list[dict[str, Any]]) -> Counter[str]:
    """Rows per producer name (the end of the producer id: ``clicks-3:spark@web``)."""
    return Counter(r["producer_id"].rpartition("@")[2] for r in rows)


# --- options and the log, without Spark ---------------------------------------------------


def test_stream_names_alone_are_found_in_the_catalog_and_addresses_are_still_accepted() -> None:
    settings = parse("clicks, orders.eu , audit=127.0.0.1:7001")
    assert settings.streams == (("clicks", None), ("orders.eu", None), ("audit", "127.0.0.1:7001"))
    assert settings.catalog_namespace == ""


@pytest.mark.parametrize(
    ("streams", "problem"),
    [
        ("clicks,", "an empty entry"),
        ("clicks,,orders", "an empty entry"),
        ("click stream", "stream name 'click stream' is not valid"),
        ("=127.0.0.1:7001", "stream name '' is not valid"),
        ("clicks,clicks", "stream 'clicks' is named twice"),
        ("clicks,clicks=127.0.0.1:1", "stream 'clicks' is named twice"),
        ("clicks=127.0.0.1", "the producer address '127.0.0.1' is not host:port"),
    ],
)
def test_a_bad_streams_entry_is_refused_naming_the_problem_and_the_fix(
    streams: str, problem: str
) -> None:
    with pytest.raises(OptionError) as refused:
        parse(streams)
    assert problem in str(refused.value)
    assert "give stream names, comma-separated (e.g. clicks or clicks,orders)" in str(refused.value)


def test_a_partition_log_keeps_a_position_per_producer_so_two_producers_dedup_apart(
    tmp_path: Path,
) -> None:
    web, mobile = "clicks-0:spark@web", "clicks-0:spark@mobile"
    log = PartitionLog(tmp_path / "clicks-0.sqlite", "clicks", 0)
    store = log.dedup_store()
    for seq_nr in (1, 2, 3):
        log.stage(web, seq_nr, None, b"w")
        store.record(web, seq_nr)
    log.stage(mobile, 1, None, b"m")
    store.record(mobile, 1)
    store.close()  # flushes the log
    log.close()

    reopened = PartitionLog(tmp_path / "clicks-0.sqlite", "clicks", 0)
    try:
        # Each producer resumes after its own last message, not after the other's.
        assert reopened.dedup_store().load() == {web: 3, mobile: 1}
        assert reopened.end() == 4
    finally:
        reopened.close()


# --- the reader in this process, without Spark ----------------------------------------------


@pytest.fixture
def served_coordinator() -> Iterator[Any]:
    with served(disconnected_timeout=2.0) as server:
        try:
            yield server
        finally:
            _close_all()  # the reader's node and connection, kept per process


def reader_of(server: Any, tmp_path: Path, **options: str) -> DeliveryStreamReader:
    found = {"coordinator": server.address, "log_dir": str(tmp_path / "logs"), **options}
    return DeliveryStreamReader(SourceSettings.parse(Options(found, "pykka-delivery source")))


def test_a_stream_the_catalog_lacks_is_refused_naming_the_fix(
    served_coordinator: Any, tmp_path: Path
) -> None:
    reader = reader_of(served_coordinator, tmp_path, streams="clicks")
    with pytest.raises(OptionError) as refused:
        reader.initialOffset()
    assert "stream 'clicks' is not in the coordinator's catalog" in str(refused.value)
    assert 'give option "partitions"' in str(refused.value)


def test_option_partitions_creates_a_stream_the_catalog_lacks(
    served_coordinator: Any, tmp_path: Path
) -> None:
    reader = reader_of(served_coordinator, tmp_path, streams="clicks", partitions="3")
    try:
        reader.initialOffset()
        with CoordinatorClient(served_coordinator.address) as client:
            assert client.stream_partitions("clicks") == 3
    finally:
        reader.stop()


def test_logs_of_a_grown_stream_are_opened_when_needed_and_the_offsets_gain_their_keys(
    served_coordinator: Any, tmp_path: Path
) -> None:
    reader = reader_of(served_coordinator, tmp_path, streams="clicks")
    try:
        with named_producer(served_coordinator, "web", 2) as (web, client):
            start = reader.initialOffset()
            send(web, 0, 100)
            web.wait_confirmed(timeout=60)
            first = reader.latestOffset(start)
            assert sorted(first) == ["clicks/0", "clicks/1"]

            client.create_stream("clicks", 4)
            wait_until(lambda: web.partitions == 4)
            send(web, 100, 200)
            web.wait_confirmed(timeout=60)
            end = reader.latestOffset(first)
        assert sorted(end) == [f"clicks/{p}" for p in range(4)]
        assert sum(end.values()) == 300
        ranges = reader.partitions(first, end)
        rows = [r for piece in ranges for r in reader.read(piece)]
        assert len(rows) == 200 and {r[1] for r in rows} == {0, 1, 2, 3}
    finally:
        reader.stop()


# --- with Spark ----------------------------------------------------------------------------


@pytest.mark.spark
def test_a_query_on_a_stream_name_gets_every_message_of_its_two_producers_once(
    spark: Any, coordinator: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    checkpoint = tmp_path / "checkpoint"
    options = coordinator.options(
        streams="clicks", log_dir=checkpoint / "pykka-delivery", window=50
    )
    with (
        named_producer(coordinator, "web", 4) as (web, _),
        named_producer(coordinator, "mobile", 4) as (mobile, _),
    ):
        query = start_query(spark, coordinator, options, out, checkpoint)
        try:
            counts: dict[str, Counter[str]] = {}
            senders = [
                threading.Thread(target=lambda: counts.setdefault("web", send(web, 0, 1200))),
                threading.Thread(target=lambda: counts.setdefault("mobile", send(mobile, 0, 800))),
            ]
            for sender in senders:
                sender.start()
            for sender in senders:
                sender.join(timeout=120)
                assert not sender.is_alive()
            confirmed(web, query)
            confirmed(mobile, query)
            query.processAllAvailable()
        finally:
            query.stop()

    rows = received(out)
    seen = Counter((r["producer_id"], r["seq_nr"]) for r in rows)
    assert max(seen.values()) == 1, "each message once"
    assert by_producer(rows) == {"web": 1200, "mobile": 800}
    for name, sent in counts.items():
        mine = [r for r in rows if r["producer_id"].endswith(f"@{name}")]
        assert Counter(json.loads(r["payload"])["user"] for r in mine) == sent
    # Every partition was read from both producers.
    assert {(r["partition"], r["producer_id"].rpartition("@")[2]) for r in rows} == {
        (p, name) for p in range(4) for name in ("web", "mobile")
    }


@pytest.mark.spark
def test_a_stream_grown_while_the_query_runs_gets_its_new_partitions_read(
    spark: Any, coordinator: Any, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    checkpoint = tmp_path / "checkpoint"
    options = coordinator.options(
        streams="clicks", log_dir=checkpoint / "pykka-delivery", window=50
    )
    with named_producer(coordinator, "web", 2) as (web, client):
        query = start_query(spark, coordinator, options, out, checkpoint)
        try:
            send(web, 0, 300)
            confirmed(web, query)
            query.processAllAvailable()
            assert {r["partition"] for r in received(out)} == {0, 1}

            client.create_stream("clicks", 4)  # pushed to the producer and the query
            wait_until(lambda: web.partitions == 4)
            send(web, 300, 600)
            confirmed(web, query)
            query.processAllAvailable()
        finally:
            query.stop()

    rows = received(out)
    seen = Counter((r["producer_id"], r["seq_nr"]) for r in rows)
    assert len(seen) == 900 and max(seen.values()) == 1, "each message once"
    assert {r["partition"] for r in rows} == {0, 1, 2, 3}
    logs = sorted(p.name for p in (checkpoint / "pykka-delivery").glob("*.sqlite"))
    assert logs == [f"clicks-{p}.sqlite" for p in range(4)]
