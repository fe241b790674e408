"""Messages: immutable, validated, equal by the fields the protocol compares."""

from __future__ import annotations

import dataclasses

import pytest

from pykka_delivery.actors.effects import Send
from pykka_delivery.actors.messages import (
    Delivery,
    Request,
    SequencedMessage,
    fast_frozen_init,
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
