"""Lag as data, the pure part: the `LagTable` that joins reported positions into lag
rows and forgets them, `OldestUnconfirmed`, and their wire form. Time is an argument:
every test drives a fake clock."""

from __future__ import annotations

import math

import pytest

from pykka_delivery.coordinator import (
    ConsumerPosition,
    LagInfo,
    Position,
    ProducerPosition,
    lag_wire,
)
from pykka_delivery.coordinator.lag import LagTable, OldestUnconfirmed
from pykka_delivery.protocol import coordinator_pb2 as pb

EXPIRY = 30.0


def produced(
    sent: int,
    confirmed: int,
    *,
    age: float = 0.0,
    stream: str = "orders-0",
    partition: int = 0,
    producer_id: str = "orders-0:billing",
    group: str = "",
    namespace: str = "ns",
) -> ProducerPosition:
    return ProducerPosition(namespace, stream, partition, producer_id, sent, confirmed, age, group)


def consumed(
    received: int,
    confirmed: int,
    *,
    group: str = "billing",
    stream: str = "orders-0",
    partition: int = 0,
    producer_id: str = "orders-0:billing",
    namespace: str = "ns",
) -> ConsumerPosition:
    return ConsumerPosition(namespace, stream, group, partition, producer_id, received, confirmed)


def row(**fields: object) -> LagInfo:
    values: dict[str, object] = {
        "namespace": "ns",
        "stream": "orders-0",
        "group": "billing",
        "partition_index": 0,
        "producer_id": "orders-0:billing",
        "sent": 0,
        "confirmed": 0,
        "in_flight": 0,
        "oldest_unconfirmed_age": 0.0,
        "reported_at": 0.0,
    }
    values.update(fields)
    return LagInfo(**values)  # type: ignore[arg-type]


# --- the join ------------------------------------------------------------------------------


def test_a_producer_alone_is_a_row_with_its_own_figures_and_group() -> None:
    table = LagTable(EXPIRY)

    table.report("p", [produced(10, 4, age=2.5, group="billing")], now=100.0)

    assert table.rows(100.0) == (
        row(sent=10, confirmed=4, in_flight=6, oldest_unconfirmed_age=2.5, reported_at=100.0),
    )


def test_a_producer_that_names_no_group_shows_group_empty_until_a_consumer_reports() -> None:
    table = LagTable(EXPIRY)

    table.report("p", [produced(3, 3)], now=1.0)

    assert [r.group for r in table.rows(1.0)] == [""]


def test_a_consumer_joins_the_producer_of_its_producer_id_into_one_row() -> None:
    table = LagTable(EXPIRY)
    table.report("p", [produced(10, 4, age=1.0)], now=1.0)

    table.report("c", [consumed(8, 6)], now=2.0)

    assert table.rows(2.0) == (
        row(sent=10, confirmed=6, in_flight=4, oldest_unconfirmed_age=1.0, reported_at=2.0),
    )


def test_confirmed_is_the_newer_of_the_producers_and_the_consumers_report() -> None:
    table = LagTable(EXPIRY)
    table.report("p", [produced(10, 9)], now=1.0)

    table.report("c", [consumed(10, 7)], now=1.0)

    assert [(r.confirmed, r.in_flight) for r in table.rows(1.0)] == [(9, 1)]


def test_sent_is_the_consumers_last_received_when_the_producer_did_not_report() -> None:
    table = LagTable(EXPIRY)

    table.report("c", [consumed(12, 5)], now=1.0)

    assert table.rows(1.0) == (row(sent=12, confirmed=5, in_flight=7, reported_at=1.0),)


def test_a_consumer_report_newer_than_the_producers_moves_sent_up_never_in_flight_below_0() -> None:
    table = LagTable(EXPIRY)
    table.report("p", [produced(10, 2, age=4.0)], now=1.0)

    table.report("c", [consumed(15, 15)], now=1.5)

    assert table.rows(1.5) == (row(sent=15, confirmed=15, reported_at=1.5),)


def test_the_oldest_unconfirmed_age_is_0_once_nothing_is_in_flight() -> None:
    table = LagTable(EXPIRY)
    table.report("p", [produced(10, 8, age=3.0)], now=1.0)

    table.report("c", [consumed(10, 10)], now=1.0)

    assert [r.oldest_unconfirmed_age for r in table.rows(1.0)] == [0.0]


def test_each_group_following_a_producer_has_its_own_row() -> None:
    table = LagTable(EXPIRY)
    table.report("p", [produced(10, 3, producer_id="shared")], now=1.0)

    table.report("c", [consumed(10, 3, group="audit", producer_id="shared")], now=1.0)
    table.report("c", [consumed(10, 9, group="billing", producer_id="shared")], now=1.0)

    assert [(r.group, r.confirmed, r.in_flight) for r in table.rows(1.0)] == [
        ("audit", 3, 7),
        ("billing", 9, 1),
    ]


def test_reported_at_is_the_arrival_of_the_newest_report_of_the_row() -> None:
    table = LagTable(EXPIRY)
    table.report("c", [consumed(1, 1)], now=5.0)

    table.report("p", [produced(1, 1)], now=7.0)

    assert [r.reported_at for r in table.rows(7.0)] == [7.0]


def test_a_later_report_of_a_key_replaces_the_earlier_whoever_sent_it() -> None:
    table = LagTable(EXPIRY)
    table.report("old-member", [consumed(5, 5)], now=1.0)

    table.report("new-member", [consumed(9, 8)], now=2.0)

    assert [(r.sent, r.confirmed) for r in table.rows(2.0)] == [(9, 8)]


def test_rows_are_sorted_by_namespace_stream_group_partition_and_producer() -> None:
    table = LagTable(EXPIRY)
    table.report(
        "p",
        [
            produced(1, 0, stream="orders-1", partition=1, producer_id="b", group="g"),
            produced(1, 0, stream="orders-0", partition=0, producer_id="b", group="g"),
            produced(1, 0, stream="orders-0", partition=0, producer_id="a", group="g"),
            produced(1, 0, namespace="an", stream="z", partition=-1, producer_id="a"),
        ],
        now=1.0,
    )

    keys = [(r.namespace, r.stream, r.producer_id) for r in table.rows(1.0)]

    assert keys == [
        ("an", "z", "a"),
        ("ns", "orders-0", "a"),
        ("ns", "orders-0", "b"),
        ("ns", "orders-1", "b"),
    ]


# --- filters -------------------------------------------------------------------------------


def test_rows_are_filtered_by_namespace_and_by_group() -> None:
    table = LagTable(EXPIRY)
    table.report("c", [consumed(1, 1, group="billing"), consumed(1, 1, group="audit")], now=1.0)
    table.report("c", [consumed(1, 1, namespace="other")], now=1.0)

    assert [(r.namespace, r.group) for r in table.rows(1.0, "ns", group="audit")] == [
        ("ns", "audit")
    ]
    assert [r.namespace for r in table.rows(1.0, "other")] == ["other"]


def test_a_stream_filter_matches_the_stream_and_its_partitions_streams_only() -> None:
    table = LagTable(EXPIRY)
    table.report(
        "p",
        [
            produced(1, 0, stream="orders-0", partition=0, producer_id="a"),
            produced(1, 0, stream="orders-1", partition=1, producer_id="b"),
            produced(1, 0, stream="orders", partition=-1, producer_id="c"),
            produced(1, 0, stream="orders-x-1", partition=1, producer_id="d"),
            produced(1, 0, stream="orders-1", partition=-1, producer_id="e"),
        ],
        now=1.0,
    )

    assert [r.producer_id for r in table.rows(1.0, stream="orders")] == ["c", "a", "b"]
    assert [r.producer_id for r in table.rows(1.0, stream="orders-1")] == ["e", "b"]


# --- forgetting ----------------------------------------------------------------------------


def test_forget_drops_what_the_connection_reported_last_and_keeps_the_rest() -> None:
    table = LagTable(EXPIRY)
    table.report("leaving", [consumed(5, 5), produced(3, 1, producer_id="mine")], now=1.0)
    table.report("staying", [consumed(9, 9)], now=2.0)  # replaces the leaving one's

    dropped = table.forget("leaving")

    assert dropped == 1
    assert [(r.producer_id, r.sent) for r in table.rows(2.0)] == [("orders-0:billing", 9)]


def test_a_position_not_reported_within_lag_expiry_is_dropped() -> None:
    table = LagTable(EXPIRY)
    table.report("p", [produced(1, 0, producer_id="stale")], now=0.0)
    table.report("p", [produced(1, 0, producer_id="fresh")], now=20.0)

    assert [r.producer_id for r in table.rows(EXPIRY)] == ["fresh", "stale"]
    assert [r.producer_id for r in table.rows(EXPIRY + 0.001)] == ["fresh"]


def test_reports_sweep_expired_positions_even_if_nobody_asks() -> None:
    table = LagTable(EXPIRY)
    table.report("p", [produced(1, 0, producer_id="gone")], now=0.0)

    table.report("p", [produced(1, 0, producer_id="here")], now=EXPIRY + 1)

    assert len(table) == 1


# --- positions are checked -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: produced(-1, 0), "sent"),
        (lambda: produced(1, 0, producer_id=""), "producer_id"),
        (lambda: produced(1, 0, partition=-2), "partition_index"),
        (lambda: produced(1, 0, age=math.nan), "oldest_unconfirmed_age"),
        (lambda: consumed(1, -3), "confirmed"),
        (lambda: consumed(1, 0, group=""), "group"),
    ],
)
def test_a_bad_position_is_refused_naming_the_field(make: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make()  # type: ignore[operator]


# --- the oldest unconfirmed message's age --------------------------------------------------


def test_the_age_is_0_while_everything_sent_is_confirmed() -> None:
    oldest = OldestUnconfirmed()

    assert oldest.age(now=5.0, sent=3, confirmed=3) == 0.0


def test_the_age_counts_from_the_report_that_first_saw_the_oldest_unconfirmed_sent() -> None:
    oldest = OldestUnconfirmed()
    oldest.age(now=10.0, sent=4, confirmed=2)
    oldest.age(now=11.0, sent=9, confirmed=2)

    assert oldest.age(now=13.5, sent=9, confirmed=2) == 3.5


def test_the_age_moves_to_the_mark_that_saw_the_next_unconfirmed_once_the_oldest_is_confirmed() -> (
    None
):
    oldest = OldestUnconfirmed()
    oldest.age(now=10.0, sent=4, confirmed=2)
    oldest.age(now=11.0, sent=9, confirmed=2)

    assert oldest.age(now=12.0, sent=9, confirmed=4) == 1.0


def test_a_producer_numbering_again_from_1_starts_the_age_afresh() -> None:
    oldest = OldestUnconfirmed()
    oldest.age(now=10.0, sent=40, confirmed=2)

    assert oldest.age(now=12.0, sent=3, confirmed=0) == 0.0


# --- wire form -----------------------------------------------------------------------------


def test_positions_cross_the_wire_unchanged() -> None:
    positions: list[Position] = [produced(10, 4, age=1.5, group="billing"), consumed(8, 6)]

    (message,) = lag_wire.positions_messages(positions)
    decoded, problems = lag_wire.positions_of(
        pb.ClientMessage.FromString(message.SerializeToString()).positions
    )

    assert (decoded, problems) == (positions, [])


def test_many_positions_are_split_over_several_messages() -> None:
    positions = [
        produced(1, 0, producer_id=f"p{i}") for i in range(lag_wire.POSITIONS_PER_MESSAGE + 1)
    ]

    messages = lag_wire.positions_messages(positions)

    assert [len(m.positions.producers) for m in messages] == [lag_wire.POSITIONS_PER_MESSAGE, 1]


def test_a_bad_position_from_the_wire_is_a_problem_and_the_others_are_kept() -> None:
    wire = pb.Positions(
        producers=[pb.ProducerPosition(namespace="ns", stream="s", producer_id="", sent=1)],
        consumers=[pb.ConsumerPosition(namespace="ns", stream="s", group="g", producer_id="p")],
    )

    positions, problems = lag_wire.positions_of(wire)

    assert positions == [ConsumerPosition("ns", "s", "g", 0, "p", 0, 0)]
    assert len(problems) == 1
    assert "producer_id is empty" in problems[0]


def test_lag_rows_and_filters_cross_the_wire_unchanged() -> None:
    rows = (row(sent=3, confirmed=1, in_flight=2, oldest_unconfirmed_age=0.5, reported_at=9.0),)

    reply = pb.LagReply.FromString(lag_wire.lag_reply(rows).SerializeToString())
    request = pb.LagRequest.FromString(lag_wire.lag_request(None, "orders", "").SerializeToString())

    assert lag_wire.lag_rows(reply) == rows
    assert lag_wire.lag_filters(request) == (None, "orders", "")
