"""The stream catalog's producers and watches: the pure bookkeeping (catalog_watch.py)."""

from __future__ import annotations

import pytest

from pykka_delivery.coordinator import (
    CatalogStream,
    Refusal,
    Refused,
    StreamId,
    StreamProducer,
    check_stream_pattern,
    matches,
)
from pykka_delivery.coordinator.catalog_watch import ProducerCatalog, StreamPattern

ORDERS = StreamId("ns", "orders.eu")
CLICKS = StreamId("ns", "clicks")
STREAMS = {ORDERS: 4, CLICKS: 2}


def producer(
    name: str, connection: str, registration_id: int = 1, partitions: int = 2
) -> StreamProducer:
    return StreamProducer(
        name, f"127.0.0.1:{registration_id}", partitions, connection, registration_id
    )


def connected_all(_connection: str) -> bool:
    return True


def names(catalog: ProducerCatalog, stream: StreamId) -> list[tuple[str, str, int]]:
    return [(p.name, p.connection, p.partitions) for p in catalog.producers(stream)]


def test_producers_are_listed_by_name_and_replaced_by_registration() -> None:
    c = ProducerCatalog()
    assert c.register(ORDERS, producer("web-2", "b"), STREAMS, connected_all) is True
    assert c.register(ORDERS, producer("web-1", "a"), STREAMS, connected_all) is True
    assert c.register(ORDERS, producer("web-1", "a"), STREAMS, connected_all) is False
    assert names(c, ORDERS) == [("web-1", "a", 2), ("web-2", "b", 2)]


def test_registering_again_with_a_new_count_replaces_the_producer() -> None:
    c = ProducerCatalog()
    c.register(ORDERS, producer("web-1", "a", partitions=2), STREAMS, connected_all)
    grown = producer("web-1", "a", partitions=4)
    assert c.register(ORDERS, grown, STREAMS, connected_all) is True
    assert c.producers(ORDERS) == (grown,)


def test_a_registration_under_a_new_name_leaves_its_old_name() -> None:
    c = ProducerCatalog()
    c.register(ORDERS, producer("web-1", "a", 1), STREAMS, connected_all)
    assert c.register(ORDERS, producer("web-9", "a", 1), STREAMS, connected_all) is True
    assert names(c, ORDERS) == [("web-9", "a", 2)]


def test_deregister_removes_only_that_registration() -> None:
    c = ProducerCatalog()
    c.register(ORDERS, producer("web-1", "a", 1), STREAMS, connected_all)
    c.register(ORDERS, producer("web-2", "a", 2), STREAMS, connected_all)
    assert c.deregister(ORDERS, "a", 9) is False
    assert c.deregister(ORDERS, "b", 1) is False
    assert c.deregister(ORDERS, "a", 1) is True
    assert names(c, ORDERS) == [("web-2", "a", 2)]


def test_dropping_a_connection_removes_its_producers_and_names_the_streams_changed() -> None:
    c = ProducerCatalog()
    c.register(ORDERS, producer("web-1", "a", 1), STREAMS, connected_all)
    c.register(CLICKS, producer("web-1", "a", 2), STREAMS, connected_all)
    c.register(CLICKS, producer("web-2", "b", 1), STREAMS, connected_all)
    assert c.has_producers("a") and c.has_producers("b") and not c.has_producers("z")
    assert c.drop_producers("a") == [CLICKS, ORDERS]
    assert c.producers(ORDERS) == ()
    assert names(c, CLICKS) == [("web-2", "b", 2)]
    assert c.drop_producers("a") == []
    assert not c.has_producers("a")


def test_a_name_held_by_a_connected_connection_is_refused() -> None:
    c = ProducerCatalog()
    c.register(ORDERS, producer("web-1", "a"), STREAMS, connected_all)
    outcome = c.register(ORDERS, producer("web-1", "b"), STREAMS, connected_all)
    assert isinstance(outcome, Refused)
    assert outcome.reason is Refusal.PRODUCER_CONFLICT
    assert "give each producer replica its own name" in outcome.message
    assert names(c, ORDERS) == [("web-1", "a", 2)]


def test_a_name_held_by_a_lost_connection_is_taken_over() -> None:
    c = ProducerCatalog()
    c.register(ORDERS, producer("web-1", "a"), STREAMS, connected_all)
    outcome = c.register(ORDERS, producer("web-1", "b"), STREAMS, lambda conn: conn != "a")
    assert outcome is True
    assert names(c, ORDERS) == [("web-1", "b", 2)]
    assert not c.has_producers("a"), "the old entry is gone"


def test_a_stream_not_in_the_catalog_is_refused() -> None:
    c = ProducerCatalog()
    outcome = c.register(StreamId("ns", "nope"), producer("p", "a"), STREAMS, connected_all)
    assert isinstance(outcome, Refused)
    assert outcome.reason is Refusal.STREAM_NOT_FOUND
    assert "create_stream" in outcome.message


def test_more_partitions_than_the_stream_has_are_refused() -> None:
    c = ProducerCatalog()
    outcome = c.register(CLICKS, producer("p", "a", partitions=3), STREAMS, connected_all)
    assert isinstance(outcome, Refused)
    assert outcome.reason is Refusal.INVALID_REQUEST
    assert "grow the stream first" in outcome.message
    assert c.producers(CLICKS) == ()


def test_bad_producers_are_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="its own name"):
        StreamProducer("", "127.0.0.1:1", 1)
    with pytest.raises(ValueError, match="address is empty"):
        StreamProducer("p", "", 1)
    with pytest.raises(ValueError, match="1 or more"):
        StreamProducer("p", "127.0.0.1:1", 0)


def test_a_wildcard_pattern_matches_the_names_it_covers_only() -> None:
    assert matches("orders.*", "orders.eu")
    assert not matches("orders.*", "ordersx")
    assert not matches("orders.*", "Orders.eu"), "case-sensitive"
    assert matches("orders.e?", "orders.eu")
    assert matches("orders.[ae]u", "orders.eu")


def test_an_exact_name_matches_itself_only() -> None:
    assert matches("orders", "orders")
    assert not matches("orders", "orders.eu")


@pytest.mark.parametrize("pattern", ["", "orders eu", "orders/*", "orders.[eu", "orders]"])
def test_invalid_patterns_are_refused_with_a_message_naming_the_fix(pattern: str) -> None:
    with pytest.raises(ValueError, match=r"orders\.\*|\[abc\]"):
        check_stream_pattern(pattern)


def test_valid_patterns_are_returned_as_they_are() -> None:
    assert check_stream_pattern("orders.*") == "orders.*"
    assert check_stream_pattern("o[!x]-?_1") == "o[!x]-?_1"


def test_a_change_concerns_the_watches_whose_pattern_covers_the_stream() -> None:
    c = ProducerCatalog()
    wildcard, exact, other_ns = (
        StreamPattern("ns", "orders.*"),
        StreamPattern("ns", "clicks"),
        StreamPattern("other", "orders.*"),
    )
    c.watch(wildcard, "w1")
    c.watch(exact, "w1")
    c.watch(wildcard, "w2")
    c.watch(other_ns, "w3")
    assert c.concerned(ORDERS) == [("w1", wildcard), ("w2", wildcard)]
    assert c.concerned(CLICKS) == [("w1", exact)]
    assert c.concerned(StreamId("ns", "ordersx")) == []


def test_watches_belong_to_connections() -> None:
    c = ProducerCatalog()
    pattern = StreamPattern("ns", "orders.*")
    c.watch(pattern, "w1")
    c.watch(pattern, "w2")
    assert c.watched_by("w1") == [pattern]
    c.drop_watches("w1")
    assert c.concerned(ORDERS) == [("w2", pattern)]
    c.unwatch(pattern, "w2")
    assert c.concerned(ORDERS) == []


def test_a_listing_has_every_covered_stream_with_its_producers_even_without_any() -> None:
    c = ProducerCatalog()
    web = producer("web-1", "a")
    c.register(ORDERS, web, STREAMS, connected_all)
    streams = {**STREAMS, StreamId("ns", "orders.us"): 1, StreamId("x", "orders.eu"): 1}
    assert c.listing(StreamPattern("ns", "orders.*"), streams) == (
        CatalogStream("ns", "orders.eu", 4, (web,)),
        CatalogStream("ns", "orders.us", 1, ()),
    )
