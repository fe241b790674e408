"""Hand-overs: the `HandoverBook` (fed changes and clock values by hand) and the
`CoordinatorActor` that feeds it: activation log lines, each group's last hand-over in
`ListGroups`, and the statistics' gauges, rebalance count and duration histogram.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from typing import Any

import pykka
import pytest

from pykka_delivery.coordinator import (
    HANDOVER_BUCKETS,
    ActivateConsumer,
    ActivationChange,
    ActivationEvent,
    ConsumerId,
    CoordinatorState,
    CoordinatorStats,
    Execute,
    GetStatistics,
    GroupId,
    Handover,
    HandoverHistogram,
    HandoverReason,
    RegisterConsumer,
    apply,
    initial_state,
)
from pykka_delivery.coordinator.handovers import HandoverBook
from tests.coordinator.test_actor import (
    GROUP,
    TIMEOUT,
    Board,
    ManualTimerService,
    attach,
    detach,
    eventually,
    groups,
    register,
    start,
)

A, B = ConsumerId("a", 0, "owner-a"), ConsumerId("b", 0)
PARTITION = GroupId("ns", "orders-1", "app")


def change(
    consumer: ConsumerId,
    event: ActivationEvent,
    reason: HandoverReason,
    replaced: ConsumerId | None = None,
) -> ActivationChange:
    return ActivationChange(PARTITION, 1, consumer, event, reason, replaced)


def with_group() -> CoordinatorState:
    """A state where PARTITION exists (the book forgets hand-overs of groups that do not)."""
    register = RegisterConsumer("ns", "orders-1", "app", "a", 0, "node", 1)
    return apply(initial_state(), register).state


@pytest.fixture
def board() -> Iterator[Board]:
    board = Board()
    yield board
    assert board.violations == []


# --- the book ---------------------------------------------------------------------------


def test_a_step_down_then_an_activation_is_one_timed_hand_over() -> None:
    book, state = HandoverBook(), with_group()

    book.record(
        [change(A, ActivationEvent.STEPPING_DOWN, HandoverReason.REBALANCED)],
        state,
        now=1000.0,
        monotonic=10.0,
    )
    book.record(
        [
            change(A, ActivationEvent.DEACTIVATED, HandoverReason.STEPPED_DOWN),
            change(B, ActivationEvent.ACTIVATED, HandoverReason.STEPPED_DOWN, A),
        ],
        state,
        now=1000.3,
        monotonic=10.3,
    )

    handover = book.last_handovers()[PARTITION]
    assert handover == Handover(1000.3, A, B, HandoverReason.REBALANCED, handover.duration)
    assert handover.duration == pytest.approx(0.3)


def test_the_histogram_counts_a_duration_in_every_bucket_at_or_above_it() -> None:
    book, state = HandoverBook(), with_group()
    book.record(
        [change(A, ActivationEvent.DEACTIVATED, HandoverReason.PRESUMED_DOWN)],
        state,
        now=0.0,
        monotonic=5.0,
    )

    book.record(
        [change(B, ActivationEvent.ACTIVATED, HandoverReason.PRESUMED_DOWN)],
        state,
        now=0.0,
        monotonic=5.3,
    )

    histogram = book.histogram()
    assert histogram.count == 1
    assert histogram.sum == pytest.approx(0.3)
    assert [bound for bound, _ in histogram.buckets] == list(HANDOVER_BUCKETS)
    assert dict(histogram.buckets) == {
        0.01: 0,
        0.05: 0,
        0.1: 0,
        0.25: 0,
        0.5: 1,
        1.0: 1,
        2.5: 1,
        5.0: 1,
        10.0: 1,
        30.0: 1,
        60.0: 1,
        math.inf: 1,
    }


def test_a_first_activation_is_recorded_untimed_with_reason_registered() -> None:
    book, state = HandoverBook(), with_group()

    book.record(
        [change(A, ActivationEvent.ACTIVATED, HandoverReason.REGISTERED)],
        state,
        now=7.0,
        monotonic=1.0,
    )

    assert book.last_handovers()[PARTITION] == Handover(7.0, None, A, HandoverReason.REGISTERED)
    assert book.histogram() == HandoverHistogram()
    assert book.activations == 1


def test_a_hand_over_keeps_the_reason_of_its_first_decision() -> None:
    book, state = HandoverBook(), with_group()
    book.record(
        [change(A, ActivationEvent.STEPPING_DOWN, HandoverReason.REBALANCED)],
        state,
        now=0.0,
        monotonic=1.0,
    )
    book.record(
        [change(A, ActivationEvent.DEACTIVATED, HandoverReason.PRESUMED_DOWN)],
        state,
        now=0.0,
        monotonic=2.0,
    )

    book.record(
        [change(B, ActivationEvent.ACTIVATED, HandoverReason.PRESUMED_DOWN)],
        state,
        now=0.0,
        monotonic=4.0,
    )

    handover = book.last_handovers()[PARTITION]
    assert (handover.reason, handover.duration) == (HandoverReason.REBALANCED, 3.0)


def test_a_hand_over_under_way_is_dropped_with_its_group() -> None:
    book = HandoverBook()
    book.record(
        [change(A, ActivationEvent.DEACTIVATED, HandoverReason.UNREGISTERED)],
        with_group(),
        now=0.0,
        monotonic=1.0,
    )
    book.record([], initial_state(), now=0.0, monotonic=2.0)  # the group went

    book.record(
        [change(B, ActivationEvent.ACTIVATED, HandoverReason.REGISTERED)],
        with_group(),
        now=3.0,
        monotonic=3.0,
    )

    assert book.last_handovers()[PARTITION] == Handover(3.0, None, B, HandoverReason.REGISTERED)
    assert book.histogram().count == 0


def test_each_change_is_one_info_line_with_structured_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pykka_delivery.coordinator")

    HandoverBook().record(
        [change(A, ActivationEvent.DEACTIVATED, HandoverReason.CONNECTION_CLOSED)],
        with_group(),
        now=0.0,
        monotonic=0.0,
    )

    [record] = [r for r in caplog.records if getattr(r, "event", None) == "activation"]
    assert record.levelno == logging.INFO
    fields = {
        k: getattr(record, k)
        for k in ("change", "group", "stream", "namespace", "partition", "consumer", "reason")
    }
    assert fields == {
        "change": "deactivated",
        "group": "app",
        "stream": "orders-1",
        "namespace": "ns",
        "partition": 1,
        "consumer": "a/0 (owner-a)",
        "reason": "connection_closed",
    }
    assert "a/0 (owner-a) deactivated" in record.getMessage()
    assert "connection closed" in record.getMessage()


# --- the actor --------------------------------------------------------------------------


def stats(ref: pykka.ActorRef[Any]) -> CoordinatorStats:
    result = ref.ask(GetStatistics())
    assert isinstance(result, CoordinatorStats)
    return result


def test_the_actor_logs_who_took_over_from_whom_and_why(
    board: Board, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="pykka_delivery.coordinator")
    ref = start()
    sinks = {name: attach(ref, board, name) for name in ("a", "b")}
    for name in ("a", "b"):
        register(ref, name)

    detach(ref, sinks["a"], lost=False)  # a goodbye

    lines = [
        (getattr(r, "consumer", ""), getattr(r, "change", ""), getattr(r, "reason", ""))
        for r in caplog.records
        if getattr(r, "event", None) == "activation"
    ]
    assert lines == [
        ("a/0", "activated", "registered"),
        ("a/0", "deactivated", "connection_closed"),
        ("b/0", "activated", "connection_closed"),
    ]


def test_a_group_listing_carries_its_last_hand_over(board: Board) -> None:
    ref = start()
    for name in ("a", "b"):
        attach(ref, board, name)
        register(ref, name, PARTITION, partition=1)  # b joins: a steps down

    ref.ask(Execute(ActivateConsumer("ns", "orders-1", "app", "a", 0)))

    [info] = groups(ref)
    handover = info.last_handover
    assert handover is not None
    assert (handover.from_consumer, handover.to_consumer, handover.reason) == (
        ConsumerId("a", 0),
        ConsumerId("b", 0),
        HandoverReason.REBALANCED,
    )
    assert info.disconnected_timeout == TIMEOUT
    assert info.listed_at >= handover.at > 0


def test_a_group_listing_says_how_long_a_consumer_is_disconnected_and_has_left(
    board: Board,
) -> None:
    wall = [1000.0]
    ref = start(clock=lambda: wall[0], timer_service=ManualTimerService())
    sinks = {name: attach(ref, board, name) for name in ("a", "b")}
    for name in ("a", "b"):
        register(ref, name)
    detach(ref, sinks["a"])

    wall[0] = 1000.05
    [info] = groups(ref)

    a, b = info.consumers
    assert (a.disconnected_at, info.listed_at) == (1000.0, 1000.05)
    assert info.disconnected_for(a) == pytest.approx(0.05)
    assert info.presumed_down_in(a) == pytest.approx(TIMEOUT - 0.05)
    assert info.disconnected_for(b) is info.presumed_down_in(b) is None


def test_statistics_count_consumers_by_status(board: Board) -> None:
    ref = start(timer_service=ManualTimerService())  # b stays disconnected
    sinks = {name: attach(ref, board, name) for name in ("a", "b", "c")}
    for name in ("a", "b", "c"):
        register(ref, name)
    register(ref, "c", GroupId("ns", "payments", "app"))

    detach(ref, sinks["b"])

    got = stats(ref)
    assert (
        got.groups,
        got.consumers_active,
        got.consumers_waiting,
        got.consumers_disconnected,
        got.consumers_presumed_down,
    ) == (2, 2, 1, 1, 0)


def test_statistics_count_rebalances_and_time_a_presumed_down_hand_over(board: Board) -> None:
    ref = start()
    sinks = {name: attach(ref, board, name) for name in ("a", "b")}
    for name in ("a", "b"):
        register(ref, name)

    detach(ref, sinks["a"])  # presumed down after TIMEOUT, then b takes over
    eventually(lambda: board.activated_at("b"))

    got = eventually(lambda: (s := stats(ref)).handover_seconds.count == 1 and s)
    assert got.rebalances == 2  # a registered, b after a was presumed down
    assert got.consumers_presumed_down == 1
    assert got.handover_seconds.buckets[-1] == (math.inf, 1)
    [info] = groups(ref)
    assert info.group == GROUP
    assert info.last_handover is not None
    assert info.last_handover.reason is HandoverReason.PRESUMED_DOWN
