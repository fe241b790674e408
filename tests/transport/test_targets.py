"""`TargetReports` (transport/_targets.py) on its own: what one link's two ends tell each
other about names nothing is exposed under, with a clock passed in."""

from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from pykka_delivery.protocol import delivery_pb2, transport_pb2
from pykka_delivery.transport._targets import TargetReports

INTERVAL = 1.0


def notice(unknown: tuple[str, ...] = (), exposed: tuple[str, ...] = ()) -> object:
    return transport_pb2.TargetNotice(unknown=unknown, exposed=exposed)


def test_a_name_first_dropped_is_told_at_once() -> None:
    reports = TargetReports()

    assert reports.unknown_here("orders", now=10.0, interval=INTERVAL)

    assert reports.take() == notice(unknown=("orders",))
    assert reports.take() is None


def test_a_name_dropped_again_within_the_interval_is_not_told_again() -> None:
    reports = TargetReports()
    reports.unknown_here("orders", now=10.0, interval=INTERVAL)
    reports.take()

    assert not reports.unknown_here("orders", now=10.9, interval=INTERVAL)
    assert reports.take() is None
    assert reports.unknown_here("orders", now=11.0, interval=INTERVAL)
    assert reports.take() == notice(unknown=("orders",))


def test_an_exposed_name_is_told_only_to_a_peer_told_it_was_unknown() -> None:
    reports = TargetReports()

    assert not reports.exposed_here("orders")
    reports.unknown_here("orders", now=10.0, interval=INTERVAL)
    reports.take()
    assert reports.exposed_here("orders")
    assert reports.take() == notice(exposed=("orders",))


def test_unknown_then_exposed_before_writing_leaves_only_exposed() -> None:
    reports = TargetReports()
    reports.unknown_here("orders", now=10.0, interval=INTERVAL)

    reports.exposed_here("orders")

    assert reports.take() == notice(exposed=("orders",))


def test_the_sending_side_keeps_missing_names_until_told_they_are_exposed() -> None:
    reports = TargetReports()

    assert reports.heard(notice(unknown=("a", "b"))) == ["a", "b"]
    assert reports.heard(notice(unknown=("a",))) == []
    assert reports.missing == {"a", "b"}
    reports.heard(notice(exposed=("a",)))
    assert reports.missing == {"b"}


def test_a_link_going_down_forgets_both_directions() -> None:
    reports = TargetReports()
    reports.unknown_here("orders", now=10.0, interval=INTERVAL)
    reports.heard(notice(unknown=("b",)))

    reports.link_down()

    assert reports.take() is None
    assert reports.missing == set()
    assert reports.unknown_here("orders", now=10.1, interval=INTERVAL)  # told anew


def test_many_names_forget_those_told_long_ago() -> None:
    reports = TargetReports()
    for n in range(1024):
        reports.unknown_here(f"n{n}", now=0.0, interval=INTERVAL)
    reports.take()

    reports.unknown_here("new", now=5.0, interval=INTERVAL)

    assert reports.unknown_here("n0", now=5.1, interval=INTERVAL)  # forgotten: told again
    assert not reports.unknown_here("new", now=5.2, interval=INTERVAL)


def old_frame_class() -> type:
    """``Frame`` as a node that predates `TargetNotice` knows it (field 3 removed)."""
    pool = descriptor_pool.DescriptorPool()
    for module in (delivery_pb2, transport_pb2):
        file = descriptor_pb2.FileDescriptorProto()
        module.DESCRIPTOR.CopyToProto(file)
        if module is transport_pb2:
            frame = next(m for m in file.message_type if m.name == "Frame")
            kept = [f for f in frame.field if f.name != "targets"]
            del frame.field[:]
            frame.field.extend(kept)
        pool.Add(file)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("pykka_delivery.transport.v1.Frame")
    )


def test_a_frame_with_a_notice_parses_in_a_node_that_predates_notices() -> None:
    frame = transport_pb2.Frame()
    frame.hello.node = "127.0.0.1:7001"
    frame.targets.unknown.append("orders")

    old = old_frame_class().FromString(frame.SerializeToString())

    assert "targets" not in old.DESCRIPTOR.fields_by_name
    assert old.hello.node == "127.0.0.1:7001"
    assert len(old.envelopes) == 0
