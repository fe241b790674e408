"""`pykka_delivery.testing.LossyRef` on its own: what it drops, duplicates and reorders,
reproducibly with a seed, and that reordering never loses a message."""

from __future__ import annotations

import re
from typing import Any

import pytest

import pykka_delivery
import pykka_delivery.transport
from pykka_delivery.testing import LossyRef
from pykka_delivery.transport.local import LossyRef as OldHomeLossyRef


class Sink:
    """A ref that keeps what it is told, in order."""

    def __init__(self) -> None:
        self.got: list[Any] = []

    def tell(self, message: Any) -> None:
        self.got.append(message)


def told(ref: LossyRef, messages: list[Any]) -> None:
    for message in messages:
        ref.tell(message)


def test_the_old_import_paths_give_the_same_class() -> None:
    assert OldHomeLossyRef is LossyRef
    assert pykka_delivery.LossyRef is LossyRef
    assert pykka_delivery.transport.LossyRef is LossyRef


def test_without_faults_everything_passes_in_order() -> None:
    sink = Sink()

    told(LossyRef(sink), list(range(50)))

    assert sink.got == list(range(50))


def test_dropped_messages_are_counted_and_the_others_pass_in_order() -> None:
    sink = Sink()
    ref = LossyRef(sink, drop=0.3, seed=1)

    told(ref, list(range(200)))

    assert 0 < ref.dropped < 200
    assert len(sink.got) == 200 - ref.dropped
    assert sink.got == sorted(sink.got)


def test_duplicated_messages_arrive_twice_in_a_row() -> None:
    sink = Sink()
    ref = LossyRef(sink, duplicate=0.3, seed=1)

    told(ref, list(range(200)))

    assert ref.duplicated > 0
    assert len(sink.got) == 200 + ref.duplicated
    assert sorted(set(sink.got)) == list(range(200))
    assert sink.got == sorted(sink.got)


def test_a_seeded_reordering_changes_the_order_and_loses_nothing() -> None:
    sink = Sink()
    ref = LossyRef(sink, reorder=0.3, max_hold=3, seed=7)

    told(ref, list(range(200)))
    ref.flush()

    assert ref.reordered > 0
    assert sink.got != list(range(200))
    assert sorted(sink.got) == list(range(200))


def test_the_same_seed_reorders_the_same_way() -> None:
    first, second = Sink(), Sink()

    told(LossyRef(first, reorder=0.3, max_hold=3, seed=7), list(range(100)))
    told(LossyRef(second, reorder=0.3, max_hold=3, seed=7), list(range(100)))

    assert first.got == second.got


def test_a_held_message_goes_out_right_after_the_message_that_overtakes_it() -> None:
    sink = Sink()
    ref = LossyRef(sink, reorder=0.5, types=(str,), seed=0)  # seed 0 holds "a"

    ref.tell("a")
    assert sink.got == []
    assert ref.held == 1
    ref.tell(1)

    assert sink.got == [1, "a"]
    assert ref.held == 0


def test_no_held_message_waits_for_more_than_max_hold_later_ones() -> None:
    sink = Sink()
    ref = LossyRef(sink, reorder=0.5, max_hold=4, seed=3)

    told(ref, list(range(300)))

    position = {message: index for index, message in enumerate(sink.got)}
    for message, index in position.items():
        later_before = [m for m in sink.got[:index] if m > message]
        assert len(later_before) <= 4, f"{message} waited for {later_before}"


def test_messages_of_other_types_are_never_held_but_count_as_later_messages() -> None:
    sink = Sink()
    ref = LossyRef(sink, reorder=0.9, types=(str,), seed=1)

    told(ref, [1, 2, "a", 3, 4])

    assert [m for m in sink.got if isinstance(m, int)] == [1, 2, 3, 4]
    assert sink.got.index("a") > sink.got.index(3)


def test_flush_lets_every_held_message_out_in_the_order_held() -> None:
    sink = Sink()
    ref = LossyRef(sink, reorder=0.5, max_hold=100, seed=2)
    told(ref, list(range(10)))
    held = ref.held
    assert held > 1

    released = ref.flush()

    assert released == held
    assert ref.held == 0
    assert sorted(sink.got) == list(range(10))
    tail = sink.got[-held:]
    assert tail == sorted(tail)


def test_a_dropped_message_is_not_held() -> None:
    sink = Sink()
    ref = LossyRef(sink, drop=0.5, reorder=0.5, max_hold=100, seed=4)

    told(ref, list(range(100)))
    ref.flush()

    assert len(sink.got) == 100 - ref.dropped
    assert len(set(sink.got)) == len(sink.got)


@pytest.mark.parametrize(
    ("option", "value", "fix"),
    [
        ("reorder", 1.0, "reorder must be in [0, 1)"),
        ("reorder", -0.1, "reorder must be in [0, 1)"),
        ("max_hold", 0, "max_hold must be at least 1"),
        ("drop", 1.0, "drop must be in [0, 1)"),
        ("duplicate", 1.5, "duplicate must be in [0, 1]"),
    ],
)
def test_an_out_of_range_option_is_refused_naming_it(option: str, value: float, fix: str) -> None:
    with pytest.raises(ValueError, match=re.escape(fix)):
        LossyRef(Sink(), **{option: value})  # type: ignore[arg-type]
