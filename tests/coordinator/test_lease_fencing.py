"""A `PostgresCommandLog` fenced by a `PostgresLease` (the throwaway server of
tests/postgres.py): only the holder of the live lease appends, a leader replaced or past
its lease writes nothing, and an append racing a take-over either lands before it (the
new leader reads it) or is refused: never lost."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from pykka_delivery.coordinator import RegisterConsumer, replay
from pykka_delivery.coordinator.lease_postgres import PostgresLease
from pykka_delivery.coordinator.store import LogFencedError
from pykka_delivery.coordinator.store_postgres import PostgresCommandLog
from tests.coordinator.test_lease import WAIT
from tests.harness import wait_until


class Coordinator:
    """What a coordinator candidate holds: its lease and its log."""

    def __init__(self, url: str, holder: str, ttl: float) -> None:
        self.lease = PostgresLease(url, holder=holder, address=f"{holder}:7000", ttl=ttl)
        self.log = PostgresCommandLog(url, lease=self.lease)

    def close(self) -> None:
        self.log.close()
        self.lease.close()


@pytest.fixture
def candidates(postgres_url: str) -> Iterator[Callable[..., Coordinator]]:
    made: list[Coordinator] = []

    def make(holder: str, ttl: float = 30.0) -> Coordinator:
        made.append(Coordinator(postgres_url, holder, ttl))
        return made[-1]

    yield make
    for candidate in made:
        candidate.close()


def register(connection: str) -> RegisterConsumer:
    return RegisterConsumer("ns", "orders", "app", connection, 0, "node-1")


def stored(admin: psycopg.Connection[Any]) -> int:
    row = admin.execute("SELECT count(*) FROM coordinator_log").fetchone()
    assert row is not None
    return int(row[0])


def waiting_for(url: str, table: str) -> bool:
    """Whether a statement on ``table`` waits for a lock now."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database() AND query LIKE %s",
            (f"%{table}%",),
        ).fetchone()
    return row is not None and row[0] > 0


def test_the_holder_of_the_lease_appends(
    candidates: Callable[..., Coordinator], admin: psycopg.Connection[Any]
) -> None:
    leader = candidates("a")
    leader.lease.try_acquire()

    leader.log.append_all([register("c1"), register("c2")])

    assert admin.execute("SELECT DISTINCT epoch FROM coordinator_log").fetchall() == [(1,)]
    assert leader.log.load() == replay([register("c1"), register("c2")])


def test_a_log_whose_lease_was_never_acquired_cannot_append(
    candidates: Callable[..., Coordinator], admin: psycopg.Connection[Any]
) -> None:
    follower = candidates("b")

    with pytest.raises(LogFencedError, match="never acquired the lease"):
        follower.log.append(register("c1"))

    assert stored(admin) == 0


def test_a_log_whose_lease_was_taken_over_cannot_append(
    candidates: Callable[..., Coordinator], admin: psycopg.Connection[Any]
) -> None:
    former = candidates("a")
    former.lease.try_acquire()
    former.log.append(register("c1"))
    leader = candidates("a")  # a restarted process: takes the live lease, epoch 2
    assert leader.lease.try_acquire() == 2

    with pytest.raises(LogFencedError, match="another coordinator leads now"):
        former.log.append_all([register("c2"), register("c3")])

    assert stored(admin) == 1
    leader.log.append(register("c4"))
    assert leader.log.load() == replay([register("c1"), register("c4")])


def test_a_lease_expired_by_the_database_clock_refuses_appends(
    candidates: Callable[..., Coordinator], admin: psycopg.Connection[Any]
) -> None:
    """As after a pause past the lease that the process's own clock did not see."""
    leader = candidates("a")
    leader.lease.try_acquire()
    admin.execute("UPDATE coordinator_lease SET expires_at = clock_timestamp() - interval '1 s'")

    with pytest.raises(LogFencedError, match="expired by the database's clock"):
        leader.log.append(register("c1"))

    assert stored(admin) == 0


def test_a_lease_past_its_local_validity_refuses_appends_without_asking_the_database(
    candidates: Callable[..., Coordinator], admin: psycopg.Connection[Any]
) -> None:
    leader = candidates("a", ttl=0.2)
    leader.lease.try_acquire()
    wait_until(lambda: not leader.lease.holds(), "the lease's local validity to pass")

    with pytest.raises(LogFencedError, match="not renewed in time by this process's clock"):
        leader.log.append(register("c1"))

    assert stored(admin) == 0


def test_a_renewed_lease_keeps_appending(
    candidates: Callable[..., Coordinator], admin: psycopg.Connection[Any]
) -> None:
    leader = candidates("a")
    leader.lease.try_acquire()
    leader.log.append(register("c1"))

    assert leader.lease.renew()
    leader.log.append(register("c2"))

    assert stored(admin) == 2


HOLD_INSERTS = (
    "CREATE FUNCTION hold_insert() RETURNS trigger LANGUAGE plpgsql AS"
    " $$ BEGIN PERFORM pg_advisory_xact_lock_shared(42); RETURN NEW; END $$",
    "CREATE TRIGGER hold BEFORE INSERT ON coordinator_log"
    " FOR EACH ROW EXECUTE FUNCTION hold_insert()",
)
"""A trigger that holds every insert into the log while advisory lock 42 is taken: an
append paused after its fence, in the middle of its transaction."""


def test_an_append_in_flight_during_a_take_over_lands_before_it_and_the_new_leader_reads_it(
    candidates: Callable[..., Coordinator], admin: psycopg.Connection[Any], postgres_url: str
) -> None:
    """The append passed its fence and is held mid-transaction; the lease expires
    meanwhile; the take-over must wait for the append's commit, so the new leader's load
    sees the command the old leader was told is stored."""
    former = candidates("a", ttl=3.0)  # time enough for the append to pass its local check
    former.lease.try_acquire()
    leader = candidates("b")
    for statement in HOLD_INSERTS:
        admin.execute(statement)
    appended: list[BaseException | None] = []
    taken: list[int | None] = []

    def append() -> None:
        try:
            former.log.append(register("c1"))
            appended.append(None)
        except BaseException as error:
            appended.append(error)

    admin.execute("SELECT pg_advisory_lock(42)")
    try:
        appending = threading.Thread(target=append)
        appending.start()
        wait_until(lambda: waiting_for(postgres_url, "INSERT INTO coordinator_log"), "the insert")
        wait_until(lambda: leader.lease.current() is None, "the lease to expire")
        taking_over = threading.Thread(target=lambda: taken.append(leader.lease.try_acquire()))
        taking_over.start()
        wait_until(
            lambda: waiting_for(postgres_url, "INSERT INTO coordinator_lease"), "the take-over"
        )
    finally:
        admin.execute("SELECT pg_advisory_unlock(42)")
    appending.join(WAIT)
    taking_over.join(WAIT)

    assert appended == [None]
    assert taken == [2]
    assert leader.log.load() == replay([register("c1")])


def test_an_append_waiting_for_a_take_over_in_flight_is_refused(
    candidates: Callable[..., Coordinator], admin: psycopg.Connection[Any], postgres_url: str
) -> None:
    """A take-over holds the lease row (here an UPDATE raising the epoch, not committed
    yet); the append's fence waits for it, then reads the new epoch and writes nothing."""
    former = candidates("a")
    former.lease.try_acquire()
    refused: list[BaseException] = []

    def append() -> None:
        try:
            former.log.append(register("c1"))
        except LogFencedError as error:
            refused.append(error)

    with admin.transaction():
        admin.execute("UPDATE coordinator_lease SET holder = 'b', epoch = epoch + 1")
        appending = threading.Thread(target=append)
        appending.start()
        wait_until(lambda: waiting_for(postgres_url, "coordinator_lease"), "the append's fence")
    appending.join(WAIT)

    assert len(refused) == 1
    assert "epoch 2" in str(refused[0])
    assert stored(admin) == 0


def test_a_hand_over_loses_no_acknowledged_command(
    candidates: Callable[..., Coordinator],
) -> None:
    first = candidates("a")
    second = candidates("b")
    first.lease.try_acquire()
    first.log.append_all([register("c1"), register("c2")])
    first.lease.release()

    assert second.lease.try_acquire() == 2
    assert second.log.load() == replay([register("c1"), register("c2")])
    second.log.append(register("c3"))
    with pytest.raises(LogFencedError):
        first.log.append(register("c4"))
    assert second.log.load() == replay([register("c1"), register("c2"), register("c3")])
