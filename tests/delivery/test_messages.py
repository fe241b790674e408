"""Messages: immutable, validated, equal by the fields the protocol compares."""

from __future__ import annotations

import dataclasses

import pytest

from pykka_delivery.delivery.core.effects import Send
from pykka_delivery.delivery.messages import Delivery, new_delivery
from pykka_delivery.protocol.messages import (
    Request,
    SequencedMessage,
    SequencedRun,
    fast_frozen_init,
    frozen_factory,
    new_sequenced_message,
)


class Ref:
    def tell(self, message: object) -> None:
        pass


def test_sequenced_message_built_by_keyword_equals_one_built_by_position() -> None:
    ref = Ref()

    by_keyword = SequencedMessage(
        producer_id="p", seq_nr=3, message="m", first=False, ack=True, producer_controller=ref
    )

    assert by_keyword == SequencedMessage("p", 3, "m", False, True, ref)
    assert by_keyword.seq_nr == 3
    assert by_keyword.producer_controller is ref


def test_sequenced_message_equality_ignores_the_producer_controller_as_in_akka() -> None:
    assert SequencedMessage("p", 1, "m", True, False, Ref()) == SequencedMessage(
        "p", 1, "m", True, False, Ref()
    )
    assert SequencedMessage("p", 1, "m", True, False, Ref()) != SequencedMessage(
        "p", 2, "m", True, False, Ref()
    )


@pytest.mark.parametrize(
    "message",
    [
        SequencedMessage("p", 1, "m", True, False, Ref()),
        Delivery("m", Ref(), "p", 1, 1),
        Send(Ref(), "m"),
    ],
)
def test_hot_path_messages_with_a_fast_init_stay_frozen(message: object) -> None:
    field = dataclasses.fields(message)[0].name  # type: ignore[arg-type]

    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(message, field, "changed")


def test_fast_frozen_init_refuses_fields_with_defaults() -> None:
    with pytest.raises(TypeError, match="defaults"):

        @fast_frozen_init
        @dataclasses.dataclass(frozen=True, slots=True)
        class WithDefault:
            a: int = 0


def test_a_request_confirming_beyond_what_it_requests_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="confirmed_seq_nr 5 is above"):
        Request(5, 4)


# --- SequencedRun ------------------------------------------------------------------------


def a_run(ref: Ref, first_seq_nr: int = 5, count: int = 4) -> SequencedRun:
    return SequencedRun("p", first_seq_nr, [f"m{n}" for n in range(count)], ref)


def test_a_new_run_has_taken_nothing() -> None:
    run = a_run(Ref())

    assert (run.seq_nr, run.last_seq_nr, run.remaining) == (4, 8, 4)
    assert (run.first, run.ack) == (False, False)
    assert repr(run) == "SequencedRun('p', 5..8)"


def test_take_hands_out_the_messages_in_order_and_the_run_reads_as_the_last_taken() -> None:
    ref = Ref()
    run = a_run(ref)

    taken = [run.take(), run.take()]

    assert taken == ["m0", "m1"]
    assert (run.producer_id, run.seq_nr, run.message) == ("p", 6, "m1")
    assert run.producer_controller is ref
    assert (run.remaining, run.last_seq_nr) == (2, 8)
    assert repr(run) == "SequencedRun('p', 7..8)"
    assert [run.take(), run.take()] == ["m2", "m3"]
    assert (run.seq_nr, run.message, run.remaining) == (8, "m3", 0)


@pytest.mark.parametrize("taken", [0, 1, 3, 4])
def test_expand_gives_exactly_the_messages_not_taken_yet(taken: int) -> None:
    ref = Ref()
    run = a_run(ref)
    for _ in range(taken):
        run.take()

    expanded = run.expand()

    assert expanded == [
        SequencedMessage("p", 5 + n, f"m{n}", False, False, ref) for n in range(taken, 4)
    ]
    assert all(type(m) is SequencedMessage for m in expanded)
    assert all(m.producer_controller is ref for m in expanded)
    assert run.remaining == len(expanded)  # expanding takes nothing
    assert run.expand() == expanded


def test_a_run_of_one_message() -> None:
    ref = Ref()
    run = SequencedRun("p", 1, [b"only"], ref)

    assert (run.last_seq_nr, run.remaining) == (1, 1)
    assert run.expand() == [SequencedMessage("p", 1, b"only", False, False, ref)]
    assert run.take() == b"only"
    assert (run.remaining, run.expand()) == (0, [])


# --- frozen_factory ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """Fields of different types, so that a value landing in another field shows."""

    number: int
    text: str
    items: tuple[int, ...]
    flag: bool
    ignored: object = dataclasses.field(compare=False, repr=False)


def test_frozen_factory_builds_what_the_constructor_builds() -> None:
    new_sample = frozen_factory(Sample)
    ignored = object()

    built = new_sample(7, "seven", (7,), True, ignored)

    expected = Sample(7, "seven", (7,), True, ignored)
    assert type(built) is Sample
    assert built == expected
    assert (built.number, built.text, built.items, built.flag) == (7, "seven", (7,), True)
    assert built.ignored is ignored
    assert repr(built) == repr(expected)
    assert hash(built) == hash(expected)
    assert dataclasses.replace(built, number=8) == Sample(8, "seven", (7,), True, ignored)


def test_what_frozen_factory_builds_stays_frozen() -> None:
    built = frozen_factory(Sample)(1, "one", (), False, None)

    with pytest.raises(dataclasses.FrozenInstanceError):
        built.number = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del built.text  # type: ignore[misc]

    assert built.number == 1


def test_the_hot_path_factories_build_equal_sequenced_messages_and_deliveries() -> None:
    ref = Ref()

    message = new_sequenced_message("p", 3, "m", False, True, ref)
    delivery = new_delivery("m", ref, "p", 3, 2)

    assert message == SequencedMessage("p", 3, "m", False, True, ref)
    assert type(message) is SequencedMessage
    assert message.producer_controller is ref
    assert hash(message) == hash(SequencedMessage("p", 3, "m", False, True, Ref()))
    assert message.as_first() == SequencedMessage("p", 3, "m", True, True, ref)
    assert delivery == Delivery("m", ref, "p", 3, 2)
    assert type(delivery) is Delivery
    assert delivery.confirm_to is ref
    assert repr(delivery) == repr(Delivery("m", ref, "p", 3, 2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        delivery.seq_nr = 4  # type: ignore[misc]


@dataclasses.dataclass(frozen=True, slots=True)
class Parent:
    a: int


@dataclasses.dataclass(frozen=True, slots=True)
class Child(Parent):
    b: int  # its own slots hold only b


@dataclasses.dataclass(frozen=True)
class ExtraSlot:
    __slots__ = ("a", "extra")
    a: int


@pytest.mark.parametrize("cls", [Child, ExtraSlot], ids=["inherited-field", "extra-slot"])
def test_frozen_factory_refuses_a_class_whose_slots_are_not_its_fields(cls: type) -> None:
    with pytest.raises(TypeError, match=rf"frozen_factory\({cls.__name__}\).*slots"):
        frozen_factory(cls)
