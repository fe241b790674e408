"""What the producer and consumer handles do, whichever flavour: blocking or asyncio.

Sending, flow control, receiving, confirming, stopping and closing (whole streams are in
test_handle_streams.py). Each scenario is written once and runs over both flavours through
the `flavour` fixture (flavours.py): the blocking handles themselves, or the asyncio
handles on a loop of their own, called through the same blocking-looking API. What only
one flavour has (the blocking handles' lock races, the asyncio handles' loop wake-ups,
wrong-thread errors, a flavour talking to the other) is tested in test_blocking_handles.py
and test_asyncio_handles.py.

Where a behaviour needs a second caller (a send that must block, a consumer iterating), it
runs on a daemon thread, synchronised with Events and joins, every wait bounded by `WAIT`.
No test asserts how long anything took. pykka actors are stopped after each test
(tests/conftest.py).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pykka_delivery import (
    ClosedError,
    DeliveryTimeout,
    LocalProtocolError,
    WouldBlock,
)
from pykka_delivery.protocol.messages import Request, Resend
from tests.delivery.handles.flavours import (
    BLOCKED,
    LONG,
    NO_RETRY,
    WAIT,
    Flavour,
    Reader,
    connected,
    in_thread,
    receive_and_confirm,
)

# --- counting ----------------------------------------------------------------------


def test_statistics_of_both_handles_count_what_was_sent_delivered_and_confirmed(
    flavour: Flavour,
) -> None:
    p, c = connected(flavour)  # no retries: everything below is driven by the test

    p.send(0, timeout=WAIT)
    receive_and_confirm(c, 1)
    for i in range(1, 10):
        p.send(i, timeout=WAIT)
    receive_and_confirm(c, 8)
    c.receive(timeout=WAIT)  # the 10th: delivered, not confirmed

    produced, consumed = p.statistics(), c.statistics()
    assert produced.sent == 10
    assert produced.resent == 0
    # Request(0, 50) on the first message, Request(1, 50) on its confirmation; the window
    # of 50 is not half used, so no other Request.
    assert produced.requests == 2
    assert (produced.resend_requests, produced.acks, produced.rejected) == (0, 0, 0)
    assert consumed.delivered == 10
    assert consumed.confirmed == 9
    assert (consumed.duplicates, consumed.gaps, consumed.dropped, consumed.retries) == (0, 0, 0, 0)


# --- producer: sending and flow control --------------------------------------------


def test_send_times_out_when_the_window_is_full_and_resumes_once_the_consumer_confirms(
    flavour: Flavour,
) -> None:
    p, c = connected(
        flavour, consumer_settings=dataclasses.replace(NO_RETRY, flow_control_window=5)
    )
    p.send(1, timeout=WAIT)
    first = c.receive(timeout=WAIT)  # its Request(0, 5) opens the window up to seq_nr 5
    for i in range(2, 6):
        p.send(i, timeout=WAIT)

    with pytest.raises(DeliveryTimeout):
        p.send(6, timeout=0.2)
    assert p.snapshot().current_seq_nr == 6  # the 6th was not sent

    first.confirm()
    assert receive_and_confirm(c, 4) == [2, 3, 4, 5]
    with pytest.raises(WouldBlock):
        c.receive_nowait()  # nothing beyond the window arrived
    assert p.send(6, timeout=WAIT) == 6
    assert receive_and_confirm(c, 1) == [6]


def test_a_send_waiting_for_demand_is_woken_by_the_consumers_confirmation(
    flavour: Flavour,
) -> None:
    p, c = connected(
        flavour, consumer_settings=dataclasses.replace(NO_RETRY, flow_control_window=2)
    )
    p.send(0, timeout=WAIT)
    receive_and_confirm(c, 1)  # its Request(1, 2) opens the window up to seq_nr 2
    p.send(1, timeout=WAIT)
    sender, outcome = in_thread(lambda: p.send(2), "sender")  # no timeout: only a wake-up
    sender.join(BLOCKED)
    assert sender.is_alive(), f"send did not wait for demand: {outcome}"

    receive_and_confirm(c, 1)  # Request(2, 3)

    sender.join(WAIT)
    assert outcome == {"result": 3}


def test_send_nowait_raises_would_block_without_demand_and_returns_the_seq_nr_with_demand(
    flavour: Flavour,
) -> None:
    p = flavour.producer("p-1")
    with pytest.raises(WouldBlock):
        p.send_nowait("no consumer yet")
    assert p.snapshot().current_seq_nr == 1

    c = flavour.consumer(NO_RETRY)
    c.register_to(p.ref)
    assert p.send_nowait("first") == 1
    # The first message of a session goes alone; more demand comes with its Request.
    with pytest.raises(WouldBlock):
        p.send_nowait("second")
    c.receive(timeout=WAIT)
    assert p.send_nowait("second") == 2
    assert p.snapshot().current_seq_nr == 3


def test_send_before_any_consumer_registered_waits_and_goes_through_once_one_registers(
    flavour: Flavour,
) -> None:
    p = flavour.producer("p-1")
    with pytest.raises(DeliveryTimeout):
        p.send("too early", timeout=0.1)
    sender, outcome = in_thread(lambda: [p.send(i, timeout=LONG) for i in range(3)])
    sender.join(BLOCKED)
    assert sender.is_alive(), f"send did not wait for a consumer: {outcome}"

    c = flavour.consumer(NO_RETRY)
    c.register_to(p.ref)

    first = c.receive(timeout=WAIT)
    first.confirm()
    sender.join(WAIT)
    assert outcome == {"result": [1, 2, 3]}
    assert [first.message, *receive_and_confirm(c, 2)] == [0, 1, 2]


def test_send_and_confirm_of_the_first_message_returns_only_after_the_consumer_confirmed(
    flavour: Flavour,
) -> None:
    # The first message is confirmed by the Request its confirmation sends.
    p, c = connected(flavour)
    sender, outcome = in_thread(lambda: p.send_and_confirm("x", timeout=LONG), "sender")

    delivery = c.receive(timeout=WAIT)
    assert delivery.message == "x"
    sender.join(BLOCKED)
    assert sender.is_alive(), f"send_and_confirm returned before the confirmation: {outcome}"

    delivery.confirm()
    sender.join(WAIT)
    assert outcome == {"result": 1}


def test_send_and_confirm_of_a_later_message_is_answered_by_the_consumers_ack(
    flavour: Flavour,
) -> None:
    # Not the first message, not at a half-window boundary: only the Ack can confirm it.
    p, c = connected(flavour)
    for i in range(3):
        p.send(i, timeout=WAIT)
        receive_and_confirm(c, 1)
    sender, outcome = in_thread(lambda: p.send_and_confirm("x", timeout=LONG), "sender")

    delivery = c.receive(timeout=WAIT)
    assert delivery.message == "x"
    sender.join(BLOCKED)
    assert sender.is_alive(), f"send_and_confirm returned before the confirmation: {outcome}"

    delivery.confirm()
    sender.join(WAIT)
    assert outcome == {"result": 4}
    assert p.statistics().acks == 1


def test_send_and_confirm_times_out_when_the_consumer_does_not_confirm(
    flavour: Flavour,
) -> None:
    p, c = connected(flavour)
    p.send(0, timeout=WAIT)
    receive_and_confirm(c, 1)
    sender, outcome = in_thread(lambda: p.send_and_confirm("x", timeout=0.3), "sender")

    c.receive(timeout=WAIT)  # received, never confirmed
    sender.join(WAIT)

    assert isinstance(outcome.get("error"), DeliveryTimeout)
    assert p.snapshot().unconfirmed == (2,)  # it was sent, and stays in the stream


def test_wait_confirmed_returns_once_a_closing_consumer_acks_the_tail(flavour: Flavour) -> None:
    # 7 messages in a window of 50: no Request confirms the last ones; closing the consumer
    # tells the producer what it confirmed.
    p, c = connected(flavour)
    p.send(0, timeout=WAIT)
    receive_and_confirm(c, 1)
    for i in range(1, 7):
        p.send(i, timeout=WAIT)
    receive_and_confirm(c, 6)
    with pytest.raises(DeliveryTimeout):
        p.wait_confirmed(timeout=0.1)

    c.close()

    p.wait_confirmed(timeout=WAIT)
    assert p.snapshot().unconfirmed == ()


# --- consumer: receiving and confirming --------------------------------------------


def test_receive_with_a_delivery_unconfirmed_raises_local_protocol_error_naming_its_seq_nr(
    flavour: Flavour,
) -> None:
    p, c = connected(flavour)
    p.send("a", timeout=WAIT)
    c.receive(timeout=WAIT)

    with pytest.raises(LocalProtocolError, match=r"seq_nr 1\b"):
        c.receive(timeout=0.1)
    with pytest.raises(LocalProtocolError, match=r"seq_nr 1\b"):
        c.receive_nowait()


def test_confirming_a_delivery_twice_raises_local_protocol_error(flavour: Flavour) -> None:
    p, c = connected(flavour)
    p.send("a", timeout=WAIT)
    delivery = c.receive(timeout=WAIT)
    delivery.confirm()

    with pytest.raises(LocalProtocolError):
        delivery.confirm()
    assert c.statistics().confirmed == 1


def test_confirming_an_earlier_delivery_again_does_not_confirm_the_current_one(
    flavour: Flavour,
) -> None:
    # Regression (handles/consumer.py, _ConfirmTo): every Delivery shared one confirm_to,
    # which confirmed whatever was outstanding: a repeated confirm() of an old delivery,
    # made after the next one was received, confirmed the next one (which the application
    # had not processed), and at-least-once was lost for it.
    p, c = connected(flavour)
    p.send("a", timeout=WAIT)
    first = c.receive(timeout=WAIT)
    first.confirm()
    p.send("b", timeout=WAIT)
    second = c.receive(timeout=WAIT)

    with pytest.raises(LocalProtocolError):
        first.confirm()
    assert c.snapshot().confirmed_seq_nr == 1
    second.confirm()
    assert c.snapshot().confirmed_seq_nr == second.seq_nr


def test_receive_with_a_timeout_and_nothing_arriving_raises_delivery_timeout(
    flavour: Flavour,
) -> None:
    _, c = connected(flavour)

    with pytest.raises(DeliveryTimeout):
        c.receive(timeout=0.1)


def test_receive_nowait_with_nothing_ready_raises_would_block(flavour: Flavour) -> None:
    p, c = connected(flavour)
    with pytest.raises(WouldBlock):
        c.receive_nowait()

    p.send("a", timeout=WAIT)

    assert c.receive_nowait().message == "a"


def test_a_reader_waiting_in_receive_is_woken_by_a_send(flavour: Flavour) -> None:
    p, c = connected(flavour)
    receiver, outcome = in_thread(lambda: c.receive(timeout=LONG).message, "consumer")
    receiver.join(BLOCKED)
    assert receiver.is_alive(), f"receive returned with nothing sent: {outcome}"

    p.send("a", timeout=WAIT)

    receiver.join(WAIT)
    assert outcome == {"result": "a"}


# --- stopping and closing ----------------------------------------------------------


def test_deliver_then_stop_ends_iteration_once_everything_received_is_confirmed(
    flavour: Flavour,
) -> None:
    p, c = connected(flavour)
    p.send(0, timeout=WAIT)
    receive_and_confirm(c, 1)
    for i in range(1, 4):
        p.send(i, timeout=WAIT)
    assert receive_and_confirm(c, 3) == [1, 2, 3]

    c.deliver_then_stop()

    assert list(c) == []
    with pytest.raises(ClosedError):
        c.receive(timeout=0.1)


def test_deliver_then_stop_delivers_what_already_arrived_before_ending_iteration(
    flavour: Flavour,
) -> None:
    # Regression (handles/consumer.py): the handle keeps arrived messages in its inbox, not
    # in the core's stash; the core saw nothing buffered and stopped at once, and the
    # messages in the inbox were never delivered.
    p, c = connected(flavour)
    p.send("arrived", timeout=WAIT)  # in the consumer's inbox, not received yet

    c.deliver_then_stop()

    delivered = []
    for delivery in c:
        delivered.append(delivery.message)
        delivery.confirm()
    assert delivered == ["arrived"]


def test_deliver_then_stop_with_a_delivery_outstanding_delivers_the_rest_after_it(
    flavour: Flavour,
) -> None:
    # Regression, as above: confirming the outstanding delivery stopped the core, although
    # more messages waited in the handle's inbox.
    p, c = connected(flavour)
    p.send("a", timeout=WAIT)
    outstanding = c.receive(timeout=WAIT)  # its Request(0, 50) opens the window
    p.send("b", timeout=WAIT)
    p.send("c", timeout=WAIT)  # both wait in the consumer's inbox

    c.deliver_then_stop()
    outstanding.confirm()

    delivered = []
    for delivery in c:
        delivered.append(delivery.message)
        delivery.confirm()
    assert delivered == ["b", "c"]
    with pytest.raises(ClosedError):
        c.receive(timeout=0.1)


def test_deliver_then_stop_ends_the_iteration_of_a_waiting_reader(flavour: Flavour) -> None:
    p, c = connected(flavour)
    reader = Reader(c, 1)
    p.send("a", timeout=WAIT)
    assert reader.wait() == ["a"]
    assert reader.is_waiting()

    c.deliver_then_stop()

    reader.ended()
    assert reader.messages == ["a"]


def test_close_ends_the_iteration_of_a_waiting_reader_and_receive_then_raises_closed_error(
    flavour: Flavour,
) -> None:
    p, c = connected(flavour)
    reader = Reader(c, 2)
    p.send(0, timeout=WAIT)
    p.send(1, timeout=WAIT)
    assert reader.wait() == [0, 1]
    assert reader.is_waiting()

    reader.close()  # asserts the iteration ended without error

    with pytest.raises(ClosedError):
        c.receive(timeout=0.1)
    with pytest.raises(ClosedError):
        c.receive_nowait()


def test_every_call_on_a_producer_closed_by_leaving_its_context_raises_closed_error(
    flavour: Flavour,
) -> None:
    p, c = connected(flavour)
    with p:
        pass

    with pytest.raises(ClosedError):
        p.send("a", timeout=0.1)
    with pytest.raises(ClosedError):
        p.send_nowait("a")
    with pytest.raises(ClosedError):
        p.send_and_confirm("a", timeout=0.1)
    with pytest.raises(ClosedError):
        p.wait_confirmed(timeout=0.1)
    # Regression (handles/producer.py): register_consumer did not check that the producer
    # was closed; it connected and resent its unconfirmed messages to the new consumer.
    with pytest.raises(ClosedError):
        p.register_consumer(c.ref)
    assert p.snapshot().current_seq_nr == 1


def test_closing_a_producer_wakes_a_send_waiting_for_demand_with_closed_error(
    flavour: Flavour,
) -> None:
    p = flavour.producer("p-1")  # no consumer: no demand
    sender, outcome = in_thread(lambda: p.send("a", timeout=LONG), "sender")
    sender.join(BLOCKED)
    assert sender.is_alive(), f"send did not wait for demand: {outcome}"

    p.close()

    sender.join(WAIT)
    assert isinstance(outcome.get("error"), ClosedError)


def test_a_closed_producer_ignores_requests_and_resends_from_the_consumer_side(
    flavour: Flavour,
) -> None:
    # Regression: after close() a retry Request or a Resend still made it resend.
    told: list[Any] = []

    class Sink:
        def tell(self, message: Any) -> None:
            told.append(message)

    p = flavour.producer("p-1")
    p.register_consumer(Sink())
    p.send("a", timeout=WAIT)
    p.ref.tell(Request(1, 50))
    p.send("b", timeout=WAIT)
    p.close()
    told.clear()

    p.ref.tell(Request(1, 50, via_timeout=True))
    p.ref.tell(Resend(2))
    flavour.settle()

    assert told == []
