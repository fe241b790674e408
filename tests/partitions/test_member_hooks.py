"""`GroupMember` against a real `CoordinatorServer`: ``on_activated`` / ``on_deactivated``
called with partition indexes as partitions move between members, and `close` from
another thread ending every partition's thread.

No messages flow (the producer ref takes nothing): hooks and threads are what is
checked. Threads meet through conditions with bounded waits.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pykka_delivery.coordinator import (
    CoordinatorClient,
    CoordinatorServer,
)
from pykka_delivery.partitions import GroupDelivery, GroupMember, GroupMemberSettings
from tests.coordinator.servers import Clients, served

WAIT = 10.0
SETTINGS = GroupMemberSettings(close_grace=1.0, registration_timeout=WAIT)


class NoProducer:
    def tell(self, message: object) -> None:
        pass


def handle(delivery: GroupDelivery) -> None:
    pass


@pytest.fixture
def server() -> Iterator[CoordinatorServer]:
    with served() as server:
        yield server


@pytest.fixture
def clients(server: CoordinatorServer) -> Iterator[Callable[[], CoordinatorClient]]:
    opener = Clients(server)
    yield opener
    opener.close_all()


class Journal:
    """``(member, "activated" | "deactivated", partition)`` in the order hooks ran."""

    def __init__(self) -> None:
        self.entries: list[tuple[str, str, int]] = []
        self.changed = threading.Condition()

    def hooks(self, name: str) -> dict[str, Callable[[int], None]]:
        def record(what: str) -> Callable[[int], None]:
            def hook(partition: int) -> None:
                with self.changed:
                    self.entries.append((name, what, partition))
                    self.changed.notify_all()

            return hook

        return {"on_activated": record("activated"), "on_deactivated": record("deactivated")}

    def wait_for(self, *entries: tuple[str, str, int]) -> None:
        with self.changed:
            if not self.changed.wait_for(lambda: set(entries) <= set(self.entries), WAIT):
                pytest.fail(f"not all of {entries} within {WAIT} s: {self.entries}")


def member(client: CoordinatorClient, **kwargs: Any) -> GroupMember:
    return GroupMember(
        client,
        "orders",
        2,
        "billing",
        producer=lambda p: NoProducer(),
        handler=handle,
        namespace="test",
        settings=SETTINGS,
        **kwargs,
    )


def test_a_joining_member_takes_a_partition_whose_hooks_fire_in_hand_over_order(
    clients: Callable[[], CoordinatorClient],
) -> None:
    journal = Journal()
    first = member(clients(), **journal.hooks("first"))
    journal.wait_for(("first", "activated", 0), ("first", "activated", 1))

    second = member(clients(), **journal.hooks("second"))  # partition 1 moves to it

    journal.wait_for(("second", "activated", 1))
    moved = [e for e in journal.entries if e[2] == 1]
    assert moved == [
        ("first", "activated", 1),
        ("first", "deactivated", 1),
        ("second", "activated", 1),
    ]
    assert ("first", "deactivated", 0) not in journal.entries
    assert first.owned() == {0} and second.owned() == {1}
    second.close()
    first.close()


def test_close_from_another_thread_ends_every_partition_thread(
    clients: Callable[[], CoordinatorClient],
) -> None:
    journal = Journal()
    active = member(clients(), spread=False, **journal.hooks("active"))
    standby = member(clients(), spread=False)  # every partition waits for activation
    journal.wait_for(("active", "activated", 0), ("active", "activated", 1))

    closers = [threading.Thread(target=m.close) for m in (active, standby)]
    for closer in closers:
        closer.start()

    for closer in closers:
        closer.join(WAIT)
        assert not closer.is_alive()
    threads = [t for m in (active, standby) for t in m._threads]
    for thread in threads:
        thread.join(WAIT)
    assert not any(t.is_alive() for t in threads)
    journal.wait_for(("active", "deactivated", 0), ("active", "deactivated", 1))


def test_each_partitions_activations_carry_the_coordinators_increasing_epochs(
    clients: Callable[[], CoordinatorClient],
) -> None:
    journal = Journal()
    first = member(clients(), **journal.hooks("first"))
    journal.wait_for(("first", "activated", 0), ("first", "activated", 1))

    second = member(clients(), **journal.hooks("second"))  # partition 1 moves to it
    journal.wait_for(("second", "activated", 1))

    # Each partition is its own group: its first activation takes 1, the next one 2.
    assert [i.epoch for i in first.intervals()[0]] == [1]
    assert [i.epoch for i in first.intervals()[1]] == [1]
    assert [i.epoch for i in second.intervals()[1]] == [2]
    second.close()
    first.close()
